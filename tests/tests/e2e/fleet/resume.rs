//! A pull killed midway, then resumed: what the killed pull left is only
//! what a resume needs (the chunks that landed, at their places, and the
//! record of them), and the resumed pull fetches only the rest, in clear
//! and encrypted.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use super::harness::{fleet, landed, partial_pulls, vsnap, vsnap_command, vsnap_json};
use serde_json::Value;
use vsnap_e2e::containerd::list;
use vsnap_e2e::disk::disk_use;
use vsnap_e2e::registry::{Registry, SlowProxy};
use vsnap_e2e::snapshot_env::poll;

#[test]
fn an_interrupted_pull_resumes_and_fetches_only_what_is_missing() {
    interrupted_pull_resumes("fleet-resume", false);
}

#[test]
fn an_interrupted_encrypted_pull_resumes_and_fetches_only_what_is_missing() {
    interrupted_pull_resumes("fleet-resume-enc", true);
}

fn interrupted_pull_resumes(tag: &str, sealed: bool) {
    let (a, b, registry) = fleet(tag);
    if sealed {
        let (key, _) = a.fleet_encryption_key(&format!("{tag}-key"));
        let line = format!("fleet_encryption_key = \"{key}\"\n");
        a.prepend_config(&line);
        b.prepend_config(&line);
    }
    a.create_good(
        &format!("{tag}-donor"),
        "big",
        &["VSNAP_ENGINE_RESIDENT_MB=96"],
    );
    let r = format!("{}/fleet/big:v1", registry.host());
    let pushed = vsnap_json(&a, &["push", "big", &r]);
    let bytes = pushed["bytes"].as_u64().unwrap();

    // Through a slow link (4 MiB/s per connection), so the pull is still
    // running when the first chunks have landed on B.
    let proxy = SlowProxy::start(registry.port, 4 << 20);
    b.allow_registry(&proxy.host());
    let slow = format!("{}/fleet/big:v1", proxy.host());
    let mut child = vsnap_command(&b, &["pull", &slow])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    poll(Duration::from_secs(120), "a chunk landed on B", || {
        !landed(&b, "big").is_empty()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let kept = landed(&b, "big");
    assert!(!kept.is_empty());
    assert_eq!(
        b.artifact_names(),
        Vec::<String>::new(),
        "nothing published"
    );
    assert_eq!(b.staging_dirs(), Vec::<String>::new());
    // Left: the partial pull of "big" and nothing else, no more on disk
    // than the artifact itself.
    assert_eq!(partial_pulls(&b), ["big"]);
    let mut left = list(&b.artifacts.join(".pull/partial/big"));
    left.sort();
    assert_eq!(left, ["arrived", "digest", "landed", "tree"]);
    let used = disk_use(&b.artifacts.join(".pull"));
    assert!(
        used as f64 <= 1.1 * bytes as f64,
        "the killed pull left {used} bytes for a {bytes}-byte artifact"
    );

    // Give the registry time to log what the killed pull had asked for.
    std::thread::sleep(Duration::from_secs(1));
    let logged = registry.log().len();
    let pulled = vsnap_json(&b, &["pull", &r]);
    let chunks = pulled["chunks"].as_u64().unwrap();
    assert_eq!(
        pulled["reused"].as_u64(),
        Some(kept.len() as u64),
        "{pulled}"
    );
    assert_eq!(
        pulled["fetched"].as_u64(),
        Some(chunks - kept.len() as u64),
        "{pulled}"
    );
    assert!(
        (kept.len() as u64) < chunks,
        "the kill came before the end: {pulled}"
    );
    // The registry's own log: no chunk that had landed was asked for again.
    let asked = blob_gets(&registry, logged);
    let layers = layers(&registry, pushed["digest"].as_str().unwrap());
    let again: Vec<&String> = asked.intersection(&kept).collect();
    assert_eq!(again, Vec::<&String>::new(), "fetched again");
    assert_eq!(
        asked.intersection(&layers).count() as u64,
        chunks - kept.len() as u64,
        "{asked:?}"
    );
    assert!(vsnap(&b, &["verify", "big"]).ok());
    assert_eq!(
        partial_pulls(&b),
        Vec::<String>::new(),
        "no part of the killed pull is left"
    );
}

/// The blob digests the registry's log shows a GET of, from byte `from` of
/// the log on.
fn blob_gets(registry: &Registry, from: usize) -> BTreeSet<String> {
    let log = registry.log();
    log[from..]
        .lines()
        .filter(|l| l.contains("http.request.method=GET"))
        .filter_map(|l| {
            let at = l.find("/blobs/sha256:")? + "/blobs/".len();
            l.get(at..at + 71).map(str::to_string)
        })
        .collect()
}

/// The layer digests of the OCI manifest `digest` in the registry.
fn layers(registry: &Registry, digest: &str) -> BTreeSet<String> {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(registry.blob_file(digest)).unwrap()).unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}
