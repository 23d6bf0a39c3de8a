//! A connection inside the captured tree whose two ends are of different
//! address families: a dual-stack listener (bound to `::`, as many servers
//! and rendezvous stores are) that accepted an IPv4 client of the same tree
//! holds its end as a v4-mapped row of `/proc/net/tcp6`, the client's end
//! is a row of `/proc/net/tcp`. The capture must see one connection inside
//! the tree, and the restore bring it back.

use std::time::Duration;

use vsnap_e2e::engine::{engine_rootfs, free_port};
use vsnap_e2e::snapshot_env::{poll, setup};

#[test]
fn a_dual_stack_connection_inside_the_tree_is_captured_and_restored() {
    let e = setup("tcp-families");
    let rootfs = engine_rootfs(&e.c.dir.join("engine")).display().to_string();
    let port = free_port();
    // The host's network namespace: runc 1.1 restores a namespace of the
    // container's own with its loopback down (CRIU then cannot connect the
    // socket back: "Network is unreachable").
    let script = format!(
        "busybox nc -ll -p {port} -e /bin/cat & \
         until busybox netstat -tln | busybox grep -q ':{port} '; do :; done; \
         busybox sleep 1000000 | busybox nc 127.0.0.1 {port} & \
         until busybox netstat -tn | busybox grep ':{port} ' | busybox grep -q ESTABLISHED; do :; done; \
         exec /vsnap-ref-engine"
    );
    let listen = free_port();
    let run = |id: &str, plan: &str| {
        let extra = ["--annotation", "vsnap.io/after-capture=exit"];
        let cmd = e.plan_command(
            id,
            plan,
            "tcp",
            listen,
            &extra,
            &["--rootfs", &rootfs],
            &["/bin/sh", "-c", &script],
        );
        vsnap_e2e::cmd::run(cmd, None, Duration::from_secs(180))
    };
    let out = run("tcp-donor", "create");
    assert!(out.ok(), "{out:?}");
    let record = e.bundle("tcp-donor").join("vsnap-error.json");
    poll(Duration::from_secs(120), "the capture to end", || {
        e.manifest("tcp").exists() || record.exists()
    });
    assert!(
        !record.exists(),
        "the capture refused a connection inside the tree: {}",
        std::fs::read_to_string(&record).unwrap_or_default()
    );
    e.wait_stopped("tcp-donor");
    e.remove("tcp-donor");

    let out = run("tcp-copy", "restore");
    if !out.ok() {
        let log = e.bundle("tcp-copy").join("criu-work/restore.log");
        eprintln!("{}", std::fs::read_to_string(log).unwrap_or_default());
    }
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    // Both ends are back, established: the listener's v4-mapped row and
    // the client's IPv4 row.
    let table = |t: &str| {
        e.c.ctr_ok(&[
            "task",
            "exec",
            "--exec-id",
            t,
            "tcp-copy",
            "/bin/cat",
            &format!("/proc/net/{t}"),
        ])
    };
    let hex_port = format!(":{port:04X} ");
    let established = |text: &str| {
        text.lines()
            .filter(|l| l.contains(&hex_port))
            .any(|l| l.split_whitespace().nth(3) == Some("01"))
    };
    let (v4, v6) = (table("tcp"), table("tcp6"));
    assert!(established(&v4), "the client's end: {v4}");
    assert!(
        established(&v6) && v6.contains("0000000000000000FFFF0000"),
        "the listener's v4-mapped end: {v6}"
    );
    e.remove("tcp-copy");
    e.assert_nothing_left();
}
