//! Stats and OOM as CRI reads them: CPU and memory usage of a busy
//! container are not zero (cgroup v1 and v2), and an OOM kill in the
//! container's memory cgroup reaches containerd as a /tasks/oom event.

use std::time::{Duration, Instant};

use vsnap_e2e::events::Subscription;
use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

const RT: &str = "io.vsnap.v1";

/// The value of `name` in `ctr task metrics` (first matching row).
fn metric(table: &str, name: &str) -> Option<u64> {
    table.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(name)).then(|| f.next()?.parse().ok())?
    })
}

#[test]
fn a_busy_container_reports_cpu_and_memory() {
    let c = Containerd::start("stats");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let busy = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 1000";
    c.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        RT,
        "--rootfs",
        &rootfs,
        "busy",
        "/bin/sh",
        "-c",
        busy,
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let table = loop {
        let table = c.ctr_ok(&["task", "metrics", "busy"]);
        if metric(&table, "cpuacct.usage").is_some_and(|v| v > 10_000_000) {
            break table;
        }
        assert!(Instant::now() < deadline, "no CPU usage reported: {table}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in ["memory.usage_in_bytes", "pids.current"] {
        assert!(
            metric(&table, name).is_some_and(|v| v > 0),
            "{name}: {table}"
        );
    }
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "busy"]);
}

/// Waits for a line holding every one of `parts`.
fn expect_line(rx: &std::sync::mpsc::Receiver<String>, parts: &[&str], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if parts.iter().all(|p| l.contains(p)) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

#[test]
fn an_oom_kill_is_published_as_a_task_oom_event() {
    let c = Containerd::start("oom");
    let root = busybox_rootfs(&c.dir);
    let rootfs = root.display().to_string();
    // Allocates past its 16 MiB limit once /go exists.
    let script = "while [ ! -e /go ]; do sleep 0.05; done; x=$(head -c 64000000 /dev/zero | tr '\\0' a); echo ${#x}";
    c.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        RT,
        "--memory-limit",
        "16777216",
        "--rootfs",
        &rootfs,
        "oom1",
        "/bin/sh",
        "-c",
        script,
    ]);
    // Live once it saw an exec's exit: the OOM comes after that.
    let events = Subscription::live(&c, "oom1");
    std::fs::write(root.join("go"), b"").unwrap();
    assert!(
        expect_line(
            &events.lines,
            &["/tasks/oom", "oom1"],
            Duration::from_secs(30)
        ),
        "no /tasks/oom event for oom1"
    );
    drop(events);
    let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", "oom1"]);
}
