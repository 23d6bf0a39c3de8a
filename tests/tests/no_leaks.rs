//! Fifty sequential create/start/wait/delete cycles leave nothing behind: no
//! shim process, no shim socket, no mount, no FIFO, no runc state, and
//! containerd's open descriptors are back where they started.
//! (A test binary of its own: it counts host-wide things.)

use std::time::{Duration, Instant};

use vsnap_e2e::containerd::list;
use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

const SHIM_SOCKETS: &str = "/run/containerd/s";
const CTR_FIFOS: &str = "/run/containerd/fifo";

#[test]
fn fifty_cycles_leave_nothing_behind() {
    let c = Containerd::start("leaks");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    // One cycle first, so containerd's lazily opened descriptors exist.
    c.ctr_ok(&[
        "run",
        "--rm",
        "--runtime",
        "io.vsnap.v1",
        "--rootfs",
        &rootfs,
        "warm",
        "/bin/true",
    ]);
    let fds_before = c.open_fds();
    let sockets_before = list(std::path::Path::new(SHIM_SOCKETS)).len();
    let fifos_before = list(std::path::Path::new(CTR_FIFOS)).len();

    for i in 0..50 {
        let id = format!("cycle{i}");
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.vsnap.v1",
            "--rootfs",
            &rootfs,
            &id,
            "/bin/echo",
            &id,
        ]);
        assert_eq!(out.code, Some(0), "cycle {i}: {out:?}");
        assert_eq!(out.stdout.trim(), id);
    }

    // Shims exit asynchronously after Shutdown: give them a moment.
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
    assert_eq!(c.bundles(), Vec::<String>::new(), "no bundle left");
    assert_eq!(c.mounts(), Vec::<String>::new(), "no mount left");
    assert_eq!(
        list(std::path::Path::new(SHIM_SOCKETS)).len(),
        sockets_before,
        "no shim socket left"
    );
    assert_eq!(
        list(std::path::Path::new(CTR_FIFOS)).len(),
        fifos_before,
        "no FIFO folder left"
    );
    assert_eq!(
        c.open_fds(),
        fds_before,
        "containerd's descriptors back where they started"
    );
    let pty_dirs = list(&std::env::temp_dir())
        .into_iter()
        .filter(|n| n.starts_with("vsnap-pty-"))
        .count();
    assert_eq!(pty_dirs, 0, "no console socket folder left");
}
