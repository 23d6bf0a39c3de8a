//! Bad input gets a clear error from `ctr` and leaves nothing behind: no
//! shim, no runc state, no bundle, no mount.

use std::time::{Duration, Instant};

use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::Containerd;

const RT: &str = "io.vsnap.v1";

/// Removes the container record ctr leaves after a failed task create, then
/// checks the shim side left nothing.
fn assert_nothing_left(c: &Containerd, id: &str) {
    let _ = c.ctr(&["c", "rm", id]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.shim_pids().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(c.shim_pids(), Vec::<i32>::new(), "no shim left");
    assert_eq!(
        c.runc_containers(),
        Vec::<String>::new(),
        "no runc state left"
    );
    assert_eq!(c.bundles(), Vec::<String>::new(), "no bundle left");
    assert_eq!(c.mounts(), Vec::<String>::new(), "no mount left");
}

#[test]
fn a_missing_runtime_config_file_is_named() {
    let c = Containerd::start("badcfg");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--runtime-config-path",
        "/nonexistent/vsnap.toml",
        "--rootfs",
        &rootfs,
        "cfg1",
        "/bin/true",
    ]);
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("runtime options") && out.stderr.contains("/nonexistent/vsnap.toml"),
        "{out:?}"
    );
    assert_nothing_left(&c, "cfg1");
}

#[test]
fn an_unknown_key_in_the_runtime_config_is_named() {
    let c = Containerd::start("badkey");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let config = c.dir.join("vsnap.toml");
    std::fs::write(&config, "runc_binary = \"runc\"\nrunc_bianry = \"typo\"\n").unwrap();
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--runtime-config-path",
        config.to_str().unwrap(),
        "--rootfs",
        &rootfs,
        "cfg2",
        "/bin/true",
    ]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("runc_bianry"), "{out:?}");
    assert_nothing_left(&c, "cfg2");
}

#[test]
fn a_runc_binary_that_does_not_exist_is_named() {
    let c = Containerd::start("badrunc");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let config = c.dir.join("vsnap.toml");
    std::fs::write(&config, "runc_binary = \"/nonexistent/runc\"\n").unwrap();
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--runtime-config-path",
        config.to_str().unwrap(),
        "--rootfs",
        &rootfs,
        "cfg3",
        "/bin/true",
    ]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("/nonexistent/runc"), "{out:?}");
    assert_nothing_left(&c, "cfg3");
}

#[test]
fn a_missing_rootfs_is_a_clear_error() {
    let c = Containerd::start("norootfs");
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--rootfs",
        "/nonexistent/rootfs",
        "nr1",
        "/bin/true",
    ]);
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("create") && out.stderr.contains("rootfs"),
        "{out:?}"
    );
    assert_nothing_left(&c, "nr1");
}

#[test]
fn a_bad_spec_is_refused_by_runc_with_its_reason() {
    let c = Containerd::start("badspec");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    // A relative cwd is invalid per the runtime spec; runc says so.
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"cwd": "relative/dir", "args": ["/bin/true"], "user": {"uid": 0, "gid": 0}},
        "root": {"path": rootfs},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]},
    });
    let path = c.dir.join("spec.json");
    std::fs::write(&path, spec.to_string()).unwrap();
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--config",
        path.to_str().unwrap(),
        "bs1",
    ]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("runc create failed"), "{out:?}");
    assert!(
        out.stderr.to_lowercase().contains("cwd"),
        "runc's reason is passed on: {out:?}"
    );
    assert_nothing_left(&c, "bs1");
}

#[test]
fn a_command_that_does_not_exist_fails_at_create_and_cleans_up() {
    let c = Containerd::start("nocmd");
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--rootfs",
        &rootfs,
        "nc1",
        "/bin/nope",
    ]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("/bin/nope"), "{out:?}");
    assert_nothing_left(&c, "nc1");
}
