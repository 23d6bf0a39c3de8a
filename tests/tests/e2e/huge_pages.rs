//! Huge pages at restore: an engine whose resident memory is advised
//! `MADV_HUGEPAGE` (`VSNAP_ENGINE_RESIDENT_HUGE=1`) is captured and
//! restored; the restored engine's resident block is backed by huge pages
//! (smaps `AnonHugePages`), as the cold start's was, while no VMA that was
//! not eligible has any; the engine's own checksum of the block passes and
//! it answers like a cold start (docs/page-server.md, "Huge pages").

use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::smaps::{self, Vma};
use vsnap_e2e::snapshot_env::{answers, setup, Env};

const MIB: u64 = 1 << 20;
const RESIDENT_MB: u64 = 256;

type Answers = Vec<(serde_json::Value, serde_json::Value, serde_json::Value)>;

/// The restored copy `id`'s advised resident block and its record.
struct Restored {
    block: Vma,
    elsewhere: Vec<String>,
    record: serde_json::Value,
}

/// Restores `huge` as `id` under the runtime config `config` plus
/// `huge_pages = "<policy>"`, checks it answers like the cold start, and
/// reads its advised block and its `vsnap-restore.json`.
fn restore(e: &Env, config: &str, id: &str, policy: &str, reference: &Answers) -> Restored {
    std::fs::write(&e.config, format!("{config}huge_pages = \"{policy}\"\n")).unwrap();
    let port = free_port();
    let env = engine_env();
    let out = e.run(
        id,
        "restore",
        "huge",
        port,
        &["--env", &env[0], "--env", &env[1]],
    );
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    // Activation passed: the engine recomputed the block's checksum.
    assert_eq!(&answers(port), reference, "{id} answers like a cold start");
    let pid = e.c.task_pid("default", id);
    let vmas = smaps::read(pid);
    let elsewhere = vmas
        .iter()
        .filter(|v| !v.advised && v.huge > 0)
        .map(|v| format!("{:#x}-{:#x}: {} bytes", v.start, v.end, v.huge))
        .collect();
    let block = vmas
        .into_iter()
        .find(|v| v.advised && v.end - v.start >= RESIDENT_MB * MIB)
        .unwrap_or_else(|| panic!("{id}: no advised VMA of {RESIDENT_MB} MiB in pid {pid}"));
    eprintln!(
        "{id}: resident block {:#x}-{:#x}: {} of {} MiB huge",
        block.start,
        block.end,
        block.huge / MIB,
        (block.end - block.start) / MIB
    );
    let record =
        serde_json::from_slice(&std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap())
            .unwrap();
    Restored {
        block,
        elsewhere,
        record,
    }
}

fn bytes(record: &serde_json::Value, key: &str) -> u64 {
    record[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {record}"))
}

/// The engine's environment: a resident block of `RESIDENT_MB`, advised.
fn engine_env() -> [String; 2] {
    [
        format!("VSNAP_ENGINE_RESIDENT_MB={RESIDENT_MB}"),
        "VSNAP_ENGINE_RESIDENT_HUGE=1".to_string(),
    ]
}

#[test]
fn a_madv_hugepage_region_comes_back_as_huge_pages_and_an_ineligible_one_does_not() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap();
    assert!(
        !thp.contains("[never]"),
        "this test needs THP in `madvise` or `always` mode: {thp}"
    );
    let e = setup("huge-pages");
    let config = std::fs::read_to_string(&e.config).unwrap();
    let reference = answers(HostEngine::start().port);
    let env = engine_env();
    e.create_good("huge0", "huge", &[&env[0], &env[1]]);

    // `always`: the whole advised block through the kernel's fault path.
    let r = restore(&e, &config, "huge1", "always", &reference);
    let size_of = |r: &Restored| r.block.end - r.block.start;
    assert!(
        r.block.huge * 10 >= size_of(&r) * 9,
        "at least 90 % of the advised block is huge pages: {} of {} bytes",
        r.block.huge,
        size_of(&r)
    );
    assert!(
        r.elsewhere.is_empty() || thp.contains("[always]"),
        "VMAs that were not eligible hold no huge pages: {:?}",
        r.elsewhere
    );
    let eligible = bytes(&r.record, "pages_huge_eligible_bytes");
    assert!(
        eligible >= RESIDENT_MB * MIB,
        "the advised block is eligible: {}",
        r.record
    );
    assert_eq!(
        (
            bytes(&r.record, "pages_huge_bytes"),
            bytes(&r.record, "pages_huge_declined_bytes")
        ),
        (eligible, 0),
        "the page server wrote all of it through the kernel's fault path: {}",
        r.record
    );
    e.remove("huge1");

    // `never`: copied in 4 KiB pages (khugepaged may collapse a few of
    // them since, at its own pace: 16 MiB per 10 s by default).
    let r = restore(&e, &config, "huge2", "never", &reference);
    assert_eq!(
        (
            bytes(&r.record, "pages_huge_bytes"),
            bytes(&r.record, "pages_huge_declined_bytes")
        ),
        (0, eligible),
        "{}",
        r.record
    );
    assert!(
        r.block.huge * 2 < size_of(&r),
        "the block was placed in 4 KiB pages: {} of {} bytes huge",
        r.block.huge,
        size_of(&r)
    );
    e.remove("huge2");

    // `when-free` (the default): huge while the free 2 MiB blocks counted
    // when the server chose covered the block, else 4 KiB pages.
    let r = restore(&e, &config, "huge3", "when-free", &reference);
    let free = bytes(&r.record, "pages_huge_free_blocks");
    let (huge, declined) = (
        bytes(&r.record, "pages_huge_bytes"),
        bytes(&r.record, "pages_huge_declined_bytes"),
    );
    assert_eq!(huge + declined, eligible, "{}", r.record);
    if free >= eligible.div_ceil(2 * MIB) {
        assert_eq!(declined, 0, "the free blocks covered it: {}", r.record);
    } else {
        assert_eq!(huge, 0, "the free blocks did not cover it: {}", r.record);
    }
    e.remove("huge3");
    e.assert_nothing_left();
}
