//! The snapshot plans under injected faults, end to end under the private
//! containerd with real runc + CRIU: the reference engine's failure switches
//! (docs/protocol.md), resources CRIU must refuse, and damaged artifacts.
//!
//! Every case checks three things: the error names the phase, no artifact is
//! published (or the previous good one survives untouched), and nothing is
//! left behind once the containers are removed.

use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;

use vsnap_e2e::engine::{answer, complete, free_port};
use vsnap_e2e::snapshot_env::{assert_has, setup, Env};

fn create_good(e: &Env, id: &str, name: &str, env: &[&str]) -> Vec<u8> {
    e.create_good(id, name, env)
}

/// A restore that must fail at Start: returns ctr's stderr after checking
/// that nothing listens on the port, and removes the container.
fn failed_restore(e: &Env, id: &str, name: &str, extra: &[&str]) -> String {
    let port = free_port();
    let out = e.run(id, "restore", name, port, extra);
    assert!(!out.ok(), "{id} must not start: {out:?}");
    eprintln!("{id}: {}", out.stderr.trim());
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens on {port}"
    );
    e.remove(id);
    out.stderr
}

/// A restore that must succeed and answer on its port right away.
fn good_restore(e: &Env, id: &str, name: &str) {
    let port = free_port();
    let out = e.run(id, "restore", name, port, &[]);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    let reply = complete(port, "The capital of France is", 4);
    assert!(answer(&reply).0.is_string(), "{reply}");
    e.remove(id);
}

/// A create whose background capture must fail: returns the shim's error
/// record after checking that the task exited with `code` (137: killed by
/// the shim; 1: the engine's own failure exit).
fn failed_capture(e: &Env, id: &str, name: &str, code: u8, extra: &[&str]) -> String {
    e.failed_capture(id, name, code, extra)
}

fn damaged(what: &str, original: &[u8]) -> Option<Vec<u8>> {
    let mut bytes = original.to_vec();
    match what {
        "flip" => bytes[original.len() / 2] ^= 0x40,
        "append" => bytes.push(b'\n'),
        "truncate" => bytes.truncate(original.len() / 2),
        _ => return None,
    }
    Some(bytes)
}

#[test]
fn engine_failing_in_recovery_fails_the_restore_naming_the_phase() {
    let e = setup("f-recover");
    let manifest = create_good(
        &e,
        "flt-r0",
        "recover",
        &["VSNAP_ENGINE_FAIL_PHASE=recover"],
    );
    // Restored with the environment it was captured with (anything else is
    // another workload, refused at preflight).
    let err = failed_restore(
        &e,
        "flt-r1",
        "recover",
        &["--env", "VSNAP_ENGINE_FAIL_PHASE=recover"],
    );
    assert_has(
        &err,
        &[
            "restore: activation",
            "error.json",
            "engine failed in phase \"recover\"",
            "InjectedFailure",
        ],
    );
    assert_eq!(
        std::fs::read(e.manifest("recover")).unwrap(),
        manifest,
        "the artifact is untouched"
    );
    e.assert_nothing_left();
    // CRIU ran: its restore log outlives the task.
    let kept: Vec<String> = std::fs::read_dir(e.artifacts.join(".criu-logs"))
        .expect("CRIU's log kept under the artifact root")
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        kept.iter()
            .any(|n| n.ends_with("-recover-flt-r1-restore.log")),
        "{kept:?}"
    );
}

#[test]
fn engine_hanging_in_recovery_fails_the_restore_at_the_activation_deadline() {
    let e = setup("f-hang");
    let manifest = create_good(&e, "flt-h0", "hang", &["VSNAP_ENGINE_HANG_PHASE=recover"]);
    let err = failed_restore(
        &e,
        "flt-h1",
        "hang",
        &[
            "--env",
            "VSNAP_ENGINE_HANG_PHASE=recover",
            "--annotation",
            "vsnap.io/activation-timeout=3",
        ],
    );
    assert_has(
        &err,
        &[
            "restore: activation",
            "status.json",
            "timed out",
            "vsnap.io/activation-timeout",
        ],
    );
    assert_eq!(std::fs::read(e.manifest("hang")).unwrap(), manifest);
    e.assert_nothing_left();
}

/// Whether a process in a container (root without CAP_SYS_ADMIN, under the
/// seccomp filter this process runs under) may create an io_uring instance.
fn io_uring_allowed_in_containers() -> bool {
    match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        // 1: only CAP_SYS_ADMIN (or io_uring_group) may; 2: nobody may.
        Ok(v) if v.trim() != "0" => false,
        // 0, or a kernel without the sysctl: allowed if the kernel has it
        // and no seccomp filter refuses it, which the test process shares.
        _ => {
            let mut params = [0u32; 30];
            // SAFETY: io_uring_setup writes only into the 120-byte params.
            let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
            if fd >= 0 {
                // SAFETY: fd was just returned to us and is closed once.
                unsafe { libc::close(fd as i32) };
            }
            fd >= 0
        }
    }
}

#[test]
fn io_uring_held_at_capture_publishes_nothing_and_kills_the_task() {
    let e = setup("f-uring");
    if !io_uring_allowed_in_containers() {
        // The engine logs that io_uring_setup was refused and goes on
        // without it: nothing for the inventory to find, the capture works.
        let out = e.run(
            "flt-u0",
            "create",
            "uring",
            free_port(),
            &["--env", "VSNAP_ENGINE_IO_URING=1"],
        );
        assert!(out.ok(), "{out:?}");
        e.wait_manifest("uring");
        e.remove("flt-u0");
        e.assert_nothing_left();
        return;
    }
    let err = failed_capture(
        &e,
        "flt-u0",
        "uring",
        137,
        &["--env", "VSNAP_ENGINE_IO_URING=1"],
    );
    assert_has(&err, &["capture: inventory", "io_uring"]);
    e.assert_nothing_published();
    e.assert_nothing_left();
}

/// The first global IPv4 address of this machine (not loopback).
fn host_ipv4() -> Option<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let cidr = l.split_whitespace().skip_while(|f| *f != "inet").nth(1)?;
        cidr.split('/').next()?.parse().ok()
    })
}

#[test]
fn an_outside_tcp_connection_at_capture_publishes_nothing() {
    let e = setup("f-tcp");
    // A peer outside the tree needs a non-loopback address: loopback peers
    // count as inside (the container shares the host network). A missing
    // prerequisite is a failure, never a silent skip.
    let ip = host_ipv4().expect(
        "this test needs a global IPv4 address on the host (`ip -4 addr show scope global`)",
    );
    // The kernel completes the handshake into the backlog: no accept needed.
    let peer = TcpListener::bind((ip, 0)).unwrap();
    let addr = peer.local_addr().unwrap().to_string();
    let env = format!("VSNAP_ENGINE_OUTSIDE_TCP={addr}");
    let err = failed_capture(&e, "flt-tcp", "tcp", 137, &["--env", &env]);
    assert_has(&err, &["capture: inventory", "established TCP", &addr]);
    e.assert_nothing_published();
    drop(peer);
    e.assert_nothing_left();
}

#[test]
fn engine_failing_before_capture_ready_publishes_nothing() {
    let e = setup("f-init");
    let err = failed_capture(
        &e,
        "flt-i0",
        "init",
        1,
        &["--env", "VSNAP_ENGINE_FAIL_PHASE=initialize engine"],
    );
    assert_has(
        &err,
        &[
            "capture: waiting for capture-ready",
            "engine failed in phase \"initialize engine\"",
        ],
    );
    e.assert_nothing_published();
    e.assert_nothing_left();
}

/// An engine that reported its failure exits with its own code even when
/// its teardown takes a while (vLLM stops its workers and CUDA first): the
/// shim lets it, rather than killing it the moment `error.json` appears.
#[test]
fn an_engine_that_reports_a_failure_exits_with_its_own_code() {
    let e = setup("f-exit");
    let err = failed_capture(
        &e,
        "flt-x0",
        "exit",
        1,
        &[
            "--env",
            "VSNAP_ENGINE_FAIL_PHASE=initialize engine",
            "--env",
            "VSNAP_ENGINE_EXIT_DELAY_MS=300",
        ],
    );
    assert_has(&err, &["engine failed in phase \"initialize engine\""]);
    e.assert_nothing_published();
    e.assert_nothing_left();
}

#[test]
fn damaged_artifacts_are_refused_and_leave_nothing() {
    let e = setup("f-damage");
    let manifest = create_good(&e, "flt-g0", "good", &[]);
    let dir = e.artifact("good");

    // A symlink under the root pointing at a real artifact.
    std::os::unix::fs::symlink(&dir, e.artifact("link")).unwrap();
    let err = failed_restore(&e, "flt-link", "link", &[]);
    assert_has(&err, &["restore: preflight", "link", "symlink"]);
    std::fs::remove_file(e.artifact("link")).unwrap();

    // A group-writable artifact folder.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    let err = failed_restore(&e, "flt-mode", "good", &[]);
    assert_has(
        &err,
        &["restore: preflight", "group/world-writable", "0770"],
    );
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    // A manifest with a key the schema does not know (mode kept at 0600).
    let mut edited: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    edited["extra"] = serde_json::json!(1);
    std::fs::write(e.manifest("good"), serde_json::to_vec(&edited).unwrap()).unwrap();
    let err = failed_restore(&e, "flt-extra", "good", &[]);
    assert_has(
        &err,
        &["restore: preflight", "manifest.json", "unknown field"],
    );
    std::fs::write(e.manifest("good"), &manifest).unwrap();

    // Undone, the artifact restores: the refusals above were about the damage.
    good_restore(&e, "flt-undone", "good");

    // The corruption matrix: every damage to a pages image, a small image
    // and the captured oracle file is refused before anything of the copy
    // runs (well before the activation deadline), naming the file; `vsnap
    // verify` names it too.
    let by_size = |pages: bool| {
        let path = vsnap_e2e::snapshot_env::largest_image(&dir, pages);
        path.file_name().unwrap().to_string_lossy().into_owned()
    };
    let oracle_file = vsnap_e2e::containerd::list(&dir.join("control"))
        .into_iter()
        .find(|n| n == "capture-ready.json" || n == "ready.json")
        .expect("the captured oracle file");
    let targets = [
        format!("images/{}", by_size(true)),
        format!("images/{}", by_size(false)),
        format!("control/{oracle_file}"),
    ];
    let bounded = ["--annotation", "vsnap.io/activation-timeout=60"];
    let mut n = 0;
    for target in &targets {
        let path = dir.join(target);
        let original = std::fs::read(&path).unwrap();
        for what in ["flip", "append", "truncate", "delete"] {
            match damaged(what, &original) {
                Some(bytes) => std::fs::write(&path, bytes).unwrap(),
                None => std::fs::remove_file(&path).unwrap(),
            }
            n += 1;
            let id = format!("flt-d{n}");
            let t = std::time::Instant::now();
            let err = failed_restore(&e, &id, "good", &bounded);
            assert!(
                t.elapsed() < std::time::Duration::from_secs(20),
                "{what} {target}: refused fast, not at the deadline"
            );
            // A changed size, a missing or added file: at create; a changed
            // byte: at Start, while CRIU restores with the tree held stopped.
            let phase = if what == "flip" {
                "restore: verify: damaged"
            } else {
                "restore: preflight: damaged"
            };
            assert_has(&err, &[phase, target.as_str()]);
            assert_eq!(e.cgroups(&id), Vec::<String>::new(), "no process of {id}");
            let verify = e.vsnap(&["verify", "good"]);
            assert_eq!(verify.code, Some(1), "{what} {target}: {verify:?}");
            assert!(verify.stdout.contains(target.as_str()), "{verify:?}");
            std::fs::write(&path, &original).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
    assert_eq!(e.vsnap(&["verify", "good"]).code, Some(0));
    good_restore(&e, "flt-repaired", "good");

    assert_eq!(
        std::fs::read(e.manifest("good")).unwrap(),
        manifest,
        "failed restores never touch the manifest"
    );
    e.assert_nothing_left();
}

#[test]
fn a_failed_re_create_keeps_the_previous_artifact() {
    let e = setup("f-same");
    let manifest = create_good(&e, "flt-m0", "same", &[]);
    let err = failed_capture(
        &e,
        "flt-m1",
        "same",
        1,
        &["--env", "VSNAP_ENGINE_FAIL_PHASE=initialize engine"],
    );
    assert_has(&err, &["capture-ready", "initialize engine"]);
    assert_eq!(
        std::fs::read(e.manifest("same")).unwrap(),
        manifest,
        "the previous artifact's manifest is byte-identical"
    );
    assert_eq!(e.artifact_names(), vec!["same".to_string()]);
    good_restore(&e, "flt-m2", "same");
    e.assert_nothing_left();
}

#[test]
fn a_criu_dump_failure_publishes_nothing_and_names_the_checkpoint() {
    let e = setup("f-dump");
    // A perf_event fd passes vsnap's inventory but CRIU cannot dump it.
    let err = failed_capture(
        &e,
        "flt-d0",
        "dump",
        137,
        &["--env", "VSNAP_ENGINE_UNDUMPABLE=1"],
    );
    assert_has(
        &err,
        &[
            "capture: checkpoint: runc checkpoint failed",
            "CRIU: ",
            "perf_event",
        ],
    );
    e.assert_nothing_published();
    e.assert_nothing_left();
    // The task and its staging folder are gone; CRIU's log is not.
    let kept: Vec<std::path::PathBuf> = std::fs::read_dir(e.artifacts.join(".criu-logs"))
        .expect("CRIU's log kept under the artifact root")
        .map(|d| d.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let name = kept[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-dump-flt-d0-dump.log"), "{name}");
    let log = std::fs::read_to_string(&kept[0]).unwrap();
    assert_has(&log, &["perf_event", "Dumping FAILED"]);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&kept[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "root-only");
}

#[test]
fn a_foreign_listener_on_the_port_fails_the_restore() {
    let e = setup("f-foreign");
    create_good(&e, "flt-f0", "foreign", &[]);
    // Another process of the host (the container shares its network)
    // already listens where the copy should.
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port();
    let out = e.run("flt-f1", "restore", "foreign", port, &[]);
    assert!(!out.ok(), "a foreign listener never counts: {out:?}");
    // Whichever comes first: the reference engine binds during its
    // activation and reports the address in use, or vsnap's probe finds the
    // listening socket held outside the container (listener.rs).
    let named = out.stderr.contains(&format!(
        "restore: listener: 127.0.0.1:{port} is held by a process outside the container (pid {}",
        std::process::id()
    )) || out.stderr.contains(&format!(
        "restore: activation: {}",
        e.artifacts
            .join(".control/default-flt-f1/error.json")
            .display()
    )) && out.stderr.contains("Address already in use");
    assert!(named, "{}", out.stderr);
    e.remove("flt-f1");
    drop(squatter);
    // With the port free, the same artifact restores and answers.
    good_restore(&e, "flt-f2", "foreign");
    e.assert_nothing_left();
}

#[test]
fn another_namespace_neither_restores_nor_replaces_an_artifact() {
    let e = setup("f-tenant");
    let manifest = create_good(&e, "flt-t0", "shared", &[]);
    let in_tenant = |id: &str, plan: &str| {
        let mut cmd = e.run_command(id, plan, "shared", free_port(), &[], &[]);
        cmd.env("CONTAINERD_NAMESPACE", "tenant2");
        let out = vsnap_e2e::cmd::run(cmd, None, std::time::Duration::from_secs(120));
        let mut rm = e.c.ctr_command(&["c", "rm", id]);
        rm.env("CONTAINERD_NAMESPACE", "tenant2");
        let _ = vsnap_e2e::cmd::run(rm, None, std::time::Duration::from_secs(30));
        out
    };
    let out = in_tenant("flt-t1", "restore");
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &["restore: preflight: artifact shared belongs to tenant default, not tenant2"],
    );
    let out = in_tenant("flt-t2", "create");
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &["create: artifact shared belongs to tenant default, not tenant2"],
    );
    assert_eq!(std::fs::read(e.manifest("shared")).unwrap(), manifest);
    good_restore(&e, "flt-t3", "shared");
    e.assert_nothing_left();
}
