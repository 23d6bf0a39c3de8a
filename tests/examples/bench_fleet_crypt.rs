//! Benchmark: `vsnap push` and `vsnap pull` of one artifact in clear and
//! encrypted (fleet_encryption_key), side by side in one run, and what
//! bounds the encrypted pull. One private containerd (host A) captures the
//! reference engine with `BENCH_RESIDENT_MB` of memory (512 by default);
//! each run pushes it to a fresh repository of a docker-registry 2.8 on
//! 127.0.0.1 in clear and encrypted (every chunk sent each time), then B
//! pulls both (order alternating between runs). Beside them, in this
//! process on one core: ChaCha20-Poly1305 sealing and opening of 2 MiB
//! chunks (the transport's own code, registry/src/crypt.rs), and the
//! sha256 every layer is checked with. Each pull's peak disk use is sampled
//! every 50 ms (B's artifact root, as `du` counts it).
//!
//! Run by `scripts/bench.sh fleet-crypt` (release builds). Environment:
//! BENCH_RUNS (default 3), BENCH_RESIDENT_MB, BENCH_LINK_MBPS: when set,
//! B pulls through a proxy that serves each connection at most that many
//! MB/s divided by the pull's 4 connections (a registry behind a link of
//! that speed; 125 for 1 Gbit/s), so the pull's bound is the link, as on
//! a host whose registry is across a network and not on its own cores.

use std::path::Path;
use std::time::{Duration, Instant};

use vsnap_artifact::encryption::EncryptionKey;
use vsnap_e2e::bench::{env_num, median, vsnap_json};
use vsnap_e2e::disk::{disk_use, DiskPeak};
use vsnap_e2e::registry::{Registry, SlowProxy};
use vsnap_e2e::snapshot_env::{setup, Env};
use vsnap_registry::crypt::Sealer;

fn vsnap(config: &str, args: &[&str]) -> serde_json::Value {
    vsnap_json(Path::new(config), args)
}

/// `lines` first in `env`'s runtime config.
/// MiB/s of `f` over `bytes`, best of 3.
fn rate(bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / (1 << 20) as f64 / best
}

/// One core: seal, open, sha256 of 128 MiB in 2 MiB chunks, and the keyed
/// BLAKE3 id alone (MiB/s).
fn per_core() -> (f64, f64, f64, f64) {
    let sealer = Sealer::new(&EncryptionKey::from_secret([0x42; 32]));
    let mut x = 7u64;
    let chunks: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            (0..2 << 20)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect();
    let total = 64 * (2 << 20);
    let sealed: Vec<Vec<u8>> = chunks.iter().map(|c| sealer.seal(c)).collect();
    let seal = rate(total, || {
        for c in &chunks {
            std::hint::black_box(sealer.seal(c));
        }
    });
    let open = rate(total, || {
        for s in &sealed {
            std::hint::black_box(sealer.open(s.clone()).unwrap());
        }
    });
    let sha = rate(total, || {
        for s in &sealed {
            std::hint::black_box(vsnap_registry::sha256_digest(s));
        }
    });
    let id = rate(total, || {
        for c in &chunks {
            std::hint::black_box(blake3::keyed_hash(&[1; 32], c));
        }
    });
    (seal, open, sha, id)
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = env_num("BENCH_RESIDENT_MB", 512);
    let a = setup("bench-crypt-a");
    let b = setup("bench-crypt-b");
    let registry = Registry::start(&a.c.dir);
    // Pulls go through a link of BENCH_LINK_MBPS when it is set (4
    // connections share it: the pull's --jobs).
    let link = vsnap_e2e::bench::link(&registry);
    let pull_host = link.as_ref().map_or(registry.host(), SlowProxy::host);
    for e in [&a, &b] {
        e.allow_registry(&registry.host());
        e.allow_registry(&pull_host);
    }
    let (private, public) = a.fleet_key_pair("k");
    let (enc, _) = a.fleet_encryption_key("enc");
    a.prepend_config(&format!("fleet_signing_key = \"{private}\"\n"));
    b.prepend_config(&format!("fleet_trusted_keys = [\"{public}\"]\n"));
    let enc_line = format!("fleet_encryption_key = \"{enc}\"\n");
    let clear = [a.config.clone(), b.config.clone()];
    let sealed = [
        a.config_variant("enc-config", &enc_line),
        b.config_variant("enc-config", &enc_line),
    ];

    let env = format!("VSNAP_ENGINE_RESIDENT_MB={resident}");
    a.create_good("donor", "big", &[&env]);
    let mut all = Runs::default();
    for i in 0..runs {
        let order: [usize; 2] = if i.is_multiple_of(2) { [0, 1] } else { [1, 0] };
        for mode in order {
            let configs = if mode == 0 { &clear } else { &sealed };
            let hosts = (registry.host(), pull_host.clone());
            one_mode(&b, configs, &hosts, (i, mode), &mut all);
        }
    }
    report(&all, runs);
}

/// Every run's numbers: (push, pull) seconds per mode; the pulls' phases
/// and peak disk over the artifact's bytes per mode.
#[derive(Default)]
struct Runs {
    bytes: u64,
    chunks: u64,
    times: [(Vec<f64>, Vec<f64>); 2],
    peaks: [Vec<f64>; 2],
    phases: [Vec<String>; 2],
}

/// Run `i` of `mode` (0 in clear, 1 encrypted): A pushes to a fresh
/// repository (`hosts.0`), B pulls it (through `hosts.1`) and removes it.
fn one_mode(
    b: &Env,
    [ca, cb]: &[String; 2],
    hosts: &(String, String),
    (i, mode): (u64, usize),
    all: &mut Runs,
) {
    let r = format!("{}/bench/m{mode}-{i}:v1", hosts.0);
    let t = Instant::now();
    let pushed = vsnap(ca, &["push", "big", &r]);
    all.times[mode].0.push(t.elapsed().as_secs_f64());
    assert_eq!(pushed["uploaded"], pushed["unique_chunks"], "{pushed}");
    assert_eq!(pushed["encrypted_with"].is_string(), mode == 1);
    all.bytes = pushed["bytes"].as_u64().unwrap();
    all.chunks = pushed["unique_chunks"].as_u64().unwrap();
    let name = format!("p{mode}-{i}");
    let r = r.replace(&hosts.0, &hosts.1);
    let before = disk_use(&b.artifacts);
    let peak = DiskPeak::start(&b.artifacts, Duration::from_millis(50));
    let t = Instant::now();
    let pulled = vsnap(cb, &["pull", &r, &name]);
    all.times[mode].1.push(t.elapsed().as_secs_f64());
    let (peak, _) = peak.stop();
    all.peaks[mode].push(peak.saturating_sub(before) as f64 / all.bytes as f64);
    eprintln!("mode {mode} run {i}: pull {}", pulled["timings_ms"]);
    let ms = |k: &str| pulled["timings_ms"][k].as_u64().unwrap_or(0);
    all.phases[mode].push(format!(
        "{} / {} / {} / {}",
        ms("resolve"),
        ms("fetch"),
        ms("verify"),
        ms("publish")
    ));
    vsnap(cb, &["rm", &name]);
}

fn report(all: &Runs, runs: u64) {
    let (seal, open, sha, id) = per_core();
    let mb = all.bytes as f64 / (1 << 20) as f64;
    if let Ok(l) = std::env::var("BENCH_LINK_MBPS") {
        println!("Pulls through a link of {l} MB/s (the pull's 4 connections share it).");
        println!();
    }
    println!(
        "| {mb:.0} MiB artifact, {} distinct chunks | push s (MiB/s) | pull s (MiB/s) | pull's peak disk / artifact |",
        all.chunks
    );
    println!("|---|---|---|---|");
    for (mode, label) in [(0, "in clear"), (1, "encrypted")] {
        let (push, pull) = (
            median(all.times[mode].0.clone()),
            median(all.times[mode].1.clone()),
        );
        println!(
            "| {label}, median of {runs} | {push:.2} ({:.0}) | {pull:.2} ({:.0}) | {:.3}x |",
            mb / push,
            mb / pull,
            median(all.peaks[mode].clone())
        );
    }
    let ratio =
        |e: &[f64], c: &[f64]| -> Vec<f64> { e.iter().zip(c).map(|(e, c)| e / c).collect() };
    let [(push_c, pull_c), (push_e, pull_e)] = &all.times;
    let (push_r, pull_r) = (ratio(push_e, push_c), ratio(pull_e, pull_c));
    println!(
        "| encrypted / clear, median of each run's ratio | {:.3} | {:.3} | |",
        median(push_r.clone()),
        median(pull_r.clone())
    );
    println!();
    println!("| one core, 2 MiB chunks | MiB/s |");
    println!("|---|---|");
    println!("| seal (ChaCha20-Poly1305 + keyed BLAKE3 id) | {seal:.0} |");
    println!("| open (tag + keyed BLAKE3 id check) | {open:.0} |");
    println!("| sha256 of a layer | {sha:.0} |");
    println!("| keyed BLAKE3 alone (the id; part of seal and open) | {id:.0} |");
    println!();
    println!(
        "pull s, clear: {:.2?}; encrypted: {:.2?}; encrypted / clear per run: {pull_r:.3?}",
        all.times[0].1, all.times[1].1
    );
    println!(
        "push s, clear: {:.2?}; encrypted: {:.2?}",
        all.times[0].0, all.times[1].0
    );
    println!();
    println!(
        "pulls' phases (ms, resolve / fetch / verify / publish), clear: {:?}; encrypted: {:?}",
        all.phases[0], all.phases[1]
    );
}
