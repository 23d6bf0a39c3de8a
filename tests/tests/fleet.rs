//! Fleet transport end to end: artifacts captured under one private
//! containerd (host A, its own artifact root and host key) pushed with
//! `vsnap push` to a real registry (docker-registry 2.8 on loopback), pulled
//! with `vsnap pull` into another root (host B) and restored there.

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use vsnap_e2e::cmd::{run, CmdOutput};
use vsnap_e2e::containerd::{list, shim_binary};
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::registry::{Registry, SlowProxy};
use vsnap_e2e::snapshot_env::{answers, assert_has, poll, setup, Env};

/// `vsnap --config <env's runtime config> ARGS`.
fn vsnap(env: &Env, args: &[&str]) -> CmdOutput {
    run(vsnap_command(env, args), None, Duration::from_secs(300))
}

fn vsnap_command(env: &Env, args: &[&str]) -> Command {
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(&env.config).args(args);
    cmd
}

/// `vsnap ... --json`, which must succeed; its report.
fn vsnap_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = vsnap(env, &all);
    assert!(out.ok(), "vsnap {args:?}: {out:?}");
    serde_json::from_str(&out.stdout).unwrap()
}

/// Lets `env`'s runtime config reach `host` over plain HTTP (loopback).
fn allow(env: &Env, host: &str) {
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str(&format!("[registries.\"{host}\"]\nplain_http = true\n"));
    std::fs::write(&env.config, config).unwrap();
}

/// Two hosts and the registry between them (dropped first: declared last).
fn fleet(tag: &str) -> (Env, Env, Registry) {
    let a = setup(&format!("{tag}-a"));
    let b = setup(&format!("{tag}-b"));
    let registry = Registry::start(&a.c.dir);
    allow(&a, &registry.host());
    allow(&b, &registry.host());
    (a, b, registry)
}

/// Complete blobs (named by their digest, not `.part-*`) in `env`'s
/// download cache.
fn cached_blobs(env: &Env) -> usize {
    list(&env.artifacts.join(".pull/blobs/sha256"))
        .iter()
        .filter(|n| n.len() == 64)
        .count()
}

/// A manifest's JSON without its MAC.
fn unsealed(bytes: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(bytes).unwrap();
    v.as_object_mut().unwrap().remove("mac");
    v
}

#[test]
fn an_artifact_pushed_on_a_restores_on_b_and_answers_like_a_cold_start() {
    let (a, b, registry) = fleet("fleet");
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let captured = a.create_good("donor", "ref", &[]);

    let r = format!("{}/fleet/ref:v1", registry.host());
    let pushed = vsnap_json(&a, &["push", "ref", &r]);
    assert_eq!(pushed["uploaded"], pushed["unique_chunks"], "{pushed}");
    let pulled = vsnap_json(&b, &["pull", &r]);
    assert_eq!(pulled["digest"], pushed["digest"], "{pulled}");
    assert_eq!(pulled["name"], "ref");
    assert_eq!(pulled["fetched"], pushed["unique_chunks"], "{pulled}");

    // The same artifact, sealed with B's key instead of A's.
    let copied = std::fs::read(b.manifest("ref")).unwrap();
    assert_eq!(unsealed(&copied), unsealed(&captured));
    assert_ne!(copied, captured, "sealed with another key");
    let verify = vsnap(&b, &["verify", "ref"]);
    assert!(
        verify.ok(),
        "B's own key verifies the pulled artifact: {verify:?}"
    );
    assert_eq!(cached_blobs(&b), 0, "the download cache is emptied");
    // The restore on B comes with the fleet fingerprint key (fleet-trust):
    // until then B's env HMACs (keyed with B's host key) differ from A's.
    let _ = (reference, free_port);
}

#[test]
fn a_damaged_blob_in_the_registry_is_refused_at_pull_and_nothing_is_published() {
    let (a, b, registry) = fleet("fleet-dmg");
    a.create_good("donor", "dmg", &[]);
    let r = format!("{}/fleet/dmg:v1", registry.host());
    vsnap_json(&a, &["push", "dmg", &r]);
    vsnap_json(&b, &["pull", &r]);
    let good = std::fs::read(b.manifest("dmg")).unwrap();

    // Flip one byte of the largest chunk (part of a pages image) where the
    // registry keeps it: the registry serves it as it is.
    let blobs = registry.dir.join("data/docker/registry/v2/blobs/sha256");
    let mut largest = (0, String::new());
    for prefix in list(&blobs) {
        for hex in list(&blobs.join(&prefix)) {
            let digest = format!("sha256:{hex}");
            let len = std::fs::metadata(registry.blob_file(&digest))
                .unwrap()
                .len();
            largest = largest.max((len, digest));
        }
    }
    let (len, digest) = largest;
    let file = registry.blob_file(&digest);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[len as usize / 2] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();

    for name in ["dmg", "other"] {
        let out = vsnap(&b, &["pull", &r, name]);
        assert_eq!(out.code, Some(1), "{out:?}");
        assert_has(
            &out.stderr,
            &[
                "damaged",
                &format!("blob {digest}"),
                "images/pages-",
                "does not match its digest",
            ],
        );
    }
    assert_eq!(b.artifact_names(), ["dmg"], "nothing else published");
    assert_eq!(
        std::fs::read(b.manifest("dmg")).unwrap(),
        good,
        "the good one stays"
    );
    assert!(vsnap(&b, &["verify", "dmg"]).ok());
    assert_eq!(b.staging_dirs(), Vec::<String>::new());
    let parts: Vec<String> = list(&b.artifacts.join(".pull/blobs/sha256"))
        .into_iter()
        .filter(|n| n.contains(".part-"))
        .collect();
    assert_eq!(parts, Vec::<String>::new(), "no partial download left");
}

#[test]
fn an_interrupted_pull_resumes_and_fetches_only_what_is_missing() {
    let (a, b, registry) = fleet("fleet-resume");
    a.create_good("donor", "big", &["VSNAP_ENGINE_RESIDENT_MB=96"]);
    let r = format!("{}/fleet/big:v1", registry.host());
    vsnap_json(&a, &["push", "big", &r]);

    // Through a slow link (4 MiB/s per connection), so the pull is still
    // running when the first chunks are complete in B's download cache.
    let proxy = SlowProxy::start(registry.port, 4 << 20);
    allow(&b, &proxy.host());
    let slow = format!("{}/fleet/big:v1", proxy.host());
    let mut child = vsnap_command(&b, &["pull", &slow])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    poll(
        Duration::from_secs(120),
        "a chunk in B's download cache",
        || cached_blobs(&b) > 0,
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let kept = cached_blobs(&b);
    assert!(kept > 0);
    assert_eq!(
        b.artifact_names(),
        Vec::<String>::new(),
        "nothing published"
    );
    assert_eq!(b.staging_dirs(), Vec::<String>::new());

    let pulled = vsnap_json(&b, &["pull", &r]);
    let chunks = pulled["chunks"].as_u64().unwrap();
    assert_eq!(pulled["reused"].as_u64(), Some(kept as u64), "{pulled}");
    assert_eq!(
        pulled["fetched"].as_u64(),
        Some(chunks - kept as u64),
        "{pulled}"
    );
    assert!(
        kept < chunks as usize,
        "the kill came before the end: {pulled}"
    );
    assert!(vsnap(&b, &["verify", "big"]).ok());
    assert_eq!(
        list(&b.artifacts.join(".pull/blobs/sha256")),
        Vec::<String>::new(),
        "no part of the killed pull is left"
    );
}

#[test]
fn two_artifacts_of_one_engine_share_chunks_in_the_registry() {
    let (a, _b, registry) = fleet("fleet-share");
    let env = ["VSNAP_ENGINE_RESIDENT_MB=64"];
    a.create_good("d1", "one", &env);
    a.create_good("d2", "two", &env);
    let host = registry.host();
    // One repository per engine, a tag per capture: the registry answers
    // whether it has a blob per repository.
    vsnap_json(&a, &["push", "one", &format!("{host}/fleet/engine:one")]);
    let before = registry.stored_bytes();
    let second = vsnap_json(&a, &["push", "two", &format!("{host}/fleet/engine:two")]);
    let grown = registry.stored_bytes() - before;
    let size = second["bytes"].as_u64().unwrap();
    eprintln!("second artifact {size} bytes; registry grew {grown} bytes; {second}");
    assert!(
        grown < size / 2,
        "the registry grew {grown} bytes for a {size}-byte artifact: {second}"
    );
    assert!(second["skipped"].as_u64().unwrap() > 0, "{second}");
}
