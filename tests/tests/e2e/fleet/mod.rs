//! Fleet transport end to end: artifacts captured under one private
//! containerd (host A, its own artifact root and host key) pushed with
//! `vsnap push` to a real registry (docker-registry 2.8 on loopback), pulled
//! with `vsnap pull` into another root (host B) and restored there.
//!
//! Container ids are unique across the tests of this module: runc puts a
//! container in the cgroup `<namespace>/<id>`, the same path for every
//! private containerd, so two parallel tests with one id share a cgroup
//! and removing one kills the other's engine.

mod crypt;
mod disk;
mod harness;
mod mirrors;
mod resume;
mod sealed;
mod stream;

use std::process::Command;
use std::time::Duration;

use harness::{
    fleet, fleet_with, landed, landed_chunks, partial_pulls, unsealed, vsnap, vsnap_json,
};
use serde_json::Value;
use vsnap_e2e::cmd::run;
use vsnap_e2e::containerd::{list, shim_binary};
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, assert_has, poll, Env};

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
    assert_eq!(
        partial_pulls(&b),
        Vec::<String>::new(),
        "nothing of the pull is left beside the artifact"
    );

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
    let (other, _) = a.fleet_key_pair("other");
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
    assert_eq!(landed_chunks(&b), 0, "no chunk fetched");
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
    // What landed before the damaged chunk stays for a resume; the damaged
    // chunk is not among it.
    for name in ["dmg", "other"] {
        assert!(!landed(&b, name).contains(&digest), "{name}");
    }
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
    assert_eq!(landed_chunks(&b), 0, "no chunk fetched");

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
    // The restore streamed from the pull, which publishes once the restore
    // let go of its tree.
    vsnap_e2e::snapshot_env::poll(Duration::from_secs(60), "the pull's publish", || {
        b.manifest("ref").exists()
    });
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
    a.prepend_config("push_created = true\n");
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
