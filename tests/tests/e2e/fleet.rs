//! Fleet transport end to end: artifacts captured under one private
//! containerd (host A, its own artifact root and host key) pushed with
//! `vsnap push` to a real registry (docker-registry 2.8 on loopback), pulled
//! with `vsnap pull` into another root (host B) and restored there.
//!
//! Container ids are unique across the tests of this file: runc puts a
//! container in the cgroup `<namespace>/<id>`, the same path for every
//! private containerd, so two parallel tests with one id share a cgroup
//! and removing one kills the other's engine.

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

/// Puts top-level keys first in `env`'s runtime config (before any table).
fn configure(env: &Env, lines: &str) {
    let config = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{lines}{config}")).unwrap();
}

/// A fleet key pair made with `vsnap key generate` in `env`'s folder:
/// (private, public).
fn key_pair(env: &Env, tag: &str) -> (String, String) {
    let private = env.c.dir.join(format!("{tag}.key")).display().to_string();
    let public = env.c.dir.join(format!("{tag}.pub")).display().to_string();
    let out = vsnap(
        env,
        &[
            "key",
            "generate",
            "--private",
            &private,
            "--public",
            &public,
        ],
    );
    assert!(out.ok(), "{out:?}");
    (private, public)
}

/// Two hosts and the registry between them (dropped first: declared last).
/// A signs what it pushes with the fleet key, B trusts it; both key the
/// workload fingerprints with the fleet's shared fingerprint key.
fn fleet(tag: &str) -> (Env, Env, Registry) {
    let (a, b, registry) = fleet_with(tag, None);
    allow(&a, &registry.host());
    allow(&b, &registry.host());
    (a, b, registry)
}

/// As [`fleet`], with a registry that wants `auth` and no registry entry
/// in the hosts' configs yet.
fn fleet_with(tag: &str, auth: Option<(&str, &str)>) -> (Env, Env, Registry) {
    let a = setup(&format!("{tag}-a"));
    let b = setup(&format!("{tag}-b"));
    let registry = Registry::start_with(&a.c.dir, auth);
    let (private, public) = key_pair(&a, "fleet");
    let shared = a.c.dir.join("fleet-fingerprint.key");
    std::fs::write(&shared, [0x5au8; 32]).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let shared = format!("fleet_fingerprint_key = \"{}\"\n", shared.display());
    configure(&a, &format!("fleet_signing_key = \"{private}\"\n{shared}"));
    configure(
        &b,
        &format!("fleet_trusted_keys = [\"{public}\"]\n{shared}"),
    );
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
    let (a, mut b, registry) = fleet("fleet");
    // The same root filesystem path on both hosts (it is part of the
    // workload's identity).
    b.rootfs = a.rootfs.clone();
    let captured = a.create_good("fleet-ref-donor", "ref", &[]);
    // The cold-start reference only after the capture: on two busy cores a
    // second engine starting beside a dump made CRIU lose a thread of the
    // donor ("Unable to detach from <pid>: No such process").
    let cold = HostEngine::start();
    let reference = answers(cold.port);

    let r = format!("{}/fleet/ref:v1", registry.host());
    let pushed = vsnap_json(&a, &["push", "ref", &r]);
    assert_eq!(pushed["uploaded"], pushed["unique_chunks"], "{pushed}");
    assert!(pushed["signed_by"].is_string(), "{pushed}");
    let pulled = vsnap_json(&b, &["pull", &r]);
    assert_eq!(pulled["digest"], pushed["digest"], "{pulled}");
    assert_eq!(pulled["name"], "ref");
    assert_eq!(pulled["fetched"], pushed["unique_chunks"], "{pulled}");
    assert_eq!(pulled["signed_by"], pushed["signed_by"], "{pulled}");
    // Each host's metrics count its transfer and the bytes it sent.
    let metrics = |env: &Env| {
        let out = vsnap(env, &["metrics"]);
        assert!(out.ok(), "{out:?}");
        out.stdout
    };
    let on_a = metrics(&a);
    assert_has(
        &on_a,
        &[
            "vsnap_pushes_total{artifact=\"ref\",result=\"ok\"} 1",
            &format!(
                "vsnap_pushed_bytes_total{{artifact=\"ref\"}} {}",
                pushed["uploaded_bytes"]
            ),
            "vsnap_captures_total{artifact=\"ref\",result=\"ok\"} 1",
        ],
    );
    assert_has(
        &metrics(&b),
        &[
            "vsnap_pulls_total{artifact=\"ref\",result=\"ok\"} 1",
            &format!(
                "vsnap_pulled_bytes_total{{artifact=\"ref\"}} {}",
                pulled["fetched_bytes"]
            ),
        ],
    );

    // The same artifact, sealed with B's key instead of A's, and saying
    // where it came from.
    let copied = std::fs::read(b.manifest("ref")).unwrap();
    let mut origin = unsealed(&copied);
    let origin = origin.as_object_mut().unwrap().remove("origin").unwrap();
    assert_eq!(origin["manifest_digest"], pushed["digest"], "{origin}");
    assert_eq!(origin["signed_by"], pushed["signed_by"], "{origin}");
    assert_eq!(origin["reference"], r.as_str(), "{origin}");
    let mut without_origin = unsealed(&copied);
    without_origin.as_object_mut().unwrap().remove("origin");
    assert_eq!(without_origin, unsealed(&captured));
    let verify = vsnap(&b, &["verify", "ref"]);
    assert!(
        verify.ok(),
        "B's own key verifies the pulled artifact: {verify:?}"
    );
    assert_eq!(cached_blobs(&b), 0, "the download cache is emptied");

    let port = free_port();
    let out = b.run("fleet-ref-copy", "restore", "ref", port, &[]);
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "B's copy answers like a cold start"
    );
    b.remove("fleet-ref-copy");
}

#[test]
fn unsigned_and_untrusted_artifacts_are_refused_before_any_chunk_is_fetched() {
    let (a, b, registry) = fleet("fleet-trust");
    a.create_good("fleet-trust-donor", "t", &[]);
    let host = registry.host();
    // A's config with another signing key line (or none).
    let config = std::fs::read_to_string(&a.config).unwrap();
    let signing = config.lines().next().unwrap().to_string();
    let push_with = |tag: &str, signing_line: &str, r: &str| {
        let path = a.c.dir.join(format!("{tag}.toml"));
        std::fs::write(&path, config.replace(&signing, signing_line)).unwrap();
        let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
        cmd.arg("--config")
            .arg(&path)
            .args(["push", "t", r, "--json"]);
        let out = run(cmd, None, Duration::from_secs(300));
        assert!(out.ok(), "{out:?}");
        out.stdout
    };

    // Not signed at all. (A signature is of a manifest digest, so every tag
    // of one manifest finds it: the unsigned push comes first.)
    let r = format!("{host}/fleet/t:unsigned");
    let pushed = push_with("unsigned", "", &r);
    assert!(pushed.contains("\"signed_by\": null"), "{pushed}");
    let out = vsnap(&b, &["pull", &r]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_has(&out.stderr, &["fleet signature", "not signed"]);

    // Signed by a key B does not trust.
    let (other, _) = key_pair(&a, "other");
    let r = format!("{host}/fleet/t:rogue");
    push_with("rogue", &format!("fleet_signing_key = \"{other}\""), &r);
    let out = vsnap(&b, &["pull", &r]);
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_has(
        &out.stderr,
        &["fleet signature", "which is not among the trusted keys"],
    );

    assert_eq!(
        b.artifact_names(),
        Vec::<String>::new(),
        "nothing published"
    );
    assert_eq!(cached_blobs(&b), 0, "no chunk fetched");
    // Signed by the fleet key: the same artifact pulls.
    let r = format!("{host}/fleet/t:good");
    vsnap_json(&a, &["push", "t", &r]);
    vsnap_json(&b, &["pull", &r]);
    assert_eq!(b.artifact_names(), ["t"]);
}

#[test]
fn a_damaged_blob_in_the_registry_is_refused_at_pull_and_nothing_is_published() {
    let (a, b, registry) = fleet("fleet-dmg");
    a.create_good("fleet-dmg-donor", "dmg", &[]);
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
    a.create_good(
        "fleet-resume-donor",
        "big",
        &["VSNAP_ENGINE_RESIDENT_MB=96"],
    );
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
    a.create_good("fleet-share-1", "one", &env);
    a.create_good("fleet-share-2", "two", &env);
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

#[test]
fn registry_credentials_come_only_from_the_runtime_config_and_never_show() {
    const PASSWORD: &str = "s3cret-fleet-pw";
    let (a, b, registry) = fleet_with("fleet-auth", Some(("fleet", PASSWORD)));
    a.create_good("fleet-auth-donor", "c", &[]);
    let host = registry.host();
    let r = format!("{host}/fleet/c:v1");
    let mut outputs = Vec::new();

    // The registry's entry in a host's runtime config, replaced each time.
    let entry = |env: &Env, credentials: &str| {
        let config = std::fs::read_to_string(&env.config).unwrap();
        let base = config.split("[registries.").next().unwrap().to_string();
        std::fs::write(
            &env.config,
            format!("{base}[registries.\"{host}\"]\nplain_http = true\n{credentials}"),
        )
        .unwrap();
    };
    // No credentials: anonymous, which the registry refuses.
    entry(&a, "");
    let out = vsnap(&a, &["push", "c", &r]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert_has(&out.stderr, &["the registry wants credentials"]);
    outputs.push(out);
    let password_file = a.c.dir.join("registry.password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(
        &password_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let credentials = format!(
        "username = \"fleet\"\npassword_file = \"{}\"\n",
        password_file.display()
    );
    entry(&a, &credentials);
    // A password file others can read is refused, naming the file only.
    let out = vsnap(&a, &["push", "c", &r]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert_has(
        &out.stderr,
        &["password_file", "not readable by group or others"],
    );
    outputs.push(out);
    std::fs::set_permissions(
        &password_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();

    // Credentials in the reference are refused without echoing them.
    let out = vsnap(
        &a,
        &["push", "c", &format!("fleet:{PASSWORD}@{host}/fleet/c:v1")],
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert_has(&out.stderr, &["credentials", "refused"]);
    outputs.push(out);

    let pushed = vsnap(&a, &["push", "c", &r, "--json"]);
    assert!(pushed.ok(), "{pushed:?}");
    outputs.push(pushed);
    // B without the entry is refused by the registry, then pulls with it.
    entry(&b, "");
    let out = vsnap(&b, &["pull", &r]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert_has(&out.stderr, &["the registry wants credentials"]);
    outputs.push(out);
    entry(&b, &credentials);
    let pulled = vsnap(&b, &["pull", &r]);
    assert!(pulled.ok(), "{pulled:?}");
    outputs.push(pulled);
    assert_eq!(b.artifact_names(), ["c"]);
    for out in &outputs {
        assert!(
            !out.stdout.contains(PASSWORD) && !out.stderr.contains(PASSWORD),
            "the password shows: {out:?}"
        );
    }
    assert!(!registry.log().contains(PASSWORD), "the registry's log");
}

#[test]
fn a_restore_from_a_reference_pulls_what_is_missing_and_refuses_the_untrusted() {
    let (a, mut b, registry) = fleet("fleet-ref");
    b.rootfs = a.rootfs.clone();
    a.create_good("fleet-fr-donor", "ref", &[]);
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let host = registry.host();

    // Pushed unsigned first (a signature is per manifest digest, so the
    // signed push of the same manifest must come after).
    let config = std::fs::read_to_string(&a.config).unwrap();
    let signing = config.lines().next().unwrap().to_string();
    assert!(signing.starts_with("fleet_signing_key"), "{signing}");
    let unsigned_config = a.c.dir.join("unsigned.toml");
    std::fs::write(&unsigned_config, config.replace(&signing, "")).unwrap();
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(&unsigned_config).args([
        "push",
        "ref",
        &format!("{host}/fleet/ref:unsigned"),
    ]);
    assert!(run(cmd, None, Duration::from_secs(300)).ok());
    let from = |tag: &str| format!("vsnap.io/artifact-ref={host}/fleet/ref:{tag}");

    // A restore from the unsigned reference on B, which lacks the artifact:
    // refused at create, naming the reference and the signature; nothing
    // published, nothing fetched, nothing left.
    let port = free_port();
    let out = b.run(
        "fleet-fr-unsigned",
        "restore",
        "ref",
        port,
        &["--annotation", &from("unsigned")],
    );
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &["restore: pull", "fleet/ref:unsigned", "not signed"],
    );
    b.remove("fleet-fr-unsigned");
    assert_eq!(b.artifact_names(), Vec::<String>::new());
    assert_eq!(cached_blobs(&b), 0, "no chunk fetched");

    // Signed by the fleet key: the restore pulls the artifact, then restores
    // it, and the copy answers like a cold start.
    vsnap_json(&a, &["push", "ref", &format!("{host}/fleet/ref:v1")]);
    let port = free_port();
    let out = b.run(
        "fleet-fr-copy1",
        "restore",
        "ref",
        port,
        &["--annotation", &from("v1")],
    );
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "the pulled copy answers like a cold start"
    );
    b.remove("fleet-fr-copy1");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(b.manifest("ref")).unwrap()).unwrap();
    assert_eq!(
        manifest["origin"]["reference"],
        format!("{host}/fleet/ref:v1").as_str(),
        "{manifest}"
    );

    // The artifact is here now: the next restore uses it as it is, even with
    // the registry gone.
    drop(registry);
    let port = free_port();
    let out = b.run(
        "fleet-fr-copy2",
        "restore",
        "ref",
        port,
        &["--annotation", &from("v1")],
    );
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(answers(port), reference);
    b.remove("fleet-fr-copy2");
    b.assert_nothing_left();
}

#[test]
fn an_auto_create_pushes_what_it_published_when_the_config_asks() {
    let (a, mut b, registry) = fleet("fleet-autopush");
    b.rootfs = a.rootfs.clone();
    configure(&a, "push_created = true\n");
    let r = format!("{}/fleet/autopush:v1", registry.host());
    // Not in the registry yet: `auto` starts cold, captures, publishes, and
    // then pushes to its reference in the background, signed.
    let port = free_port();
    let with_ref = format!("vsnap.io/artifact-ref={r}");
    let out = a.run(
        "fleet-ap-donor",
        "auto",
        "autopush",
        port,
        &[
            "--annotation",
            &with_ref,
            "--annotation",
            "vsnap.io/after-capture=exit",
        ],
    );
    assert!(out.ok(), "{out:?}\n{}", a.c.log_tail());
    a.wait_manifest("autopush");
    poll(
        Duration::from_secs(120),
        "A's push to reach the registry",
        || vsnap(&b, &["pull", &r]).ok(),
    );
    assert_eq!(b.artifact_names(), ["autopush"]);
    a.wait_stopped("fleet-ap-donor");
    a.remove("fleet-ap-donor");

    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let port = free_port();
    let out = b.run("fleet-ap-copy", "restore", "autopush", port, &[]);
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "the pushed artifact restores on B"
    );
    b.remove("fleet-ap-copy");
}

/// Every regular file under `dir` (recursively) whose bytes hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                let bytes = std::fs::read(entry.path()).unwrap();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(entry.path().display().to_string());
                }
            }
        }
    }
    found
}

/// A fleet encryption key made with `vsnap key generate-encryption` in
/// `env`'s folder: (path, key id).
fn encryption_key(env: &Env, tag: &str) -> (String, String) {
    let path = env.c.dir.join(format!("{tag}.key")).display().to_string();
    let made = vsnap_json(env, &["key", "generate-encryption", &path]);
    (path, made["key_id"].as_str().unwrap().to_string())
}

/// `vsnap --config CONFIG ARGS`, CONFIG being `env`'s runtime config with
/// the top-level keys `lines` sets replaced by `lines`.
fn vsnap_with(env: &Env, tag: &str, lines: &str, args: &[&str]) -> CmdOutput {
    let path = env.c.dir.join(format!("{tag}.toml"));
    let keys: Vec<&str> = lines
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let config: String = std::fs::read_to_string(&env.config)
        .unwrap()
        .lines()
        .filter(|l| !keys.contains(&l.split(' ').next().unwrap_or_default()))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, format!("{lines}{config}")).unwrap();
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(&path).args(args);
    run(cmd, None, Duration::from_secs(300))
}

#[test]
fn an_encrypted_push_leaves_no_secret_in_the_registry_and_restores_on_b() {
    let (a, mut b, registry) = fleet("fleet-enc");
    b.rootfs = a.rootfs.clone();
    let (key, key_id) = encryption_key(&a, "fleet-enc");
    let line = format!("fleet_encryption_key = \"{key}\"\n");
    configure(&a, &line);
    configure(&b, &line);
    // The engine keeps its environment in memory (its stack): a secret
    // value there is in the CRIU pages of the artifact.
    const SECRET: &str = "vsnap-e2e-secret-4f1c9a7e2b8d6053";
    let env = format!("VSNAP_E2E_API_KEY={SECRET}");
    a.create_good("fleet-enc-donor", "enc", &[&env]);
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let in_clear = files_holding(&a.artifact("enc").join("images"), SECRET.as_bytes());
    assert!(
        !in_clear.is_empty(),
        "the scan finds the secret in the local artifact's memory images"
    );

    let r = format!("{}/fleet/enc:v1", registry.host());
    let pushed = vsnap_json(&a, &["push", "enc", &r]);
    assert_eq!(pushed["encrypted_with"], key_id.as_str(), "{pushed}");
    assert_eq!(
        files_holding(&registry.dir, SECRET.as_bytes()),
        Vec::<String>::new(),
        "no file of the registry holds the secret"
    );
    let manifest =
        std::fs::read_to_string(registry.blob_file(pushed["digest"].as_str().unwrap())).unwrap();
    assert_has(
        &manifest,
        &[
            "application/vnd.vsnap.chunk.v1+encrypted",
            "application/vnd.vsnap.artifact.config.v1+json+encrypted",
            &key_id,
        ],
    );
    let secret_hex = std::fs::read_to_string(&key).unwrap();
    let secret_hex = secret_hex.lines().nth(1).unwrap();
    assert!(files_holding(&registry.dir, secret_hex.as_bytes()).is_empty());

    // A pull with another fleet's key: refused naming the key it needs,
    // nothing fetched, nothing published.
    let (other, _) = encryption_key(&b, "other-enc");
    let wrong = vsnap_with(
        &b,
        "wrong",
        &format!("fleet_encryption_key = \"{other}\"\n"),
        &["pull", &r],
    );
    assert_eq!(wrong.code, Some(1), "{wrong:?}");
    assert_has(&wrong.stderr, &["encrypted with fleet key", &key_id]);
    assert_eq!(
        b.artifact_names(),
        Vec::<String>::new(),
        "nothing published"
    );
    assert_eq!(cached_blobs(&b), 0, "no chunk fetched");

    // Another key signs the same manifest in the same repository: its
    // signature is added, the fleet's stays, B's pull still trusts it.
    let (rogue, _) = key_pair(&a, "rogue");
    let out = vsnap_with(
        &a,
        "rogue",
        &format!("fleet_signing_key = \"{rogue}\"\n"),
        &["push", "enc", &r, "--json"],
    );
    assert!(out.ok(), "{out:?}");
    let pulled = vsnap_json(&b, &["pull", &r]);
    assert_eq!(pulled["digest"], pushed["digest"], "{pulled}");
    assert_eq!(pulled["signed_by"], pushed["signed_by"], "{pulled}");
    assert_eq!(pulled["decrypted_with"], key_id.as_str(), "{pulled}");
    for out in [&wrong, &out] {
        assert!(!out.stdout.contains(secret_hex) && !out.stderr.contains(secret_hex));
    }

    let port = free_port();
    let out = b.run("fleet-enc-copy", "restore", "enc", port, &["--env", &env]);
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "B's copy answers like a cold start"
    );
    b.remove("fleet-enc-copy");

    // Rotation: a new current key, the old one kept to decrypt. What was
    // pushed under the old key still pulls; a push now seals with the new.
    let (new, new_id) = encryption_key(&a, "fleet-enc-2");
    let rotated =
        format!("fleet_encryption_key = \"{new}\"\nfleet_decryption_keys = [\"{key}\"]\n");
    let out = vsnap_with(&b, "rotated", &rotated, &["pull", &r, "old", "--json"]);
    assert!(out.ok(), "{out:?}");
    let old: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(old["decrypted_with"], key_id.as_str(), "{old}");
    let r2 = format!("{}/fleet/enc:v2", registry.host());
    let out = vsnap_with(&a, "rotated", &rotated, &["push", "enc", &r2, "--json"]);
    assert!(out.ok(), "{out:?}");
    let v2: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v2["encrypted_with"], new_id.as_str(), "{v2}");
    let out = vsnap_with(&b, "rotated", &rotated, &["pull", &r2, "new", "--json"]);
    assert!(out.ok(), "{out:?}");
    assert_eq!(b.artifact_names(), ["enc", "new", "old"]);
    assert!(files_holding(&registry.dir, SECRET.as_bytes()).is_empty());
    b.assert_nothing_left();
}
