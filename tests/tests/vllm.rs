//! vLLM's own barrier server (`python -m vllm.snapshot.server` of the vLLM
//! 0.33.0 wheel, unmodified) captured and restored by vsnap, from an OCI
//! image in the private containerd, over the stand-in engine of
//! tests/vllm-standin: a spawned EngineCore, spawn-context semaphores, a
//! Triton-cache `.so` written into the writable layer and kept mapped, PID 1
//! without a SIGTERM handler.

use std::time::{Duration, Instant};

use vsnap_e2e::cmd::CmdOutput;
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{exit_code, setup, Env, RT};
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
