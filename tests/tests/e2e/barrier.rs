//! The barrier profile of released vLLM (`--ready-file` / `--release-file`)
//! end to end: detected from the command line, captured, restored twice, and
//! checked by vsnap's own canary over HTTP before Start returns.

use std::time::Duration;

use vsnap_e2e::engine::{free_port, wait_listening, HostEngine};
use vsnap_e2e::snapshot_env::{answers, control_dirs, setup};

const BARRIER: [&str; 4] = [
    "--ready-file",
    "/run/vsnap/control/ready.json",
    "--release-file",
    "/run/vsnap/control/release.json",
];

#[test]
fn barrier_create_then_restore_twice_answers_like_a_cold_start() {
    let e = setup("barrier");
    let cold = HostEngine::start();
    let reference = answers(cold.port);

    let port = free_port();
    let out = e.run_args("bd", "create", "barrier", port, &[], &BARRIER);
    assert!(out.ok(), "{out:?}");
    let manifest = e.wait_manifest("barrier");
    assert_eq!(
        manifest["oracle"]["token_ids"].as_array().map(Vec::len),
        Some(1)
    );
    wait_listening(port, Duration::from_secs(60));
    assert_eq!(
        answers(port),
        reference,
        "the released donor answers like a cold start"
    );
    e.remove("bd");

    for copy in ["bc1", "bc2"] {
        let port = free_port();
        let out = e.run_args(copy, "restore", "barrier", port, &[], &BARRIER);
        assert!(out.ok(), "{copy}: {out:?}\n{}", e.c.log_tail());
        assert_eq!(answers(port), reference, "{copy}");
        e.remove(copy);
    }
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
}

#[test]
fn a_barrier_copy_whose_canary_drifts_never_becomes_visible() {
    let e = setup("barrier-drift");
    // In the barrier every release runs the recovery canary, the donor's too:
    // stop the donor after capture instead of releasing it.
    let drift = ["--env", "VSNAP_ENGINE_CANARY_DRIFT=1"];
    let mut create = drift.to_vec();
    create.extend_from_slice(&["--annotation", "vsnap.io/after-capture=exit"]);
    assert!(e
        .run_args("bx", "create", "bdrift", free_port(), &create, &BARRIER)
        .ok());
    e.wait_manifest("bdrift");
    e.wait_stopped("bx");
    e.remove("bx");

    let port = free_port();
    let out = e.run_args("by", "restore", "bdrift", port, &drift, &BARRIER);
    assert!(!out.ok(), "{out:?}");
    assert!(out.stderr.contains("restore: "), "{out:?}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    e.remove("by");
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
}

#[test]
fn an_unknown_engine_protocol_or_a_ready_file_elsewhere_is_refused() {
    let e = setup("barrier-bad");
    let out = e.run_args(
        "bb1",
        "create",
        "b",
        free_port(),
        &["--annotation", "vsnap.io/engine-protocol=pigeon"],
        &[],
    );
    assert!(
        !out.ok() && out.stderr.contains("vsnap.io/engine-protocol"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "bb1"]);
    let elsewhere = [
        "--ready-file",
        "/tmp/ready.json",
        "--release-file",
        "/run/vsnap/control/r.json",
    ];
    let out = e.run_args("bb2", "create", "b", free_port(), &[], &elsewhere);
    assert!(
        !out.ok() && out.stderr.contains("--ready-file /tmp/ready.json"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "bb2"]);
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
}
