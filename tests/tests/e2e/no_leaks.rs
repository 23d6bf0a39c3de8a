//! Fifty sequential create/start/wait/delete cycles leave nothing behind: no
//! shim process, no shim socket, no mount, no FIFO, no runc state, no
//! cgroup (the shim removes a stopped container's cgroups itself), and
//! containerd's open descriptors are back where they started. Every check is
//! scoped to this test's own containerd instance and ids, so other
//! containerds and shims on the host do not matter.

use std::path::Path;
use std::time::{Duration, Instant};

use vsnap_e2e::containerd::list;
use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

#[test]
fn fifty_cycles_leave_nothing_behind() {
    let c = Containerd::start("leaks");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    // ctr's FIFOs in a folder of this test's own.
    let fifos = c.dir.join("fifo");
    std::fs::create_dir_all(&fifos).unwrap();
    let fifo_dir = fifos.display().to_string();
    let run = |flag: &str, args: &[&str]| {
        let mut all = vec![
            "run",
            flag,
            "--fifo-dir",
            &fifo_dir,
            "--runtime",
            "io.vsnap.v1",
        ];
        all.extend_from_slice(&["--rootfs", &rootfs]);
        all.extend_from_slice(args);
        c.ctr(&all)
    };
    // A running container's socket is where the checks below look for it.
    let out = run("-d", &["held", "/bin/sleep", "1000"]);
    assert!(out.ok(), "{out:?}");
    assert!(
        c.shim_socket("held").exists(),
        "the shim's socket is {}",
        c.shim_socket("held").display()
    );
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "held"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.ctr_ok(&["task", "ls"]).contains("STOPPED") {
        assert!(Instant::now() < deadline, "held never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.ctr_ok(&["task", "delete", "held"]);
    c.ctr_ok(&["c", "rm", "held"]);

    // One cycle first, so containerd's lazily opened descriptors exist.
    let out = run("--rm", &["warm", "/bin/true"]);
    assert!(out.ok(), "{out:?}");
    // The warm cycle's shim exits after Shutdown: counted before it is gone,
    // its connection would be in the baseline (seen on a loaded host).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.shim_pids().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the warm cycle's shim never exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // containerd closes its end of the warm ctr's connection in its own
    // time: the baseline is a count that held for half a second.
    let fds_before = settled(|| c.open_fds());

    let mut ids = vec!["held".to_string(), "warm".to_string()];
    for i in 0..50 {
        let id = format!("cycle{i}");
        let out = run("--rm", &[&id, "/bin/echo", &id]);
        assert_eq!(out.code, Some(0), "cycle {i}: {out:?}");
        assert_eq!(out.stdout.trim(), id);
        ids.push(id);
    }

    // Shims exit asynchronously after Shutdown: wait for that.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.shim_pids().is_empty() || c.open_fds() > fds_before {
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(c.shim_pids(), Vec::<i32>::new(), "no shim process left");
    assert_eq!(
        c.runc_containers(),
        Vec::<String>::new(),
        "no runc state left"
    );
    assert_eq!(
        list(&c.runc_root()),
        Vec::<String>::new(),
        "no runc state folder left"
    );
    let cgroups: Vec<String> = ids.iter().flat_map(|id| c.cgroups(id)).collect();
    assert_eq!(cgroups, Vec::<String>::new(), "no cgroup left");
    assert_eq!(c.bundles(), Vec::<String>::new(), "no bundle left");
    assert_eq!(c.mounts(), Vec::<String>::new(), "no mount left");
    let sockets: Vec<String> = ids
        .iter()
        .map(|id| c.shim_socket(id))
        .filter(|s| s.exists())
        .map(|s| s.display().to_string())
        .collect();
    assert_eq!(sockets, Vec::<String>::new(), "no shim socket left");
    assert_eq!(
        list(Path::new(&fifos)),
        Vec::<String>::new(),
        "no FIFO left"
    );
    // A leak grows with the cycles (50 of them); a descriptor containerd
    // still held for the warm cycle at the baseline may be closed since.
    let fds_after = c.open_fds();
    assert!(
        fds_after <= fds_before,
        "containerd's descriptors back where they started: {fds_after} now, {fds_before} before"
    );
}

/// `count` once it read the same for half a second (at most 20 s).
fn settled(count: impl Fn() -> usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = count();
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_millis(500) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}
