//! The shim publishes task events in the order containerd's runc shim does:
//! create, start, (exec added, exec started, exec exit), exit, delete.

use std::time::{Duration, Instant};

use vsnap_e2e::events::Subscription;
use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

#[test]
fn task_events_arrive_in_lifecycle_order() {
    let c = Containerd::start("events");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let events = Subscription::start(&c);
    let rx = &events.lines;
    // The subscription is live once it shows an event made after it began
    // (a namespace's creation: no task topic, so not counted below).
    let live = (0..100).any(|n| {
        c.ctr_ok(&["namespaces", "create", &format!("probe{n}")]);
        rx.recv_timeout(Duration::from_millis(200))
            .is_ok_and(|l| l.contains("/namespaces/create"))
    });
    assert!(live, "ctr events never showed a namespace's creation");

    c.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        "io.vsnap.v1",
        "--rootfs",
        &rootfs,
        "ev1",
        "/bin/sleep",
        "1000",
    ]);
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "x1",
        "ev1",
        "/bin/sh",
        "-c",
        "exit 5",
    ]);
    assert_eq!(out.code, Some(5), "{out:?}");
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "ev1"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.ctr_ok(&["task", "ls"]).contains("STOPPED") {
        assert!(Instant::now() < deadline, "ev1 never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.ctr(&["task", "delete", "ev1"]);
    c.ctr_ok(&["c", "rm", "ev1"]);

    let want = [
        "/tasks/create",
        "/tasks/start",
        "/tasks/exec-added",
        "/tasks/exec-started",
        "/tasks/exit", // the exec
        "/tasks/exit", // the init process
        "/tasks/delete",
    ];
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < want.len() && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if let Some(topic) = want.iter().find(|t| line.contains(&format!(" {t} "))) {
                seen.push((*topic, line));
            }
        }
    }
    drop(events);
    let topics: Vec<&str> = seen.iter().map(|(t, _)| *t).collect();
    assert_eq!(topics, want, "events: {seen:#?}");
    // The exec's exit carries its status, the init's 137.
    assert!(
        seen[4].1.contains("x1") && seen[4].1.contains("\"exit_status\":5"),
        "{:?}",
        seen[4]
    );
    assert!(seen[5].1.contains("\"exit_status\":137"), "{:?}", seen[5]);
}
