//! Benchmark: the page server's `huge_pages` policies (issue 34) on a host
//! whose free memory is, or is not, in 2 MiB blocks. One engine whose
//! resident block (BENCH_RESIDENT_MB) is advised `MADV_HUGEPAGE`, captured
//! once on a private containerd, then restored warm under `when-free`,
//! `always` and `never` in turn (the order reversed every other round), on
//! a host as it is and, with BENCH_FRAGMENT=1, after the bench cut the
//! host's free memory up before each restore: it maps memory in 256 MiB
//! slabs, touches every 4 KiB page and gives every other one back, until
//! the free 2 MiB blocks of `/proc/buddyinfo` are at most
//! BENCH_FRAGMENT_BLOCKS (64) or BENCH_FRAGMENT_MAX_MB (all but 2 GiB of
//! the host's available memory: the kernel reclaims page cache for it) is
//! mapped, and holds the other half until the restore ended; the
//! artifact's images are then read again, so the restore finds them in
//! the page cache. Reported per policy and host state: `ctr run -d` to
//! serving, the page server's fill, the bytes placed as huge pages and
//! declined, the free blocks the server read, the kernel's compaction and
//! direct-reclaim stalls during the restore (`compact_stall` and
//! `allocstall_*` of `/proc/vmstat`), and the
//! block's `AnonHugePages` right after. Run by `scripts/bench.sh
//! huge-pages` (release builds). Environment: BENCH_RUNS (rounds, 3),
//! BENCH_RESIDENT_MB (1024), BENCH_FRAGMENT (0).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, median};
use vsnap_e2e::engine::free_port;
use vsnap_e2e::smaps;
use vsnap_e2e::snapshot_env::{setup, Env};

const MIB: u64 = 1 << 20;
const POLICIES: [&str; 3] = ["when-free", "always", "never"];

/// One restore's numbers.
struct Restore {
    serving_s: f64,
    fill_ms: f64,
    huge: u64,
    declined: u64,
    free_blocks: Option<u64>,
    /// Compaction and direct-reclaim stalls during the restore.
    stalls: [u64; 2],
    anon_huge: u64,
}

/// The free 2 MiB blocks of every zone (orders 9 and up), as the page
/// server counts them.
fn free_blocks() -> u64 {
    vsnap_host::buddyinfo::free_huge_blocks().expect("/proc/buddyinfo")
}

/// The sum of `/proc/vmstat`'s counters whose names start with `prefix`.
fn vmstat(prefix: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The kernel's stalls while a restore ran: compaction, direct reclaim.
fn stalls() -> [u64; 2] {
    [vmstat("compact_stall"), vmstat("allocstall_")]
}

fn mem_available_mb() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        / 1024
}

/// Memory mapped by the bench with every other 4 KiB page given back:
/// the host's free memory in 4 KiB pieces while it is held.
struct Fragments(Vec<(*mut libc::c_void, usize)>);

impl Fragments {
    fn cut(max_mb: u64, blocks: u64) -> Self {
        const SLAB: usize = 256 << 20;
        let mut slabs = Vec::new();
        while free_blocks() > blocks && (slabs.len() * SLAB) as u64 / MIB < max_mb {
            // SAFETY: an anonymous private mapping of our own, used only here.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    SLAB,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "mmap");
            // SAFETY: within the mapping just made.
            unsafe {
                libc::madvise(p, SLAB, libc::MADV_NOHUGEPAGE);
                let base = p as *mut u8;
                for i in (0..SLAB).step_by(4096) {
                    base.add(i).write_volatile(1);
                }
                for i in (0..SLAB).step_by(8192) {
                    libc::madvise(base.add(i) as *mut libc::c_void, 4096, libc::MADV_DONTNEED);
                }
            }
            slabs.push((p, SLAB));
        }
        Fragments(slabs)
    }

    fn held_mb(&self) -> u64 {
        self.0.iter().map(|s| s.1 as u64).sum::<u64>() / 2 / MIB
    }
}

impl Drop for Fragments {
    fn drop(&mut self) {
        for &(p, len) in &self.0 {
            // SAFETY: our own mappings, unmapped once.
            unsafe { libc::munmap(p, len) };
        }
    }
}

/// `AnonHugePages` of pid's largest VMA advised `MADV_HUGEPAGE`.
fn anon_huge(pid: i32) -> u64 {
    smaps::read(pid)
        .into_iter()
        .filter(|v| v.advised)
        .max_by_key(|v| v.end - v.start)
        .map_or(0, |v| v.huge)
}

/// Reads the artifact's files, so that a restore finds them cached.
fn warm(e: &Env) {
    let dir = e.artifact("huge").join("images");
    for f in std::fs::read_dir(&dir).unwrap() {
        std::fs::read(f.unwrap().path()).unwrap();
    }
}

fn restore(e: &Env, id: &str, env: &[&str]) -> Restore {
    let port = free_port();
    let before = stalls();
    let t = Instant::now();
    let out = e.run(id, "restore", "huge", port, env);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(300), "{id} listening");
        std::thread::sleep(Duration::from_millis(5));
    }
    let serving_s = t.elapsed().as_secs_f64();
    let after = stalls();
    let stalls = [after[0] - before[0], after[1] - before[1]];
    let anon_huge = anon_huge(e.c.task_pid("default", id));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap())
            .unwrap();
    e.remove(id);
    Restore {
        serving_s,
        fill_ms: json["page_fill_ms"].as_f64().unwrap_or(f64::NAN),
        huge: json["pages_huge_bytes"].as_u64().unwrap_or(0),
        declined: json["pages_huge_declined_bytes"].as_u64().unwrap_or(0),
        free_blocks: json["pages_huge_free_blocks"].as_u64(),
        stalls,
        anon_huge,
    }
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3) as usize;
    let mb = env_num("BENCH_RESIDENT_MB", 1024);
    let fragment = env_num("BENCH_FRAGMENT", 0) == 1;
    let blocks = env_num("BENCH_FRAGMENT_BLOCKS", 64);
    let max_mb = env_num(
        "BENCH_FRAGMENT_MAX_MB",
        mem_available_mb().saturating_sub(2048),
    );
    let e = setup("bench-huge");
    let config = std::fs::read_to_string(&e.config).unwrap();
    let (resident, advised) = (
        format!("VSNAP_ENGINE_RESIDENT_MB={mb}"),
        "VSNAP_ENGINE_RESIDENT_HUGE=1".to_string(),
    );
    e.create_good("donor", "huge", &[&resident, &advised]);
    let env = ["--env", resident.as_str(), "--env", advised.as_str()];
    let states: &[bool] = if fragment { &[false, true] } else { &[false] };
    let mut results: Vec<(bool, &str, Vec<Restore>)> = Vec::new();
    for &cut in states {
        for p in POLICIES {
            results.push((cut, p, Vec::new()));
        }
    }
    let mut held = Vec::new();
    let mut n = 0;
    for round in 0..runs {
        let mut order: Vec<usize> = (0..results.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let (cut, policy) = (results[k].0, results[k].1);
            n += 1;
            let id = format!("h{n}");
            std::fs::write(&e.config, format!("{config}huge_pages = \"{policy}\"\n")).unwrap();
            let frags = cut.then(|| Fragments::cut(max_mb, blocks));
            if let Some(f) = &frags {
                held.push(f.held_mb());
                warm(&e);
            }
            eprintln!(
                "bench: {id}: {policy}, {}; free 2 MiB blocks {}",
                if cut { "memory cut up" } else { "as it is" },
                free_blocks()
            );
            let r = restore(&e, &id, &env);
            drop(frags);
            results[k].2.push(r);
        }
    }
    std::fs::write(&e.config, &config).unwrap();
    report(mb, runs, &held, &results);
}

fn report(mb: u64, runs: usize, held: &[u64], results: &[(bool, &str, Vec<Restore>)]) {
    println!("### `huge_pages` ({mb} MiB advised `MADV_HUGEPAGE`; {runs} warm restores of each)");
    println!();
    if !held.is_empty() {
        println!(
            "Memory cut up: the bench held {} MiB (median) in every other 4 KiB page during each such restore.",
            median(held.iter().map(|&h| h as f64).collect())
        );
        println!();
    }
    println!("| host | `huge_pages` | to serving (median s) | page fill (ms, each) | placed huge (MiB) | declined (MiB) | free 2 MiB blocks read | stalls: compaction / direct reclaim | `AnonHugePages` after (MiB) |");
    println!("|---|---|---:|---|---:|---:|---|---|---:|");
    for (cut, policy, rs) in results {
        let each = |f: &dyn Fn(&Restore) -> String| rs.iter().map(f).collect::<Vec<_>>().join(", ");
        println!(
            "| {} | `{policy}` | {:.2} | {} | {:.0} | {:.0} | {} | {} | {:.0} |",
            if *cut { "memory cut up" } else { "as it is" },
            median(rs.iter().map(|r| r.serving_s).collect()),
            each(&|r| format!("{:.0}", r.fill_ms)),
            median(rs.iter().map(|r| r.huge as f64).collect()) / MIB as f64,
            median(rs.iter().map(|r| r.declined as f64).collect()) / MIB as f64,
            each(&|r| r.free_blocks.map_or("-".into(), |b| b.to_string())),
            each(&|r| format!("{}/{}", r.stalls[0], r.stalls[1])),
            median(rs.iter().map(|r| r.anon_huge as f64).collect()) / MIB as f64,
        );
    }
}
