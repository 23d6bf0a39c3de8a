//! Docker Engine as the front end: a private dockerd (tests/src/docker.rs)
//! against the test's private containerd, `docker run --runtime vsnap`,
//! images imported from the test rootfs, Docker's own overlay2 graph
//! driver preparing each container's rootfs.

use std::time::{Duration, Instant};

use vsnap_e2e::cmd::CmdOutput;
use vsnap_e2e::docker::{Docker, MOBY, RUNTIME};
use vsnap_e2e::engine::{engine_rootfs, free_port, wait_listening, HostEngine};
use vsnap_e2e::snapshot_env::{answers, assert_has, poll};
use vsnap_e2e::vllm::{self, BARRIER_FLAGS};

const IMAGE: &str = "vsnap-ref-engine:docker";

/// The cold start writes a compiled-cache-like file into its writable
/// layer, keeps it open on fd 3, deletes a file of the image, then
/// becomes the engine.
const WRITES_ITS_LAYER: &str = "busybox mkdir -p /root/.triton/cache/ab12 && \
     echo launcher > /root/.triton/cache/ab12/cuda_utils.so && \
     busybox rm -f /etc/deleted-by-engine && \
     exec 3</root/.triton/cache/ab12/cuda_utils.so && exec /vsnap-ref-engine";

/// A dockerd with [`IMAGE`]: busybox, the reference engine, `/root` and
/// `/etc/deleted-by-engine`.
fn docker_with_image(tag: &str) -> Docker {
    let d = Docker::start(tag);
    let work = d.dir.join("image");
    let root = engine_rootfs(&work);
    std::fs::create_dir_all(root.join("root")).unwrap();
    std::fs::write(root.join("etc/deleted-by-engine"), b"in the image").unwrap();
    d.import(&work, &root, IMAGE);
    d
}

/// `docker run -d --runtime vsnap --network host` (unless `extra` names
/// another network) of `argv` in [`IMAGE`]
/// as `name` with a plan on artifact `artifact`, listening on `port`.
fn run_plan(
    d: &Docker,
    name: &str,
    plan: &str,
    artifact: &str,
    port: u16,
    extra: &[&str],
    argv: &[&str],
) -> CmdOutput {
    let plan = format!("vsnap.io/plan={plan}");
    let artifact = format!("vsnap.io/artifact={artifact}");
    let listen = format!("vsnap.io/listen=127.0.0.1:{port}");
    let mut args = vec![
        "run",
        "-d",
        "--name",
        name,
        "--runtime",
        RUNTIME,
        "--annotation",
        &plan,
        "--annotation",
        &artifact,
        "--annotation",
        &listen,
    ];
    if !extra.contains(&"--network") {
        args.extend_from_slice(&["--network", "host"]);
    }
    args.extend_from_slice(extra);
    args.push(IMAGE);
    args.extend_from_slice(argv);
    d.docker(&args, None)
}

/// Waits for `text` in `docker logs NAME`, stdout or stderr (dockerd
/// copies the output on its own time).
fn wait_log(d: &Docker, name: &str, text: &str) {
    poll(
        Duration::from_secs(30),
        &format!("{text:?} in {name}'s log"),
        || {
            let out = d.docker(&["logs", name], None);
            out.stdout.contains(text) || out.stderr.contains(text)
        },
    );
}

#[test]
fn plain_containers_run_logs_exec_stdin_and_stop_under_vsnap() {
    let d = docker_with_image("docker-plain");
    let run = |args: &[&str], input: Option<&[u8]>| {
        let mut all = vec!["run", "--runtime", RUNTIME, "--network", "none"];
        all.extend_from_slice(args);
        d.docker(&all, input)
    };
    // Exit code and stdout of a foreground run.
    let out = run(&["--rm", IMAGE, "sh", "-c", "echo out; exit 3"], None);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (Some(3), "out\n"),
        "{out:?}"
    );
    // stdin.
    let out = run(&["--rm", "-i", IMAGE, "cat"], Some(b"through stdin\n"));
    assert_eq!(out.stdout, "through stdin\n", "{out:?}");

    // A served container: vsnap's shim runs it, in containerd's moby namespace.
    let serve = "trap 'echo bye; exit 0' TERM; echo started; while true; do sleep 0.1; done";
    let out = run(&["-d", "--name", "srv", IMAGE, "sh", "-c", serve], None);
    assert!(out.ok(), "{out:?}");
    let info = d
        .env
        .c
        .ctr_ok(&["--namespace", MOBY, "containers", "info", &d.id("srv")]);
    assert!(info.contains("\"io.vsnap.v1\""), "{info}");
    assert!(!d.env.c.shim_pids().is_empty(), "a vsnap shim serves srv");
    poll(Duration::from_secs(30), "srv's log", || {
        d.docker(&["logs", "srv"], None).stdout == "started\n"
    });
    let exec = d.docker(&["exec", "srv", "echo", "inside"], None);
    assert_eq!(exec.stdout, "inside\n", "{exec:?}");
    let exec = d.docker(&["exec", "srv", "sh", "-c", "exit 5"], None);
    assert_eq!(exec.code, Some(5), "{exec:?}");

    // docker stop: SIGTERM, handled well within the grace.
    let t = Instant::now();
    d.ok(&["stop", "--time", "60", "srv"]);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert_eq!(d.inspect("srv", "{{.State.ExitCode}}"), "0");
    assert_eq!(d.ok(&["logs", "srv"]), "started\nbye\n");
    // One that ignores SIGTERM is killed when its grace (2 s) ends.
    let ignores = "trap '' TERM; while true; do sleep 0.1; done";
    let out = run(&["-d", "--name", "deaf", IMAGE, "sh", "-c", ignores], None);
    assert!(out.ok(), "{out:?}");
    let t = Instant::now();
    d.ok(&["stop", "--time", "2", "deaf"]);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(30),
        "{took:?}"
    );
    assert_eq!(d.inspect("deaf", "{{.State.ExitCode}}"), "137");
    d.ok(&["rm", "srv", "deaf"]);
    poll(Duration::from_secs(30), "the shims to exit", || {
        d.env.c.shim_pids().is_empty()
    });
}

#[test]
fn create_then_restore_through_docker_run_and_a_refused_restore_says_why() {
    let d = docker_with_image("docker-snap");
    let reference = answers(HostEngine::start().port);
    let engine = ["/vsnap-ref-engine"];

    // create: the donor captures, publishes and goes on serving.
    let port = free_port();
    let out = run_plan(&d, "donor", "create", "ref", port, &[], &engine);
    assert!(out.ok(), "{out:?}");
    let manifest = d.env.wait_manifest("ref");
    assert!(
        manifest["workload"]["rootfs"]
            .as_str()
            .unwrap()
            .starts_with("overlay2 layers sha256:"),
        "the image's layers, not the container's own folder: {}",
        manifest["workload"]
    );
    wait_listening(port, Duration::from_secs(60));
    assert_eq!(
        answers(port),
        reference,
        "the donor answers like a cold start"
    );
    d.ok(&["rm", "-f", "donor"]);

    // restore: `docker run` returns once the copy listens and passed its canary.
    let port = free_port();
    let out = run_plan(&d, "copy", "restore", "ref", port, &[], &engine);
    assert!(out.ok(), "{out:?}");
    assert_eq!(answers(port), reference, "the copy answers like the donor");
    assert!(d.bundle("copy").join("vsnap-restore.json").exists());
    // The copy's own output goes on into the container's log.
    wait_log(&d, "copy", "(copy) released");
    d.ok(&["rm", "-f", "copy"]);

    // Another workload (an environment value changed): docker run fails
    // with vsnap's reason, naming the phase and the field, never the value.
    let out = run_plan(
        &d,
        "other",
        "restore",
        "ref",
        free_port(),
        &["--env", "MODEL_REV=2"],
        &engine,
    );
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "restore: preflight: fingerprint mismatch",
            "workload.env.MODEL_REV",
        ],
    );
    assert!(!out.stderr.contains("MODEL_REV=2"), "{out:?}");
    assert_eq!(d.inspect("other", "{{.State.Status}}"), "created");
    d.ok(&["rm", "other"]);
    d.assert_nothing_left();
}

#[test]
fn the_writable_layer_travels_and_docker_restart_of_auto_restores() {
    let d = docker_with_image("docker-layer");
    let script = ["/bin/sh", "-c", WRITES_ITS_LAYER];
    let cat = |name: &str, path: &str| d.docker(&["exec", name, "cat", path], None);

    // auto, first run: a create whose donor goes on serving.
    let port = free_port();
    let out = run_plan(&d, "svc", "auto", "layer", port, &[], &script);
    assert!(out.ok(), "{out:?}");
    let manifest = d.env.wait_manifest("layer");
    let layer = &manifest["rootfs"]["layer"];
    assert_eq!(layer["kind"], "overlay-upper", "{manifest}");
    assert!(layer["bytes"].as_u64().unwrap() >= 9, "{layer}");
    wait_listening(port, Duration::from_secs(60));
    let reference = answers(port);
    let bundle = d.bundle("svc");
    assert!(!bundle.join("vsnap-restore.json").exists(), "a cold start");

    // docker restart: the same container's next task restores from the
    // artifact (its bundle gets the restore's vsnap-restore.json, its log
    // the copy's activation), answering at once.
    d.ok(&["restart", "--time", "30", "svc"]);
    assert!(
        bundle.join("vsnap-restore.json").exists(),
        "restart restored: {}",
        d.env.c.log_tail()
    );
    assert_eq!(answers(port), reference);
    let set_aside = || {
        std::fs::read_dir(d.dir.join("data/overlay2"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().join("diff.vsnap-previous").is_dir())
            .count()
    };
    assert_eq!(set_aside(), 1, "the layer the first run wrote is set aside");
    wait_log(&d, "svc", &format!("copy-{} (copy) released", d.id("svc")));
    assert_eq!(
        cat("svc", "/root/.triton/cache/ab12/cuda_utils.so").stdout,
        "launcher\n"
    );
    d.ok(&["rm", "-f", "svc"]);
    assert_eq!(set_aside(), 0, "it goes with the container");

    // A new container, a fresh overlay2 layer: the carried one is put back.
    let port = free_port();
    let out = run_plan(&d, "copy", "restore", "layer", port, &[], &script);
    assert!(out.ok(), "{out:?}\n{}", d.env.c.log_tail());
    assert_eq!(answers(port), reference);
    let so = cat("copy", "/root/.triton/cache/ab12/cuda_utils.so");
    assert_eq!(so.stdout, "launcher\n", "{so:?}");
    let gone = cat("copy", "/etc/deleted-by-engine");
    assert!(!gone.ok(), "the whiteout travelled: {gone:?}");
    d.ok(&["rm", "-f", "copy"]);
    d.assert_nothing_left();
}

#[test]
fn vllms_server_from_an_overlay2_image_is_captured_and_restored_through_docker() {
    let d = Docker::start("docker-vllm");
    let work = d.dir.join("vllm-image");
    std::fs::create_dir_all(&work).unwrap();
    let env = [
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "VLLM_WORKER_MULTIPROC_METHOD=spawn",
    ];
    d.import_with(&work, &vllm::rootfs(), vllm::IMAGE, &env);
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    let run = |name: &str, plan: &str, port: u16| {
        let plan = format!("vsnap.io/plan={plan}");
        let listen = format!("vsnap.io/listen=127.0.0.1:{port}");
        let mut args = vec!["run", "-d", "--name", name, "--runtime", RUNTIME];
        args.extend(["--network", "host", "--annotation", &plan]);
        args.extend([
            "--annotation",
            "vsnap.io/artifact=vllm",
            "--annotation",
            &listen,
        ]);
        args.extend(["--annotation", "vsnap.io/after-capture=exit", vllm::IMAGE]);
        args.extend(argv.iter().map(String::as_str));
        d.docker(&args, None)
    };
    let out = run("vllm-donor", "create", free_port());
    assert!(out.ok(), "{out:?}");
    let manifest = d.env.wait_manifest("vllm");
    // The Triton launcher the cold start compiled travels in the layer.
    assert_eq!(
        manifest["rootfs"]["layer"]["kind"], "overlay-upper",
        "{manifest}"
    );
    // vLLM V1's ZMQ socket files in /tmp of the overlay2 layer: the
    // handshake's stale one and the two live channels, left out of the
    // carried layer and named.
    let sockets = vllm::manifest_sockets(&manifest);
    assert_eq!(sockets.len(), 3, "{}", manifest["rootfs"]);
    poll(Duration::from_secs(120), "the donor to stop", || {
        d.inspect("vllm-donor", "{{.State.Running}}") == "false"
    });
    d.ok(&["rm", "vllm-donor"]);
    let oracle = &manifest["oracle"];

    let port = free_port();
    let out = run("vllm-copy", "restore", port);
    assert!(out.ok(), "{out:?}\n{}", d.env.c.log_tail());
    let (status, answer) = vllm::canary(port, None);
    assert_eq!(status, 200, "{answer}");
    let got = vllm::oracle_of(&answer);
    assert_eq!(
        (&got.0, &got.1),
        (&oracle["token_ids"], &oracle["text"]),
        "{answer}"
    );
    // The request went through the restored ZMQ channels, bound again at
    // their paths.
    let pid: i32 = d.inspect("vllm-copy", "{{.State.Pid}}").parse().unwrap();
    let restored = vllm::assert_zmq_sockets("vllm-copy", pid, false);
    assert!(
        restored.live.is_subset(&sockets),
        "{restored:?} {sockets:?}"
    );
    let top = d.ok(&["top", "vllm-copy"]);
    assert!(
        top.lines().count() >= 4,
        "PID 1, resource tracker, EngineCore: {top}"
    );
    d.ok(&["rm", "-f", "vllm-copy"]);
}

/// Two containers of one image on networks of their own (`--network
/// none`), without `--hostname`: each is named by dockerd after its short
/// id, in `HOSTNAME` too. The second restores the first's artifact, and
/// inside it `hostname` is its own id, not the donor's, and so is the
/// identity its engine was handed.
#[test]
fn a_restore_under_docker_needs_no_shared_hostname() {
    let d = docker_with_image("docker-host");
    let engine = ["/vsnap-ref-engine"];
    let port = free_port();
    let none = ["--network", "none"];
    let out = run_plan(&d, "donor", "create", "own", port, &none, &engine);
    assert!(out.ok(), "{out:?}");
    d.env.wait_manifest("own");
    d.ok(&["rm", "-f", "donor"]);

    let out = run_plan(&d, "copy", "restore", "own", port, &none, &engine);
    assert!(out.ok(), "{out:?}\n{}", d.env.c.log_tail());
    let short_id: String = d.inspect("copy", "{{.Id}}").chars().take(12).collect();
    assert_eq!(
        d.ok(&["exec", "copy", "/bin/sh", "-c", "hostname"]).trim(),
        short_id
    );
    let pid: i32 = d.inspect("copy", "{{.State.Pid}}").parse().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let identity = vsnap_e2e::pod_net::in_netns_of(pid, move || {
        vsnap_e2e::pod_net::get_json(addr, "/v1/identity")
    });
    assert_eq!(identity["hostname"], short_id.as_str(), "{identity}");
    assert_eq!(identity["seed_applied"], true, "{identity}");
    d.ok(&["rm", "-f", "copy"]);
    d.assert_nothing_left();
}
