//! A restore from `vsnap.io/artifact-ref` on a host that lacks the
//! artifact starts while the artifact arrives (`stream_pulls`, on by
//! default): through a registry behind a slow link, CRIU starts before the
//! last chunk landed and the copy answers like a cold start; a registry
//! killed mid-stream fails a `restore` naming the reference and the chunk,
//! publishes nothing, and lets an `auto` start go on cold.

use std::time::Duration;

use serde_json::Value;
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::registry::{Registry, SlowProxy};
use vsnap_e2e::snapshot_env::{answers, assert_has, Env};

use super::harness::{fleet, partial_pulls, vsnap_json};

/// The engine holds this much on top of its own: enough pages that the
/// link, not the head, is what a streamed pull waits for.
const RESIDENT: &str = "VSNAP_ENGINE_RESIDENT_MB=96";
/// Bytes per second each of the pull's 4 connections gets from the proxy.
const LINK: u64 = 3_000_000;

/// The artifact `ref` captured on A and pushed (signed) to `registry` as
/// `fleet/ref:v1`; the answers a cold start gives.
fn pushed(a: &Env, registry: &Registry, donor: &str) -> (Vec<(Value, Value, Value)>, Value) {
    a.create_good(donor, "ref", &[RESIDENT]);
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let r = format!("{}/fleet/ref:v1", registry.host());
    let report = vsnap_json(a, &["push", "ref", &r]);
    (reference, report)
}

/// `ctr run` of a copy of `ref` on B with `plan`, from `reference`.
fn copy_command(
    b: &Env,
    id: &str,
    plan: &str,
    port: u16,
    reference: &str,
) -> std::process::Command {
    let from = format!("vsnap.io/artifact-ref={reference}");
    b.run_command(
        id,
        plan,
        "ref",
        port,
        &["--annotation", &from, "--env", RESIDENT],
        &[],
    )
}

/// A `restore` of `ref` on B from `reference` that must succeed, and the
/// copy answer as `answers` (a cold start's) do.
fn restored(b: &Env, id: &str, reference: &str, answers_as: &[(Value, Value, Value)]) {
    let port = free_port();
    let run = copy_command(b, id, "restore", port, reference);
    let out = vsnap_e2e::cmd::run(run, None, Duration::from_secs(300));
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(
        answers(port),
        answers_as,
        "the copy answers like a cold start"
    );
}

/// How many streamed pulls B's shims said a restore can start from.
fn heads(b: &Env) -> usize {
    let log = std::fs::read_to_string(b.c.dir.join("containerd.log")).unwrap_or_default();
    log.matches("a restore can start after").count()
}

/// Waits until B's pull of `ref` reached its head (the `heads`-th; a
/// restore starts from its tree), then kills `registry`.
fn kill_mid_stream(b: &Env, registry: &mut Registry, heads_before: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while heads(b) <= heads_before {
        assert!(
            std::time::Instant::now() < deadline,
            "no head of a streamed pull\n{}",
            b.c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    registry.kill();
}

#[test]
fn a_restore_through_a_slow_link_starts_criu_before_the_last_chunk_and_answers() {
    let (a, mut b, registry) = fleet("fleet-stream");
    b.rootfs = a.rootfs.clone();
    let (reference, _) = pushed(&a, &registry, "fleet-st-donor");
    let link = SlowProxy::start(registry.port, LINK);
    b.allow_registry(&link.host());
    let r = format!("{}/fleet/ref:v1", link.host());
    restored(&b, "fleet-st-copy", &r, &reference);
    let record: Value = serde_json::from_slice(
        &std::fs::read(b.bundle("fleet-st-copy").join("vsnap-restore.json")).unwrap(),
    )
    .unwrap();
    let criu = record["criu_began_unix_s"].as_f64().expect("CRIU's start");
    let last = record["pages_last_arrival_unix_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("a streamed restore records its last arrival: {record}"));
    assert!(
        criu < last,
        "CRIU began at {criu}, before the last chunk arrived at {last}: {record}"
    );
    // The pull publishes once the restore let go of its tree.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(b.artifact_names() == ["ref"] && partial_pulls(&b).is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pulled artifact was not published: {:?}, partial {:?}\n{}",
            b.artifact_names(),
            partial_pulls(&b),
            b.c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(b.manifest("ref")).unwrap()).unwrap();
    assert_eq!(manifest["origin"]["reference"], r.as_str(), "{manifest}");
    b.remove("fleet-st-copy");
    b.assert_nothing_left();
}

#[test]
fn a_streamed_restore_onto_a_host_that_seals_at_rest_answers_and_publishes_sealed() {
    let (a, mut b, registry) = fleet("fleet-stream-sealed");
    b.rootfs = a.rootfs.clone();
    let (reference, _) = pushed(&a, &registry, "fleet-ss-donor");
    b.prepend_config("seal_at_rest = true\n");
    let link = SlowProxy::start(registry.port, LINK);
    b.allow_registry(&link.host());
    let r = format!("{}/fleet/ref:v1", link.host());
    restored(&b, "fleet-ss-copy", &r, &reference);
    vsnap_e2e::snapshot_env::poll(Duration::from_secs(60), "the pull's publish", || {
        b.artifact_names() == ["ref"] && partial_pulls(&b).is_empty()
    });
    let inspected = vsnap_json(&b, &["inspect", "ref"]);
    assert_eq!(inspected["sealed_at_rest"], true, "{inspected}");
    b.remove("fleet-ss-copy");
    b.assert_nothing_left();
}

#[test]
fn a_registry_killed_mid_stream_fails_a_restore_naming_it_and_auto_goes_cold() {
    let (a, mut b, mut registry) = fleet("fleet-stream-kill");
    b.rootfs = a.rootfs.clone();
    pushed(&a, &registry, "fleet-sk-donor");
    let link = SlowProxy::start(registry.port, LINK);
    b.allow_registry(&link.host());
    let r = format!("{}/fleet/ref:v1", link.host());

    // `restore`: fails at Start, naming the reference and the chunk.
    let port = free_port();
    let run = copy_command(&b, "fleet-sk-restore", "restore", port, &r);
    let running =
        std::thread::spawn(move || vsnap_e2e::cmd::run(run, None, Duration::from_secs(300)));
    kill_mid_stream(&b, &mut registry, 0);
    let out = running.join().unwrap();
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "restore: page placement: stream: pull",
            &r,
            "did not arrive",
            "pull: blob sha256:",
            "images/pages-",
        ],
    );
    b.remove("fleet-sk-restore");
    assert_eq!(
        b.artifact_names(),
        Vec::<String>::new(),
        "nothing published"
    );
    assert_eq!(
        partial_pulls(&b),
        ["ref"],
        "what landed stays for the next pull"
    );

    // `auto`, the registry back and killed again mid-stream: the same
    // start goes on cold.
    let mut again = Registry::start(&b.c.dir);
    again.copy_content_from(&registry);
    let link = SlowProxy::start(again.port, LINK);
    b.allow_registry(&link.host());
    let r = format!("{}/fleet/ref:v1", link.host());
    let port = free_port();
    let run = copy_command(&b, "fleet-sk-auto", "auto", port, &r);
    let running =
        std::thread::spawn(move || vsnap_e2e::cmd::run(run, None, Duration::from_secs(300)));
    kill_mid_stream(&b, &mut again, 1);
    let out = running.join().unwrap();
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    // The container's own spec runs cold: the engine serves where its
    // command line says, not on the plan's port, so the record in the
    // bundle (written once the cold init started) is what is checked.
    let fallback = std::fs::read_to_string(b.bundle("fleet-sk-auto").join("vsnap-fallback.json"))
        .unwrap_or_default();
    for part in [
        "\"cause\":\"stream\"",
        "cold, without a capture",
        "did not arrive",
    ] {
        assert!(
            fallback.contains(part),
            "{part} not in {fallback:?}\n{}",
            b.c.log_tail()
        );
    }
    b.remove("fleet-sk-auto");
    assert_eq!(
        b.artifact_names(),
        Vec::<String>::new(),
        "nothing published"
    );
    b.assert_nothing_left();
}

#[test]
fn two_copies_started_at_once_on_a_node_without_the_artifact_share_one_pull() {
    let (a, mut b, registry) = fleet("fleet-stream-two");
    b.rootfs = a.rootfs.clone();
    let (reference, _) = pushed(&a, &registry, "fleet-s2-donor");
    let link = SlowProxy::start(registry.port, LINK);
    b.allow_registry(&link.host());
    let r = format!("{}/fleet/ref:v1", link.host());
    let ports = [free_port(), free_port()];
    let runs: Vec<_> = ["fleet-s2-one", "fleet-s2-two"]
        .iter()
        .zip(ports)
        .map(|(id, port)| {
            let run = copy_command(&b, id, "restore", port, &r);
            std::thread::spawn(move || vsnap_e2e::cmd::run(run, None, Duration::from_secs(300)))
        })
        .collect();
    for run in runs {
        let out = run.join().unwrap();
        assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    }
    for port in ports {
        assert_eq!(
            answers(port),
            reference,
            "each copy answers like a cold start"
        );
    }
    // Every chunk came over the link once: the second copy waited for the
    // pull under way, or, where both started one, the second found the
    // artifact published once it had the lock. Both are back, so a second
    // pull of every chunk would have fetched at least its head by now.
    let gets = blob_gets(&registry);
    assert!(
        gets.len() > 2,
        "the registry's log shows the pull: {gets:?}"
    );
    let twice: Vec<_> = gets.iter().filter(|(_, n)| **n > 1).collect();
    // A pull resolves the artifact (its config blob, its signature) before
    // it takes the name's pull lock: two that started at once both read
    // those two, and no chunk.
    assert!(
        twice.len() <= 2,
        "fetched more than once (the config and the signature aside): {twice:?}"
    );
    for id in ["fleet-s2-one", "fleet-s2-two"] {
        b.remove(id);
    }
    b.assert_nothing_left();
}

/// `auto` on a host that refuses the streamed artifact (its runc was
/// upgraded since A captured): the start goes on cold and captures the
/// artifact anew, and the pull, abandoned by the refusal, publishes
/// nothing over that capture and removes its partial folder.
#[test]
fn an_artifact_refused_under_auto_is_never_published_over_the_fresh_capture() {
    let (a, mut b, registry) = fleet("fleet-stream-refused");
    b.rootfs = a.rootfs.clone();
    pushed(&a, &registry, "fleet-sr-donor");
    b.upgrade("runc", "runc_binary", "runc version 1.1.99");
    let r = format!("{}/fleet/ref:v1", registry.host());
    let run = copy_command(&b, "fleet-sr-auto", "auto", free_port(), &r);
    let out = vsnap_e2e::cmd::run(run, None, Duration::from_secs(300));
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(heads(&b), 1, "streamed\n{}", b.c.log_tail());
    let fallback = std::fs::read_to_string(b.bundle("fleet-sr-auto").join("vsnap-fallback.json"))
        .unwrap_or_default();
    assert!(
        fallback.contains("\"cause\":\"host\"") && fallback.contains("runc_version"),
        "{fallback:?}\n{}",
        b.c.log_tail()
    );
    assert_abandoned(&b);
    b.remove("fleet-sr-auto");
    b.assert_nothing_left();
}

/// `auto` on B from an artifact whose copies answer their canary wrong
/// (the engine's fault injection, captured with it): the streamed restore
/// fails at Start for a cause that sets it aside (`restore`), the same
/// start goes on cold and captures anew, and the abandoned pull publishes
/// nothing over that capture.
#[test]
fn a_streamed_restore_that_fails_at_start_for_the_artifact_abandons_its_pull() {
    const DRIFT: &str = "VSNAP_ENGINE_CANARY_DRIFT=1";
    let (a, mut b, registry) = fleet("fleet-stream-drift");
    b.rootfs = a.rootfs.clone();
    a.create_good("fleet-sd-donor", "ref", &[RESIDENT, DRIFT]);
    vsnap_json(
        &a,
        &["push", "ref", &format!("{}/fleet/ref:v1", registry.host())],
    );
    let from = format!("vsnap.io/artifact-ref={}/fleet/ref:v1", registry.host());
    let env = ["--annotation", &from, "--env", RESIDENT, "--env", DRIFT];
    let run = b.run_command("fleet-sd-auto", "auto", "ref", free_port(), &env, &[]);
    let out = vsnap_e2e::cmd::run(run, None, Duration::from_secs(300));
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(heads(&b), 1, "streamed\n{}", b.c.log_tail());
    let fallback = std::fs::read_to_string(b.bundle("fleet-sd-auto").join("vsnap-fallback.json"))
        .unwrap_or_default();
    for part in ["\"cause\":\"restore\"", "canary", "cold, capturing"] {
        assert!(
            fallback.contains(part),
            "{part} not in {fallback:?}\n{}",
            b.c.log_tail()
        );
    }
    assert_abandoned(&b);
    b.remove("fleet-sd-auto");
    b.assert_nothing_left();
}

/// After a start that gave a streamed artifact up: B's own capture is
/// published as `ref` (no `origin`: not the pulled artifact), and the
/// pull, abandoned, removed its partial folder and said so.
fn assert_abandoned(b: &Env) {
    b.wait_manifest("ref");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !partial_pulls(b).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the pull's partial folder stays: {:?}\n{}",
            partial_pulls(b),
            b.c.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let published: Value =
        serde_json::from_slice(&std::fs::read(b.manifest("ref")).unwrap()).unwrap();
    assert!(
        published["origin"].is_null(),
        "captured here, not the pulled artifact: {}",
        published["origin"]
    );
    let log = std::fs::read_to_string(b.c.dir.join("containerd.log")).unwrap_or_default();
    assert_has(&log, &["abandoned by the restore"]);
}

/// How many times the registry's log shows a GET of each blob.
fn blob_gets(registry: &Registry) -> std::collections::BTreeMap<String, usize> {
    let mut gets = std::collections::BTreeMap::new();
    for l in registry.log().lines() {
        if !(l.contains("response completed") && l.contains("http.request.method=GET")) {
            continue;
        }
        let Some(at) = l.find("/blobs/sha256:") else {
            continue;
        };
        if let Some(d) = l.get(at + "/blobs/".len()..at + "/blobs/".len() + 71) {
            *gets.entry(d.to_string()).or_insert(0) += 1;
        }
    }
    gets
}
