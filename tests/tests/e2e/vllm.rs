//! vLLM's own barrier server (`python -m vllm.snapshot.server` of the vLLM
//! 0.33.0 wheel, unmodified) captured and restored by vsnap, from an OCI
//! image in the private containerd, over the stand-in engine of
//! tests/vllm-standin: a spawned EngineCore, spawn-context semaphores, a
//! Triton-cache `.so` written into the writable layer and kept mapped, PID 1
//! without a SIGTERM handler.

use std::time::{Duration, Instant};

use vsnap_e2e::cmd::CmdOutput;
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{assert_has, exit_code, poll, setup, Env, RT};
use vsnap_e2e::vllm::{self, BARRIER_FLAGS};

struct Run<'a> {
    id: &'a str,
    plan: &'a str,
    port: u16,
    extra: Vec<String>,
    argv: Vec<String>,
}

fn run(e: &Env, r: &Run) -> CmdOutput {
    let mut args: Vec<String> = [
        "run",
        "-d",
        "--net-host",
        "--seccomp",
        "--runtime",
        RT,
        "--runtime-config-path",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(e.config.clone());
    for a in [
        format!("vsnap.io/plan={}", r.plan),
        "vsnap.io/artifact=vllm".to_string(),
        format!("vsnap.io/listen=127.0.0.1:{}", r.port),
    ] {
        args.extend(["--annotation".to_string(), a]);
    }
    args.extend(r.extra.iter().cloned());
    args.extend([vllm::IMAGE.to_string(), r.id.to_string()]);
    args.extend(r.argv.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    vsnap_e2e::cmd::run(e.c.ctr_command(&args), None, Duration::from_secs(180))
}

fn vllm_env(tag: &str) -> Env {
    let e = setup(tag);
    vllm::import_image(&e.c, "default");
    e
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn vllms_server_is_captured_its_donor_stops_and_two_restores_answer() {
    let e = vllm_env("vllm");
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    let exit = strings(&["--annotation", "vsnap.io/after-capture=exit"]);
    let donor = Run {
        id: "vllm-donor",
        plan: "create",
        port: free_port(),
        extra: exit.clone(),
        argv: argv.clone(),
    };
    let out = run(&e, &donor);
    assert!(out.ok(), "{out:?}");
    let manifest = e.wait_manifest("vllm");
    let published = Instant::now();
    // The Triton launcher the cold start compiled travels in the layer.
    assert_eq!(
        manifest["rootfs"]["layer"]["kind"], "overlay-upper",
        "{manifest}"
    );
    assert!(
        manifest["contents"]["rootfs/upper.tar"].is_object(),
        "{}",
        manifest["contents"]
    );
    // The donor (PID 1 ignores SIGTERM) stops on the abort marker, with
    // its own exit status (vLLM's server exits 1), long before its 900 s
    // release timeout.
    e.wait_stopped("vllm-donor");
    eprintln!("donor stopped {:?} after the publish", published.elapsed());
    let deleted = e.remove("vllm-donor");
    assert_eq!(
        exit_code(&deleted),
        Some(1),
        "the donor's own exit: {deleted}"
    );
    let oracle = (
        manifest["oracle"]["token_ids"].clone(),
        manifest["oracle"]["text"].clone(),
        manifest["oracle"]["sampled_token_logprob"]
            .as_f64()
            .unwrap(),
    );

    for copy in ["vllm-copy1", "vllm-copy2"] {
        let port = free_port();
        let r = Run {
            id: copy,
            plan: "restore",
            port,
            extra: exit.clone(),
            argv: argv.clone(),
        };
        let out = run(&e, &r);
        assert!(out.ok(), "{copy}: {out:?}\n{}", e.c.log_tail());
        // Start returned after vsnap's own canary; the copy answers at once.
        let (status, answer) = vllm::canary(port, None);
        assert_eq!(status, 200, "{copy}: {answer}");
        let got = vllm::oracle_of(&answer);
        assert_eq!((&got.0, &got.1), (&oracle.0, &oracle.1), "{copy}: {answer}");
        assert!((got.2 - oracle.2).abs() <= 1e-3, "{copy}: {answer}");
        // The EngineCore survived with its semaphores and its mapped .so.
        let ps = e.c.ctr_ok(&["task", "ps", copy]);
        assert!(
            ps.lines().count() >= 4,
            "{copy}: PID 1, resource tracker, EngineCore: {ps}"
        );
        let shm = e.c.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "ls",
            copy,
            "/bin/ls",
            "-a",
            "/dev/shm",
        ]);
        assert!(
            !shm.stdout.contains("link_remap"),
            "{copy}: CRIU's link-remap files left: {shm:?}"
        );
    }
    for copy in ["vllm-copy1", "vllm-copy2"] {
        e.remove(copy);
    }
    e.assert_nothing_left();
}

/// Waits for `id`'s capture to publish `name` (or fail: then panics with
/// the shim's error record).
fn wait_published(e: &Env, id: &str, name: &str) -> serde_json::Value {
    let record = e.bundle(id).join("vsnap-error.json");
    poll(
        Duration::from_secs(120),
        &format!("{id}: the capture to end"),
        || e.manifest(name).exists() || record.exists(),
    );
    assert!(
        !record.exists(),
        "{id}: the capture failed: {}",
        std::fs::read_to_string(&record).unwrap_or_default()
    );
    e.wait_manifest(name)
}

/// A create of artifact "vllm" by donor `id` (`extra`, and stopped after
/// the capture); returns the manifest once the donor is gone.
fn create_exited(e: &Env, id: &str, argv: &[String], extra: &[String]) -> serde_json::Value {
    let mut extra = extra.to_vec();
    extra.extend(strings(&["--annotation", "vsnap.io/after-capture=exit"]));
    let donor = Run {
        id,
        plan: "create",
        port: free_port(),
        extra,
        argv: argv.to_vec(),
    };
    let out = run(e, &donor);
    assert!(out.ok(), "{out:?}");
    let manifest = wait_published(e, id, "vllm");
    e.wait_stopped(id);
    e.remove(id);
    manifest
}

/// A restore of "vllm" as `id`: Start returns, and the copy answers its
/// canary (with `key`). The copy is left running; returns its port.
fn restore_answers(e: &Env, id: &str, argv: &[String], extra: &[String], key: Option<&str>) -> u16 {
    let port = free_port();
    let copy = Run {
        id,
        plan: "restore",
        port,
        extra: extra.to_vec(),
        argv: argv.to_vec(),
    };
    let out = run(e, &copy);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    let (status, answer) = vllm::canary(port, key);
    assert_eq!(status, 200, "{id}: {answer}");
    port
}

#[test]
fn an_engine_with_an_api_key_is_checked_with_it_and_the_key_stays_out() {
    let e = vllm_env("vllm-key");
    const KEY: &str = "sk-vsnap-test-0123456789";
    let argv = vllm::server_argv(&BARRIER_FLAGS, &["--api-key", KEY]);
    // The donor serves after the capture: vsnap's canary authenticates.
    let port = free_port();
    let donor = Run {
        id: "key-donor",
        plan: "create",
        port,
        extra: vec![],
        argv: argv.clone(),
    };
    let out = run(&e, &donor);
    assert!(out.ok(), "{out:?}");
    wait_published(&e, "key-donor", "vllm");
    poll(Duration::from_secs(60), "the donor to serve", || {
        vllm::canary(port, Some(KEY)).0 == 200
    });
    assert_eq!(
        vllm::canary(port, None).0,
        401,
        "the engine enforces its key"
    );
    e.remove("key-donor");
    let manifest = std::fs::read_to_string(e.manifest("vllm")).unwrap();
    assert!(
        !manifest.contains(KEY),
        "the key is in the manifest: {manifest}"
    );

    restore_answers(&e, "key-copy", &argv, &[], Some(KEY));
    let log = std::fs::read_to_string(e.c.dir.join("containerd.log")).unwrap();
    assert!(!log.contains(KEY), "the key reached the shim's log");
    e.remove("key-copy");
    e.assert_nothing_left();
}

/// Whether this process (root, as the shim) has CAP_SYS_RESOURCE, which
/// CRIU needs to read the rlimits of a process of another user.
fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|bits| bits & (1 << 24) != 0)
}

#[test]
fn a_non_root_engine_owns_its_control_dir_and_its_home() {
    let e = vllm_env("vllm-user");
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    let extra = strings(&[
        "--user",
        "1000:1000",
        "--annotation",
        "vsnap.io/after-capture=exit",
    ]);
    let donor = Run {
        id: "user-donor",
        plan: "create",
        port: free_port(),
        extra: extra.clone(),
        argv: argv.clone(),
    };
    let out = run(&e, &donor);
    assert!(out.ok(), "{out:?}");
    if !has_cap_sys_resource() {
        // The engine wrote its ready file into its own control dir (the
        // capture got as far as CRIU's dump), and the dump's failure says
        // what this host lacks.
        let error = e.wait_capture_failed("user-donor");
        assert_has(
            &error,
            &[
                "capture: checkpoint",
                "Can't get rlimit",
                "lacks CAP_SYS_RESOURCE",
            ],
        );
        eprintln!("this host's root lacks CAP_SYS_RESOURCE: a non-root engine is captured only up to CRIU's dump");
        e.remove("user-donor");
        e.assert_nothing_left();
        return;
    }
    wait_published(&e, "user-donor", "vllm");
    e.wait_stopped("user-donor");
    e.remove("user-donor");
    restore_answers(&e, "user-copy", &argv, &extra, None);
    let id = e.c.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "id",
        "user-copy",
        "/bin/busybox",
        "stat",
        "-c",
        "%u %a",
        "/run/vsnap/control",
    ]);
    assert_eq!(id.trim(), "1000 700", "the control dir is the engine's own");
    let so = e.c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "ls",
        "user-copy",
        "/bin/ls",
        "/home/engine/.triton/cache",
    ]);
    assert!(
        so.ok() && !so.stdout.trim().is_empty(),
        "the engine's Triton cache came back: {so:?}"
    );
    e.remove("user-copy");
    e.assert_nothing_left();
}

#[test]
fn argument_shapes_as_vllm_parses_them() {
    let e = vllm_env("vllm-args");
    // Unique prefixes of the control flags: still the barrier profile.
    let abbreviated = vllm::server_argv(
        &[
            "--ready",
            "/run/vsnap/control/ready.json",
            "--release-f=/run/vsnap/control/release.json",
        ],
        &[],
    );
    create_exited(&e, "args-donor", &abbreviated, &[]);
    restore_answers(&e, "args-copy", &abbreviated, &[], None);
    e.remove("args-copy");
    let exit = strings(&["--annotation", "vsnap.io/after-capture=exit"]);

    // Refused at create, each naming what is wrong.
    let with_serve: Vec<String> = {
        let mut a = vllm::server_argv(&BARRIER_FLAGS, &[]);
        let at = a.iter().position(|x| x == "--").unwrap();
        a.insert(at + 1, "serve".into());
        a
    };
    let ambiguous = vllm::server_argv(
        &[
            "--ready-file",
            "/run/vsnap/control/ready.json",
            "--release",
            "/run/vsnap/control/release.json",
        ],
        &[],
    );
    let uds = vllm::server_argv(&BARRIER_FLAGS, &["--uds", "/tmp/vllm.sock"]);
    let tls = vllm::server_argv(&BARRIER_FLAGS, &["--ssl-keyfile", "/k.pem"]);
    for (id, argv, says) in [
        ("args-serve", with_serve, "serve"),
        ("args-ambiguous", ambiguous, "--release"),
        ("args-uds", uds, "--uds"),
        ("args-tls", tls, "--ssl-keyfile"),
    ] {
        let r = Run {
            id,
            plan: "create",
            port: free_port(),
            extra: exit.clone(),
            argv,
        };
        let out = run(&e, &r);
        assert!(!out.ok(), "{id}: {out:?}");
        assert_has(&out.stderr, &["create: ", says]);
        let _ = e.c.ctr(&["c", "rm", id]);
    }
    e.assert_nothing_left();
}

/// A capture made on clocks 10^6 s ahead (a host up that much longer),
/// restored on the host's: vLLM's release poll (an asyncio sleep on the
/// event loop's monotonic clock) would wait out the difference; CRIU's time
/// namespace continues the captured clocks, so the copy is released at once.
#[test]
fn a_capture_on_clocks_far_ahead_restores_on_the_hosts() {
    let mut e = vsnap_e2e::snapshot_env::setup_on(
        vsnap_e2e::containerd::Containerd::start_with_clock_offset("vllm-clocks", 1_000_000),
    );
    vllm::import_image(&e.c, "default");
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    create_exited(&e, "clk-donor", &argv, &[]);
    e.c.restart_on_host_clocks();
    restore_answers(&e, "clk-copy", &argv, &[], None);
    e.remove("clk-copy");
    e.assert_nothing_left();
}

/// Under CRI, as kubelet runs it: RuntimeDefault seccomp (which keeps the
/// real uvloop off io_uring), the pod's /dev/shm a host folder (the
/// semaphores and CRIU's link-remap files travel in the artifact's
/// `dev-shm/` and leave nothing behind), a pod that creates and one that
/// restores.
#[test]
fn a_pod_creates_and_another_restores_vllms_server_through_cri() {
    use k8s_cri::v1::{LinuxContainerSecurityContext, SecurityProfile};
    use vsnap_e2e::cri::{container_config, CriEnv, NAMESPACE, VSNAP};
    let e = CriEnv::start("vllm-cri");
    vllm::import_image(&e.c, NAMESPACE);
    e.cri.wait_image(vllm::IMAGE);
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let container = |name: &str| {
        let mut c = container_config(name, vllm::IMAGE, &argv);
        c.linux = Some(k8s_cri::v1::LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                seccomp: Some(SecurityProfile::default()), // RuntimeDefault
                ..Default::default()
            }),
            ..Default::default()
        });
        c
    };
    let pod = |name: &str, plan: &str, port: u16, extra: &[(&str, &str)]| {
        let listen = format!("127.0.0.1:{port}");
        let mut ann = vec![
            ("vsnap.io/plan", plan),
            ("vsnap.io/artifact", "vllm"),
            ("vsnap.io/listen", listen.as_str()),
        ];
        ann.extend_from_slice(extra);
        let config = e.pod_config(name, true, &ann);
        (e.run_pod(&config, VSNAP), config)
    };
    let (donor_pod, config) = pod(
        "vllm-create",
        "create",
        free_port(),
        &[("vsnap.io/after-capture", "exit")],
    );
    let donor = e.run_container(&donor_pod, &config, container("donor"));
    let manifest = e.wait_manifest("vllm");
    let st = e.cri.wait_exited(&donor, Duration::from_secs(60));
    assert_eq!(
        st.exit_code, 1,
        "the donor's own exit after the abort marker: {st:?}"
    );
    let contents = manifest["contents"].as_object().unwrap();
    // CRIU's link-remap of each semaphore (kept past the dump, which
    // removes it) is carried as a second name of the semaphore's file.
    assert!(
        contents.contains_key("dev-shm/.vsnap-links.json"),
        "{contents:?}"
    );
    assert!(
        contents.keys().any(|k| k.starts_with("dev-shm/sem.mp-")),
        "{contents:?}"
    );
    assert!(contents.contains_key("rootfs/upper.tar"), "{contents:?}");
    // vLLM V1's ZMQ socket files in /tmp: left out of the layer, named.
    let sockets = vllm::manifest_sockets(&manifest);
    assert_eq!(sockets.len(), 3, "{}", manifest["rootfs"]);
    e.remove_pod(&donor_pod);

    let port = free_port();
    let (copy_pod, config) = pod("vllm-restore", "restore", port, &[]);
    let copy = e.run_container(&copy_pod, &config, container("copy"));
    let (status, answer) = vllm::canary(port, None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["choices"][0]["token_ids"],
        manifest["oracle"]["token_ids"]
    );
    // The request went through the restored ZMQ channels, bound again at
    // their paths in the pod's network namespace.
    let pid = e.c.task_pid(NAMESPACE, &copy);
    let restored = vllm::assert_zmq_sockets("copy", pid, false);
    assert!(
        restored.live.is_subset(&sockets),
        "{restored:?} {sockets:?}"
    );
    let shm = e.cri.exec_sync(&copy, &["/bin/ls", "-a", "/dev/shm"]);
    let shm = String::from_utf8_lossy(&shm.stdout).to_string();
    assert!(
        shm.contains("sem.mp-") && !shm.contains("link_remap"),
        "{shm}"
    );
    e.remove_pod(&copy_pod);
    e.assert_nothing_left();
}

/// vLLM V1's ZMQ channels in the writable layer: the API process and its
/// EngineCore talk over pyzmq `ipc:///tmp/<uuid>` sockets, and the startup
/// handshake's socket file stays in /tmp after libzmq closed it. The
/// capture leaves the socket files out of the carried layer and names them
/// in the manifest; CRIU binds the live ones again at restore; every
/// restored copy answers through its channels.
#[test]
fn a_zmq_tree_from_the_image_is_captured_and_restored_twice_over_its_sockets() {
    let e = vllm_env("vllm-zmq");
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    // The donor serves after the capture, so its /tmp is still the one the
    // capture found (the engine makes its sockets once, before its ready
    // file; nothing in the tree touches /tmp afterwards).
    let port = free_port();
    let donor = Run {
        id: "zmq-donor",
        plan: "create",
        port,
        extra: vec![],
        argv: argv.clone(),
    };
    let out = run(&e, &donor);
    assert!(out.ok(), "{out:?}");
    let manifest = wait_published(&e, "zmq-donor", "vllm");
    let pid = e.c.task_pid("default", "zmq-donor");
    let captured = vllm::assert_zmq_sockets("zmq-donor", pid, true);
    assert_eq!(
        vllm::upper_tmp_sockets(pid),
        captured.all(),
        "the socket files are in the writable layer"
    );
    assert_eq!(
        vllm::manifest_sockets(&manifest),
        captured.all(),
        "the carried layer names every socket file it left out: {}",
        manifest["rootfs"]
    );
    poll(Duration::from_secs(60), "the donor to serve", || {
        vllm::canary(port, None).0 == 200
    });
    e.remove("zmq-donor");
    let oracle = (
        manifest["oracle"]["token_ids"].clone(),
        manifest["oracle"]["text"].clone(),
        manifest["oracle"]["sampled_token_logprob"]
            .as_f64()
            .unwrap(),
    );

    for copy in ["zmq-copy1", "zmq-copy2"] {
        // Start returned after vsnap's canary, which went through the
        // restored channels; this request does too.
        let port = restore_answers(&e, copy, &argv, &[], None);
        let (status, answer) = vllm::canary(port, None);
        assert_eq!(status, 200, "{copy}: {answer}");
        let got = vllm::oracle_of(&answer);
        assert_eq!((&got.0, &got.1), (&oracle.0, &oracle.1), "{copy}: {answer}");
        assert!((got.2 - oracle.2).abs() <= 1e-3, "{copy}: {answer}");
        // The live endpoints are bound again at their paths; the stale
        // handshake file was not carried.
        let pid = e.c.task_pid("default", copy);
        let restored = vllm::assert_zmq_sockets(copy, pid, false);
        assert_eq!(restored.live, captured.live, "{copy}: the same endpoints");
    }
    for copy in ["zmq-copy1", "zmq-copy2"] {
        e.remove(copy);
    }
    e.assert_nothing_left();
}
