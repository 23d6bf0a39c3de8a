//! Zero pages elided: a capture leaves the all-zero pages of the engine's
//! private memory out of its page images (holes in CRIU's pagemap), the
//! manifest and `vsnap inspect` say how much, and a restore, under either
//! page placement, brings the engine back with the same memory: its
//! resident data's checksum and its zero block (present pages holding
//! zeros) checked by the engine's own recovery before it answers.

use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, assert_has, setup};

const MIB: u64 = 1 << 20;
/// Half of the engine's 128 MiB of memory is zero pages.
const ENV: [&str; 2] = ["VSNAP_ENGINE_RESIDENT_MB=64", "VSNAP_ENGINE_ZERO_MB=64"];

fn pages_bytes(manifest: &serde_json::Value) -> u64 {
    manifest["memory"]["pages_bytes"].as_u64().unwrap()
}

#[test]
fn zero_pages_are_left_out_of_the_images_and_come_back_as_zeros() {
    let e = setup("zero-pages");
    let config = std::fs::read_to_string(&e.config).unwrap();
    // The same engine captured without elision: every page stored.
    std::fs::write(&e.config, format!("{config}elide_zero_pages = false\n")).unwrap();
    let full: serde_json::Value =
        serde_json::from_slice(&e.create_good("zp-full-donor", "full", &ENV)).unwrap();
    assert!(full["zero_pages"].is_null(), "nothing elided: {full}");
    std::fs::write(&e.config, &config).unwrap();
    let elided: serde_json::Value =
        serde_json::from_slice(&e.create_good("zp-donor", "zp", &ENV)).unwrap();

    let (with, without) = (pages_bytes(&elided), pages_bytes(&full));
    let gone = elided["zero_pages"]["elided_bytes"].as_u64().unwrap();
    eprintln!("pages bytes: {with} elided, {without} without; {gone} bytes elided");
    assert!(gone >= 64 * MIB, "the zero block is elided: {elided}");
    assert!(without >= 128 * MIB, "without elision every page is stored");
    // The two donors' other memory may differ by a few pages.
    assert!(
        (with + gone).abs_diff(without) < 8 * MIB,
        "the images shrink by what was elided: {with} + {gone} against {without}"
    );
    assert!(
        with * 100 <= without * 55,
        "the pages are about half of what they were: {with} of {without}"
    );
    let shown = e.vsnap(&["inspect", "zp"]);
    assert_eq!(shown.code, Some(0), "{shown:?}");
    assert_has(
        &shown.stdout,
        &[
            "Zero pages:",
            &format!("({gone} bytes) elided ({} pages of 4 KiB", gone / 4096),
        ],
    );

    let cold = HostEngine::start();
    let reference = answers(cold.port);
    let env = ["--env", ENV[0], "--env", ENV[1]];
    for (id, placement) in [("zp-par", ""), ("zp-criu", "page_placement = \"criu\"\n")] {
        std::fs::write(&e.config, format!("{config}{placement}")).unwrap();
        let port = free_port();
        // The engine's recovery checks its resident data and its zero
        // block before the copy is visible: a restore that lost either fails.
        let out = e.run(id, "restore", "zp", port, &env);
        assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
        assert_eq!(answers(port), reference, "{id} answers like a cold start");
        let phases: serde_json::Value = serde_json::from_slice(
            &std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap(),
        )
        .unwrap();
        if placement.is_empty() {
            let placed = phases["pages_placed_bytes"].as_u64().unwrap();
            assert!(
                placed <= with,
                "{id}: only stored pages are copied: {phases}"
            );
        }
        e.remove(id);
    }
    e.assert_nothing_left();
}
