//! Benchmark: `vsnap pull` from a loopback registry against a raw copy of
//! the same bytes, side by side in one run. One private containerd (host A)
//! captures the reference engine with `BENCH_RESIDENT_MB` of memory (512 by
//! default), `vsnap push` sends it to a docker-registry 2.8 on 127.0.0.1;
//! then, per run, B pulls it (HTTP, sha256 of every chunk while it
//! streams, each written once into its place in the files, the BLAKE3
//! content check, fsync and publish) and `cat` copies the registry's stored chunk files (the same
//! bytes) into one file followed by `sync` of that file, and 4 parallel
//! `curl`s fetch the same chunks to /dev/null, twice: one `curl` per chunk
//! (`xargs -P4`: a new process and connection each), and 4 `curl`s each
//! fetching every 4th chunk over one kept-alive connection, as the pull's 4
//! connections do (order pull, cat, curls per chunk, curls per connection
//! in even runs, the reverse in odd ones). Page cache warm for
//! both (the registry's files were just written or read). Each pull's peak
//! disk use is sampled every 50 ms (B's artifact root, as `du` counts it:
//! what the pull keeps to resume, its files, the published artifact).
//!
//! Run by `scripts/bench.sh fleet` (release builds). Environment:
//! BENCH_RUNS (pairs, default 3), BENCH_RESIDENT_MB, BENCH_LINK_MBPS: when
//! set, the pulls and the curls go through a proxy that serves each
//! connection at most that many MB/s divided by 4 (both use 4
//! connections: a registry behind a link of that speed, as `fleet-crypt`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, median, vsnap_json};
use vsnap_e2e::disk::{disk_use, DiskPeak};
use vsnap_e2e::registry::{Registry, SlowProxy};
use vsnap_e2e::snapshot_env::{setup, Env};

fn vsnap(env: &Env, args: &[&str]) -> serde_json::Value {
    vsnap_json(Path::new(&env.config), args)
}

/// Both hosts know the registry and the link (plain HTTP); A signs, B
/// trusts A's key, as in a fleet.
fn configure(a: &Env, b: &Env, hosts: [String; 2]) {
    for e in [a, b] {
        for host in &hosts {
            e.allow_registry(host);
        }
    }
    let (private, public) = a.fleet_key_pair("k");
    a.prepend_config(&format!("fleet_signing_key = \"{private}\"\n"));
    b.prepend_config(&format!("fleet_trusted_keys = [\"{public}\"]\n"));
}

/// The registry's chunk files: what a raw copy reads.
fn blob_files(registry: &Registry) -> Vec<String> {
    std::fs::read_dir(registry.dir.join("data/docker/registry/v2/blobs/sha256"))
        .unwrap()
        .flatten()
        .flat_map(|p| std::fs::read_dir(p.path()).unwrap().flatten())
        .map(|d| d.path().join("data").display().to_string())
        .collect()
}

/// The same chunks over HTTP from `host`, 4 at a time, into /dev/null:
/// what the registry and the link allow, with no hashing or writing on the
/// client's side. (The two manifests are stored as blobs too but served
/// only as manifests: their 404s are expected.)
/// Returns (one curl per chunk, 4 at a time; 4 curls, one connection each).
fn curl_scripts(blobs: &[String], host: &str) -> (String, String) {
    let urls: Vec<String> = blobs
        .iter()
        .map(|p| {
            let hex = Path::new(p).parent().unwrap().file_name().unwrap();
            format!(
                "http://{host}/v2/bench/big/blobs/sha256:{}",
                hex.to_string_lossy()
            )
        })
        .collect();
    let per_chunk = format!(
        "printf '%s\\n' {} | xargs -P4 -n1 curl -s -o /dev/null -w \"%{{http_code}} \"",
        urls.join(" ")
    );
    let mut per_connection = String::new();
    for g in 0..4 {
        per_connection.push_str("curl -s -w '%{http_code} '");
        for u in urls.iter().skip(g).step_by(4) {
            per_connection.push_str(&format!(" -o /dev/null {u}"));
        }
        per_connection.push_str(" & ");
    }
    per_connection.push_str("wait");
    (per_chunk, per_connection)
}

/// Seconds of `sh -c script`; its stdout.
fn timed_sh(script: &str) -> (f64, String) {
    let t = Instant::now();
    let out = Command::new("sh").args(["-c", script]).output().unwrap();
    let s = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{script:.200}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (s, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every run's seconds (and the pulls' peak disk over the artifact).
#[derive(Default)]
struct Runs {
    pulls: Vec<f64>,
    copies: Vec<f64>,
    curls: Vec<f64>,
    /// 4 curls, one connection each.
    kept: Vec<f64>,
    peaks: Vec<f64>,
}

/// One run: the pull of `r` on `b`, the raw copy, the curls, in the order
/// of the module's header.
fn one_run(
    b: &Env,
    i: u64,
    (r, bytes): (&str, u64),
    blobs: &[String],
    curls: &(String, String),
    runs: &mut Runs,
) {
    let copy_to = b.c.dir.join("raw-copy").display().to_string();
    let steps = if i.is_multiple_of(2) {
        [0, 1, 2, 3]
    } else {
        [3, 2, 1, 0]
    };
    for step in steps {
        match step {
            0 => {
                let name = format!("p{i}");
                let before = disk_use(&b.artifacts);
                let peak = DiskPeak::start(&b.artifacts, Duration::from_millis(50));
                let t = Instant::now();
                let pulled = vsnap(b, &["pull", r, &name]);
                runs.pulls.push(t.elapsed().as_secs_f64());
                let (peak, _) = peak.stop();
                runs.peaks
                    .push(peak.saturating_sub(before) as f64 / bytes as f64);
                assert_eq!(pulled["reused"], 0, "{pulled}");
                eprintln!("pull {i}: {}", pulled["timings_ms"]);
                vsnap(b, &["rm", &name]);
            }
            1 => {
                let script = format!("cat {} > {copy_to} && sync {copy_to}", blobs.join(" "));
                runs.copies.push(timed_sh(&script).0);
                std::fs::remove_file(&copy_to).unwrap();
            }
            _ => {
                let script = if step == 2 { &curls.0 } else { &curls.1 };
                let (s, codes) = timed_sh(script);
                let codes: Vec<&str> = codes.split_whitespace().collect();
                assert!(
                    codes.len() == blobs.len() && codes.iter().all(|c| *c == "200" || *c == "404"),
                    "curl: {codes:?}"
                );
                if step == 2 {
                    runs.curls.push(s)
                } else {
                    runs.kept.push(s)
                }
            }
        }
    }
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = env_num("BENCH_RESIDENT_MB", 512);
    let a = setup("bench-fleet-a");
    let b = setup("bench-fleet-b");
    let registry = Registry::start(&a.c.dir);
    let link = vsnap_e2e::bench::link(&registry);
    let pull_host = link.as_ref().map_or(registry.host(), SlowProxy::host);
    configure(&a, &b, [registry.host(), pull_host.clone()]);

    let env = format!("VSNAP_ENGINE_RESIDENT_MB={resident}");
    a.create_good("donor", "big", &[&env]);
    let r = format!("{}/bench/big:v1", registry.host());
    let t = Instant::now();
    let pushed = vsnap(&a, &["push", "big", &r]);
    let push_s = t.elapsed().as_secs_f64();
    let bytes = pushed["bytes"].as_u64().unwrap();
    eprintln!("pushed {bytes} bytes in {push_s:.2} s: {pushed}");

    let blobs = blob_files(&registry);
    let curls = curl_scripts(&blobs, &pull_host);
    let r = r.replace(&registry.host(), &pull_host);
    let mut all = Runs::default();
    for i in 0..runs {
        one_run(&b, i, (&r, bytes), &blobs, &curls, &mut all);
    }
    report(&all, &pushed, push_s, runs);
}

fn report(all: &Runs, pushed: &serde_json::Value, push_s: f64, runs: u64) {
    let mb = pushed["bytes"].as_u64().unwrap() as f64 / (1 << 20) as f64;
    if let Ok(l) = std::env::var("BENCH_LINK_MBPS") {
        println!("Pulls and curls through a link of {l} MB/s (4 connections share it).");
        println!();
    }
    println!(
        "| {mb:.0} MiB artifact, {} chunks ({} distinct) | median of {runs} | MiB/s |",
        pushed["chunks"], pushed["unique_chunks"]
    );
    println!("|---|---|---|");
    let (p, c) = (median(all.pulls.clone()), median(all.copies.clone()));
    println!(
        "| `vsnap pull` (loopback registry, 4 parallel) | {p:.2} s | {:.0} |",
        mb / p
    );
    println!(
        "| `cat` of the registry's chunk files + `sync` | {c:.2} s | {:.0} |",
        mb / c
    );
    println!("| pull / raw copy | {:.2}x | |", p / c);
    println!(
        "| peak disk of the pull (B's artifact root, sampled every 50 ms) / artifact | {:.3}x | |",
        median(all.peaks.clone())
    );
    let h = median(all.curls.clone());
    println!(
        "| `curl` of every chunk from the registry to /dev/null, 4 parallel | {h:.2} s | {:.0} |",
        mb / h
    );
    let k = median(all.kept.clone());
    println!(
        "| `curl` of every chunk to /dev/null, 4 processes, one kept-alive connection each | {k:.2} s | {:.0} |",
        mb / k
    );
    let kept: Vec<f64> = all
        .pulls
        .iter()
        .zip(&all.kept)
        .map(|(p, c)| p / c)
        .collect();
    println!(
        "| pull time / kept-alive curls' time, median of each run's ratio | {:.2}x | |",
        median(kept.clone())
    );
    let paired: Vec<f64> = all
        .pulls
        .iter()
        .zip(&all.curls)
        .map(|(p, c)| p / c)
        .collect();
    println!(
        "| pull time / curl time, median of each run's ratio | {:.2}x | |",
        median(paired.clone())
    );
    println!(
        "| `vsnap push` (first, every chunk sent) | {push_s:.2} s | {:.0} |",
        mb / push_s
    );
    println!();
    println!(
        "pull s: {:.2?}; curl s: {:.2?}; kept-alive curl s: {:.2?}; cat + sync s: {:.2?}; pull / curl per run: {paired:.3?}; pull / kept-alive curl per run: {kept:.3?}; peak disk: {:.3?}",
        all.pulls, all.curls, all.kept, all.copies, all.peaks
    );
}
