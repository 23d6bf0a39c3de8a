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

/// `ctr run --runtime-config-path PATH ... /bin/true` of a busybox rootfs,
/// which must fail; returns ctr's stderr after checking nothing is left.
/// With `body`, PATH is a config file holding it.
fn run_with_config(tag: &str, id: &str, path: Option<&str>, body: Option<&str>) -> String {
    let c = Containerd::start(tag);
    let rootfs = busybox_rootfs(&c.dir).display().to_string();
    let written = c.dir.join("vsnap.toml");
    if let Some(body) = body {
        std::fs::write(&written, body).unwrap();
    }
    let path = path.unwrap_or_else(|| written.to_str().unwrap());
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RT,
        "--runtime-config-path",
        path,
        "--rootfs",
        &rootfs,
        id,
        "/bin/true",
    ]);
    assert_ne!(out.code, Some(0), "{out:?}");
    assert_nothing_left(&c, id);
    out.stderr
}

#[test]
fn a_missing_runtime_config_file_is_named() {
    let err = run_with_config("badcfg", "cfg1", Some("/nonexistent/vsnap.toml"), None);
    assert!(
        err.contains("runtime options") && err.contains("/nonexistent/vsnap.toml"),
        "{err}"
    );
}

#[test]
fn an_unknown_key_in_the_runtime_config_is_named() {
    let body = "runc_binary = \"runc\"\nrunc_bianry = \"typo\"\n";
    let err = run_with_config("badkey", "cfg2", None, Some(body));
    assert!(err.contains("runc_bianry"), "{err}");
}

#[test]
fn a_runc_binary_that_does_not_exist_is_named() {
    let err = run_with_config(
        "badrunc",
        "cfg3",
        None,
        Some("runc_binary = \"/nonexistent/runc\"\n"),
    );
    assert!(err.contains("/nonexistent/runc"), "{err}");
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
    // As containerd's runc-v2 shim says it.
    assert!(
        out.stderr
            .contains("OCI runtime create failed: runc create failed: "),
        "{out:?}"
    );
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
    assert!(
        out.stderr
            .contains("OCI runtime create failed: runc create failed: "),
        "{out:?}"
    );
    assert_nothing_left(&c, "nc1");
}
