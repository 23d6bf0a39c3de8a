//! The `vsnap-hook` preflight checks as OCI `createRuntime` hooks, end to end
//! with real runc and CRIU.
//!
//! - Under runc alone: runc runs createRuntime hooks at `runc run` and again
//!   at `runc restore` (when CRIU reports "setup-namespaces"), and a failing
//!   hook stops the restore with no process left running.
//! - Under the private containerd with the vsnap shim: a restore plan's
//!   bundle carries the `ownership` and `fingerprint` hooks, a create plan's
//!   the `ownership --control-dir` hook, and an artifact made unsafe after the
//!   shim's own preflight (a group/world-writable folder inside it, which only
//!   the hook looks at) stops the restore before the engine runs. This part
//!   needs the shim to install the hooks (`spec::add_snapshot_hooks` called
//!   from `Snapshot::prepare`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use vsnap_e2e::cmd::{run, CmdOutput};
use vsnap_e2e::containerd::{scratch_dir, shim_binary};
use vsnap_e2e::engine::{free_port, wait_listening};
use vsnap_e2e::image::busybox_rootfs;
use vsnap_e2e::snapshot_env::{control_dirs, poll, setup};

/// cgroup folders (v1 or v2, cgroupfs) named `id` directly under a hierarchy.
fn cgroups_named(id: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(id)];
    for h in std::fs::read_dir(base).unwrap().flatten() {
        dirs.push(h.path().join(id));
    }
    dirs.into_iter().filter(|d| d.is_dir()).collect()
}

/// The hook binary of the workspace build, beside the shim.
fn hook_binary() -> PathBuf {
    let bin = shim_binary().with_file_name("vsnap-hook");
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first",
        bin.display()
    );
    bin
}

/// A busybox bundle under runc alone, with its own runc root.
struct RuncBox {
    dir: PathBuf,
    bundle: PathBuf,
    root: PathBuf,
    /// A number no other process on the host sleeps for: finds leftovers.
    marker: String,
}

impl RuncBox {
    fn new(tag: &str, hooks: Value) -> Self {
        let dir = scratch_dir(tag);
        let bundle = dir.join("bundle");
        std::fs::create_dir_all(&bundle).unwrap();
        busybox_rootfs(&bundle);
        let marker = format!("{}", 500_000 + std::process::id() % 400_000);
        let st = Command::new("runc")
            .args(["spec", "--bundle"])
            .arg(&bundle)
            .status()
            .unwrap();
        assert!(st.success(), "runc spec");
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        spec["process"]["terminal"] = json!(false);
        // The process's own stdio is /dev/null (CRIU cannot dump runc's pipes).
        spec["process"]["args"] = json!([
            "/bin/sh",
            "-c",
            format!("exec sleep {marker} </dev/null >/dev/null 2>&1")
        ]);
        spec["hooks"] = hooks;
        std::fs::write(&path, spec.to_string()).unwrap();
        RuncBox {
            root: dir.join("runc-root"),
            dir,
            bundle,
            marker,
        }
    }

    fn runc(&self, args: &[&str]) -> CmdOutput {
        let mut cmd = Command::new("runc");
        cmd.arg("--root").arg(&self.root).args(args);
        run(cmd, None, Duration::from_secs(60))
    }

    fn images(&self) -> (String, String) {
        (
            self.dir.join("images").display().to_string(),
            self.dir.join("work").display().to_string(),
        )
    }

    fn containers(&self) -> Vec<String> {
        self.runc(&["list", "-q"])
            .stdout
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Processes running this box's workload.
    fn workload_pids(&self) -> Vec<i32> {
        let wanted = format!("sleep\0{}\0", self.marker);
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c) == wanted)
            })
            .collect()
    }
}

impl Drop for RuncBox {
    fn drop(&mut self) {
        for id in self.containers() {
            let _ = self.runc(&["delete", "--force", &id]);
        }
        if !std::thread::panicking() || std::env::var_os("VSNAP_KEEP_FAILED").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[test]
fn runc_runs_create_runtime_hooks_at_restore_and_a_failing_one_stops_it() {
    // `io-uring` reading the container's user (root) from the bundle named in
    // the state on stdin, against a sysctl file the test controls.
    let dir = scratch_dir("hook-sysctl");
    let sysctl = dir.join("io_uring_disabled");
    let hook = hook_binary().display().to_string();
    let hooks = json!({"createRuntime": [{
        "path": hook,
        "args": ["vsnap-hook", "io-uring", "--sysctl", sysctl, "--group-sysctl", dir.join("none")],
        "timeout": 30,
    }]});
    let b = RuncBox::new("runc-hooks", hooks);
    let id = format!("vsnap-hook-{}", std::process::id());
    let bundle = b.bundle.display().to_string();
    let (images, work) = b.images();
    let expected = format!(
        "vsnap-hook io-uring: kernel.io_uring_disabled is 0 ({}); the container runs as root (uid 0, process.user of {bundle}/config.json), which needs 2",
        sysctl.display()
    );

    // At create: a failing hook stops `runc run`.
    std::fs::write(&sysctl, "0\n").unwrap();
    let out = b.runc(&["run", "-d", "--bundle", &bundle, &id]);
    assert!(!out.ok(), "{out:?}");
    assert!(out.stderr.contains(&expected), "{out:?}");
    assert_eq!(b.containers(), Vec::<String>::new());
    assert_eq!(b.workload_pids(), Vec::<i32>::new());

    // Passing, it runs; the checkpoint stops it.
    std::fs::write(&sysctl, "2\n").unwrap();
    let out = b.runc(&["run", "-d", "--bundle", &bundle, &id]);
    assert!(out.ok(), "{out:?}");
    // runc returns once init read the fifo; the init then execs sh, which
    // execs the workload.
    poll(Duration::from_secs(30), "the workload to run", || {
        b.workload_pids().len() == 1
    });
    let out = b.runc(&[
        "checkpoint",
        "--image-path",
        &images,
        "--work-path",
        &work,
        &id,
    ]);
    assert!(out.ok(), "{out:?}");
    // CRIU killed the dumped tree; it is gone once the kernel tore it down.
    poll(
        Duration::from_secs(30),
        "the checkpointed workload to go",
        || b.workload_pids().is_empty(),
    );

    // At restore: the hook runs again; failing, nothing is restored.
    std::fs::write(&sysctl, "1\n").unwrap();
    let restore = [
        "restore",
        "-d",
        "--image-path",
        &images,
        "--work-path",
        &work,
        "--bundle",
        &bundle,
        &id,
    ];
    let out = b.runc(&restore);
    assert!(!out.ok(), "a failing hook must stop the restore: {out:?}");
    assert!(
        out.stderr
            .contains(&expected.replace("disabled is 0", "disabled is 1")),
        "{out:?}"
    );
    assert_eq!(b.containers(), Vec::<String>::new(), "no container");
    assert_eq!(b.workload_pids(), Vec::<i32>::new(), "no process continues");
    poll(
        Duration::from_secs(10),
        "runc to remove the cgroups",
        || cgroups_named(&id).is_empty(),
    );

    // Passing, the same images restore.
    std::fs::write(&sysctl, "2\n").unwrap();
    let out = b.runc(&restore);
    assert!(out.ok(), "{out:?}");
    assert_eq!(b.containers(), vec![id.clone()]);
    assert_eq!(b.workload_pids().len(), 1, "restored");
    let out = b.runc(&["delete", "--force", &id]);
    assert!(out.ok(), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The vsnap-hook checks in a bundle's createRuntime hooks: their args
/// after "vsnap-hook".
fn vsnap_hooks(bundle: &Path) -> Vec<Vec<String>> {
    let spec: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    spec["hooks"]["createRuntime"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|h| {
            h["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/vsnap-hook"))
        })
        .map(|h| {
            assert_eq!(h["timeout"], 30, "{h}");
            h["args"].as_array().unwrap()[1..]
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        })
        .collect()
}

/// Needs the shim to install the hooks (`spec::add_snapshot_hooks` in
/// `Snapshot::prepare`).
#[test]
fn snapshot_plans_carry_the_hooks_and_an_unsafe_artifact_stops_the_restore() {
    let e = setup("hooks");
    let port = free_port();
    let out = e.run("h0", "create", "hooked", port, &[]);
    assert!(out.ok(), "{out:?}");
    let checks = vsnap_hooks(&e.bundle("h0"));
    let control = e
        .artifacts
        .join(".control/default-h0")
        .display()
        .to_string();
    assert_eq!(
        checks,
        vec![vec![
            "ownership".to_string(),
            "--control-dir".into(),
            control
        ]],
        "a create plan checks its control dir"
    );
    e.wait_manifest("hooked");
    wait_listening(port, Duration::from_secs(60));
    e.remove("h0");

    // A restore runs ownership and fingerprint, and both pass.
    let port = free_port();
    let out = e.run("h1", "restore", "hooked", port, &[]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    let checks = vsnap_hooks(&e.bundle("h1"));
    let names: Vec<&str> = checks.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(names, ["ownership", "fingerprint"], "{checks:?}");
    assert!(
        checks[1].contains(&"--shim-version".to_string()),
        "{checks:?}"
    );
    e.remove("h1");

    // An artifact made unsafe inside, where the shim's preflight does not
    // look: the hook stops the restore, naming the folder, and nothing runs.
    let images = e.artifact("hooked").join("images");
    let mode = |m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&images, std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(0o777);
    let port = free_port();
    let out = e.run("h2", "restore", "hooked", port, &[]);
    mode(0o700);
    assert!(!out.ok(), "an unsafe artifact must not restore: {out:?}");
    eprintln!("h2: {}", out.stderr.trim());
    assert!(
        out.stderr.contains(&format!(
            "vsnap-hook ownership: {} is group/world-writable (mode 0777)",
            images.display()
        )),
        "{out:?}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens"
    );
    e.remove("h2");
    assert!(
        e.cgroups("h2").is_empty(),
        "no cgroup left: {:?}",
        e.cgroups("h2")
    );

    // Made safe again, the same artifact restores.
    let port = free_port();
    let out = e.run("h3", "restore", "hooked", port, &[]);
    assert!(out.ok(), "{out:?}");
    e.remove("h3");
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
    e.assert_nothing_left();
}

/// Needs the shim to install the hooks. The shim appends `--snapshot-config`
/// to a `vllm serve` argv after it took the workload's identity; the
/// fingerprint hook is told to leave that pair out, so the restore passes.
/// (The reference engine ignores everything after `--`.)
#[test]
fn a_vllm_serve_restore_passes_the_fingerprint_hook() {
    let e = setup("hooks-vllm");
    let argv = ["--", "vllm", "serve", "some/model"];
    let port = free_port();
    assert!(e.run_args("v0", "create", "vllm", port, &[], &argv).ok());
    e.wait_manifest("vllm");
    wait_listening(port, Duration::from_secs(60));
    e.remove("v0");
    let port = free_port();
    let out = e.run_args("v1", "restore", "vllm", port, &[], &argv);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    let spec: Value =
        serde_json::from_slice(&std::fs::read(e.bundle("v1").join("config.json")).unwrap())
            .unwrap();
    let args = spec["process"]["args"].as_array().unwrap();
    assert_eq!(args[args.len() - 2], "--snapshot-config", "{args:?}");
    let checks = vsnap_hooks(&e.bundle("v1"));
    assert!(
        checks[1].contains(&"--strip-snapshot-config-arg".to_string()),
        "{checks:?}"
    );
    e.remove("v1");
}
