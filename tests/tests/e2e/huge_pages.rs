//! Huge pages at restore: an engine whose resident memory is advised
//! `MADV_HUGEPAGE` (`VSNAP_ENGINE_RESIDENT_HUGE=1`) is captured and
//! restored; the restored engine's resident block is backed by huge pages
//! (smaps `AnonHugePages`), as the cold start's was, while no VMA that was
//! not eligible has any; the engine's own checksum of the block passes and
//! it answers like a cold start (docs/page-server.md, "Huge pages").

use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, setup};

const MIB: u64 = 1 << 20;
const RESIDENT_MB: u64 = 256;

/// One VMA of /proc/<pid>/smaps: bounds, `AnonHugePages` in bytes, and
/// whether its `VmFlags` hold `hg` (advised `MADV_HUGEPAGE`).
struct Vma {
    start: u64,
    end: u64,
    huge: u64,
    advised: bool,
}

fn smaps(pid: i32) -> Vec<Vma> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                out.push(Vma {
                    start,
                    end,
                    huge: 0,
                    advised: false,
                });
                continue;
            }
        }
        let Some(v) = out.last_mut() else { continue };
        if let Some(kb) = line.strip_prefix("AnonHugePages:") {
            v.huge = kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            v.advised = flags.split_whitespace().any(|f| f == "hg");
        }
    }
    out
}

#[test]
fn a_madv_hugepage_region_comes_back_as_huge_pages_and_an_ineligible_one_does_not() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap();
    assert!(
        !thp.contains("[never]"),
        "this test needs THP in `madvise` or `always` mode: {thp}"
    );
    let e = setup("huge-pages");
    let reference = answers(HostEngine::start().port);
    let env = [
        format!("VSNAP_ENGINE_RESIDENT_MB={RESIDENT_MB}"),
        "VSNAP_ENGINE_RESIDENT_HUGE=1".to_string(),
    ];
    e.create_good("huge0", "huge", &[&env[0], &env[1]]);
    let port = free_port();
    let out = e.run(
        "huge1",
        "restore",
        "huge",
        port,
        &["--env", &env[0], "--env", &env[1]],
    );
    assert!(out.ok(), "huge1: {out:?}\n{}", e.c.log_tail());
    // Activation passed: the engine recomputed the block's checksum.
    assert_eq!(answers(port), reference, "huge1 answers like a cold start");
    let pid = e.c.task_pid("default", "huge1");
    let vmas = smaps(pid);
    let block = vmas
        .iter()
        .find(|v| v.advised && v.end - v.start >= RESIDENT_MB * MIB)
        .unwrap_or_else(|| panic!("no advised VMA of {RESIDENT_MB} MiB in pid {pid}"));
    eprintln!(
        "huge1: resident block {:#x}-{:#x}: {} of {} MiB huge",
        block.start,
        block.end,
        block.huge / MIB,
        (block.end - block.start) / MIB
    );
    assert!(
        block.huge * 10 >= (block.end - block.start) * 9,
        "at least 90 % of the advised block is huge pages: {} of {} bytes",
        block.huge,
        block.end - block.start
    );
    let elsewhere: Vec<String> = vmas
        .iter()
        .filter(|v| !v.advised && v.huge > 0)
        .map(|v| format!("{:#x}-{:#x}: {} bytes", v.start, v.end, v.huge))
        .collect();
    assert!(
        elsewhere.is_empty() || thp.contains("[always]"),
        "VMAs that were not eligible hold no huge pages: {elsewhere:?}"
    );
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(e.bundle("huge1").join("vsnap-restore.json")).unwrap(),
    )
    .unwrap();
    let eligible = record["pages_huge_eligible_bytes"].as_u64().unwrap_or(0);
    assert!(
        eligible >= RESIDENT_MB * MIB,
        "the page server wrote the advised block through the kernel's fault path: {record}"
    );
    e.remove("huge1");
    e.assert_nothing_left();
}
