//! containerd restarted while a vsnap container runs reconnects to its shim
//! (through the bootstrap/address file), and the task can still be killed
//! and its exit status collected.

use std::time::{Duration, Instant};

use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

#[test]
fn containerd_reconnects_to_a_running_shim_after_a_crash() {
    let mut c = Containerd::start("restart");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    c.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        "io.vsnap.v1",
        "--rootfs",
        &rootfs,
        "survivor",
        "/bin/sleep",
        "1000",
    ]);
    let shims = c.shim_pids();
    assert_eq!(shims.len(), 1, "one shim serves the container");

    c.restart();
    assert_eq!(c.shim_pids(), shims, "the shim outlived containerd");
    let tasks = c.ctr_ok(&["task", "ls"]);
    assert!(
        tasks
            .lines()
            .any(|l| l.starts_with("survivor") && l.contains("RUNNING")),
        "containerd reconnected to the shim: {tasks}"
    );
    // Exec still works through the reconnected shim.
    let out = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "after",
        "survivor",
        "/bin/echo",
        "still-here",
    ]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "still-here\n");

    // Kill through the new containerd; ctr prints the non-zero status that
    // the delete reply carries.
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "survivor"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.ctr_ok(&["task", "ls"]).contains("STOPPED") {
        assert!(Instant::now() < deadline, "survivor never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let deleted = c.ctr(&["task", "delete", "survivor"]);
    assert!(deleted.ok(), "{deleted:?}");
    assert!(
        format!("{}{}", deleted.stdout, deleted.stderr).contains("137"),
        "exit status 137 reported at delete: {deleted:?}"
    );
    c.ctr_ok(&["c", "rm", "survivor"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.shim_pids().is_empty() {
        assert!(Instant::now() < deadline, "shim did not exit after delete");
        std::thread::sleep(Duration::from_millis(50));
    }
}
