//! What a pull costs in disk: the peak of the pulling host's artifact root
//! (staging files, whatever a pull keeps to resume, the published
//! artifact), sampled every 50 ms while `vsnap pull` runs, against the
//! artifact's size, in clear and encrypted.

use std::time::Duration;

use super::harness::{fleet, vsnap, vsnap_json, vsnap_with};
use vsnap_e2e::disk::{disk_use, DiskPeak};

/// Most disk a pull may take beyond what the root held before it, as a
/// multiple of the artifact's bytes.
const MOST: f64 = 1.1;

#[test]
fn a_pull_takes_at_most_1_1x_the_artifact_on_disk_in_clear_and_encrypted() {
    let (a, b, registry) = fleet("fleet-disk");
    let (key, _) = a.fleet_encryption_key("fleet-disk-enc");
    let sealing = format!("fleet_encryption_key = \"{key}\"\n");
    a.create_good(
        "fleet-disk-donor",
        "disk",
        &["VSNAP_ENGINE_RESIDENT_MB=384"],
    );
    let host = registry.host();
    let clear = format!("{host}/fleet/disk:clear");
    let sealed = format!("{host}/fleet/disk:sealed");
    vsnap_json(&a, &["push", "disk", &clear]);
    let out = vsnap_with(
        &a,
        "sealing",
        &sealing,
        &["push", "disk", &sealed, "--json"],
    );
    assert!(out.ok(), "{out:?}");
    // B holds the key: it pulls both (one in clear needs none).
    b.prepend_config(&sealing);

    let mut measured = Vec::new();
    for (what, r) in [("clear", &clear), ("encrypted", &sealed)] {
        let before = disk_use(&b.artifacts);
        let peak = DiskPeak::start(&b.artifacts, Duration::from_millis(50));
        let pulled = vsnap_json(&b, &["pull", r, "disk"]);
        let (peak, samples) = peak.stop();
        let bytes = pulled["bytes"].as_u64().unwrap();
        let after = disk_use(&b.artifacts);
        let ratio = peak.saturating_sub(before) as f64 / bytes as f64;
        eprintln!(
            "{what}: artifact {bytes} bytes; root {before} before, peak {peak} ({samples} samples), {after} after: peak {ratio:.3}x the artifact; {pulled}"
        );
        assert!(
            samples >= 10,
            "{what}: the pull was sampled {samples} times"
        );
        assert!(
            after.saturating_sub(before) as f64 >= 0.95 * bytes as f64,
            "{what}: the published artifact takes its bytes on disk"
        );
        measured.push((what, ratio));
        assert!(vsnap(&b, &["verify", "disk"]).ok());
        assert!(vsnap(&b, &["rm", "disk"]).ok());
    }
    for (what, ratio) in measured {
        assert!(
            ratio <= MOST,
            "{what}: a pull took {ratio:.3}x the artifact's bytes on disk at its peak (at most {MOST}x)"
        );
    }
}
