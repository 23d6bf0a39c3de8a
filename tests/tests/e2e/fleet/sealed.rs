//! Memory images sealed at rest (`seal_at_rest = true`): a secret
//! given in the engine's environment is in no file under the artifact root
//! of the capturing host, nor under that of a host that pulled the
//! artifact, and the pulled copy restores and answers as a cold start
//! does. The same scan of an artifact captured with sealing off finds the
//! secret in its pages: the scan can fail.

use std::path::Path;

use super::harness::{fleet, vsnap, vsnap_json};
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, Env};

/// Every regular file under `root` (symlinks not followed) holding
/// `marker`, relative to `root`.
fn files_holding(root: &Path, marker: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            let path = entry.path();
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(marker.len()).any(|w| w == marker) {
                    let rel = path.strip_prefix(root).unwrap();
                    found.push(rel.display().to_string());
                }
            }
        }
    }
    found.sort();
    found
}

/// `env`'s runtime config with `seal_at_rest` set (read at each create).
fn seal_at_rest(env: &Env, on: bool) {
    let config = std::fs::read_to_string(&env.config).unwrap();
    let kept: String = config
        .lines()
        .filter(|l| !l.starts_with("seal_at_rest"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&env.config, format!("seal_at_rest = {on}\n{kept}")).unwrap();
}

#[test]
fn a_secret_in_the_engines_environment_is_in_no_file_at_rest_on_either_host() {
    let (a, mut b, registry) = fleet("fleet-sealed");
    b.rootfs = a.rootfs.clone();
    let secret = format!("hf_vsnapSealedAtRest{:016x}", rand_u64());
    let token = format!("HF_TOKEN={secret}");

    // Sealing off: the scan finds the secret in the memory images.
    seal_at_rest(&a, false);
    a.create_good("fleet-sealed-clear", "clear", &[&token]);
    let found = files_holding(&a.artifacts, secret.as_bytes());
    assert!(
        found.iter().any(|f| f.starts_with("clear/images/pages-")),
        "the scan finds a secret kept in clear: {found:?}"
    );
    let inspect = vsnap_json(&a, &["inspect", "clear"]);
    assert_eq!(inspect["sealed_at_rest"], false, "{inspect}");
    assert!(vsnap(&a, &["rm", "clear"]).ok());
    assert_eq!(
        files_holding(&a.artifacts, secret.as_bytes()),
        [] as [String; 0]
    );

    // Sealing on: nowhere under A's artifact root.
    seal_at_rest(&a, true);
    seal_at_rest(&b, true);
    a.create_good("fleet-sealed-donor", "sealed", &[&token]);
    let cold = HostEngine::start();
    let reference = answers(cold.port);
    assert_eq!(
        files_holding(&a.artifacts, secret.as_bytes()),
        [] as [String; 0],
        "no plain-text copy on the capturing host"
    );
    let inspect = vsnap_json(&a, &["inspect", "sealed"]);
    assert_eq!(inspect["sealed_at_rest"], true, "{inspect}");
    assert!(
        vsnap(&a, &["verify", "sealed"]).ok(),
        "A verifies it opened"
    );

    // Pushed (a registry's chunks are of the plaintext: B's pull checks
    // them against the digests) and pulled: sealed with B's key.
    let r = format!("{}/fleet/sealed:v1", registry.host());
    vsnap_json(&a, &["push", "sealed", &r]);
    vsnap_json(&b, &["pull", &r]);
    assert_eq!(
        files_holding(&b.artifacts, secret.as_bytes()),
        [] as [String; 0],
        "no plain-text copy on the pulling host"
    );
    let pulled = vsnap_json(&b, &["inspect", "sealed"]);
    assert_eq!(pulled["sealed_at_rest"], true, "{pulled}");
    assert_ne!(
        pulled["manifest"]["sealed"]["salt"], inspect["manifest"]["sealed"]["salt"],
        "each host seals its copy with its own key"
    );
    assert!(
        vsnap(&b, &["verify", "sealed"]).ok(),
        "B verifies it opened"
    );

    // B's copy restores (CRIU's pages opened for it, the rest by the page
    // server) and answers like a cold start.
    let port = free_port();
    let out = b.run(
        "fleet-sealed-copy",
        "restore",
        "sealed",
        port,
        &["--env", &token],
    );
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "B's copy answers like a cold start"
    );
    assert_eq!(
        files_holding(&b.artifacts, secret.as_bytes()),
        [] as [String; 0],
        "nothing opened is left at rest by the restore"
    );
    b.remove("fleet-sealed-copy");
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut b).unwrap();
    u64::from_le_bytes(b)
}
