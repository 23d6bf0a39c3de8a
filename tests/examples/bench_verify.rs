//! Benchmark: what verifying every byte of an artifact costs a restore.
//! Side by side in one run, on one private containerd and one artifact
//! (`BENCH_RESIDENT_MB` of engine memory, 1024 by default): restores with
//! `verify_contents = true` (the default: sha256 of every 64 MiB chunk,
//! two threads, before runc runs) and `false` (sizes only), in ABBA order,
//! with a warm page cache and after dropping it (`sync; echo 3 >
//! /proc/sys/vm/drop_caches`, machine-wide). Timed: `ctr run -d` of the
//! restore, which returns once the copy validated and listens; plus the
//! shim's own phases from `vsnap-restore.json`.
//!
//! Run by `scripts/bench.sh verify` (release builds). Environment:
//! BENCH_RUNS (pairs per cache state, default 4), BENCH_RESIDENT_MB.

use std::time::{Duration, Instant};

use vsnap_e2e::bench::{drop_caches, env_num, median};
use vsnap_e2e::cmd::run;
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{setup, Env};

/// One restore with `verify` set in the runtime config; its wall time and
/// the shim's preflight (which holds the verification) and CRIU phases.
fn restore(e: &Env, base: &str, id: &str, resident: &str, verify: bool) -> [f64; 3] {
    std::fs::write(&e.config, format!("{base}verify_contents = {verify}\n")).unwrap();
    let cmd = e.run_command(id, "restore", "big", free_port(), &["--env", resident], &[]);
    let t = Instant::now();
    let out = run(cmd, None, Duration::from_secs(300));
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    assert!(out.ok(), "{id}: {out:?}");
    let timings: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap())
            .unwrap();
    e.remove(id);
    [
        wall,
        timings["preflight_ms"].as_f64().unwrap(),
        timings["criu_restore_ms"].as_f64().unwrap(),
    ]
}

fn main() {
    let runs = env_num("BENCH_RUNS", 4);
    let resident = format!(
        "VSNAP_ENGINE_RESIDENT_MB={}",
        env_num("BENCH_RESIDENT_MB", 1024)
    );
    let e = setup("bench-verify");
    let base = std::fs::read_to_string(&e.config).unwrap();
    eprintln!("bench: creating the artifact ({resident})");
    e.create_good("donor", "big", &[&resident]);
    let bytes: u64 = walk_bytes(&e.artifact("big"));

    println!(
        "artifact: {:.2} GiB under images/, control/, work/",
        bytes as f64 / (1u64 << 30) as f64
    );
    println!();
    println!("| page cache | verify_contents | n | restore wall ms (median) | preflight ms | CRIU restore ms |");
    println!("|---|---|---|---|---|---|");
    let mut n = 0;
    for cold in [false, true] {
        let mut results: [Vec<[f64; 3]>; 2] = [Vec::new(), Vec::new()];
        for i in 0..runs {
            // ABBA: on, off, off, on, ...
            let order = if i % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for verify in order {
                if cold {
                    drop_caches();
                }
                n += 1;
                let r = restore(&e, &base, &format!("r{n}"), &resident, verify);
                results[usize::from(verify)].push(r);
            }
        }
        for verify in [true, false] {
            let rs = &results[usize::from(verify)];
            let col = |k: usize| median(rs.iter().map(|r| r[k]).collect());
            println!(
                "| {} | {verify} | {} | {:.0} | {:.0} | {:.0} |",
                if cold { "cold" } else { "warm" },
                rs.len(),
                col(0),
                col(1),
                col(2)
            );
        }
    }
    std::fs::write(&e.config, base).unwrap();
}

fn walk_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        total += if md.is_dir() {
            walk_bytes(&e.path())
        } else {
            md.len()
        };
    }
    total
}
