//! A fleet whose artifacts are sealed with the fleet encryption key: no
//! secret in the registry in clear, the key named by id, a key rotated.

use super::harness::{fleet, landed_chunks, vsnap_json, vsnap_with};
use serde_json::Value;
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, assert_has};

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

#[test]
fn an_encrypted_push_leaves_no_secret_in_the_registry_and_restores_on_b() {
    let (a, mut b, registry) = fleet("fleet-enc");
    b.rootfs = a.rootfs.clone();
    let (key, key_id) = a.fleet_encryption_key("fleet-enc");
    let line = format!("fleet_encryption_key = \"{key}\"\n");
    // A keeps its memory images in clear (`seal_at_rest = false`): the
    // scan below must be able to find the secret on A to show it is not
    // in the registry (fleet/sealed.rs shows the sealed case).
    a.prepend_config(&format!("{line}seal_at_rest = false\n"));
    b.prepend_config(&line);
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
    let (other, _) = b.fleet_encryption_key("other-enc");
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
    assert_eq!(landed_chunks(&b), 0, "no chunk fetched");

    // Another key signs the same manifest in the same repository: its
    // signature is added, the fleet's stays, B's pull still trusts it.
    let (rogue, _) = a.fleet_key_pair("rogue");
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
    let (new, new_id) = a.fleet_encryption_key("fleet-enc-2");
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
