//! Measures content-defined chunking parameters on real captures: two
//! artifacts of the reference engine (same workload, `BENCH_RESIDENT_MB` of
//! resident memory, 256 by default) captured one after the other under a
//! private containerd, every file a restore reads cut with each candidate
//! (min/avg/max), and reported: chunks (requests per pull), and the bytes of
//! the second capture whose chunks the first does not have (what a registry
//! stores and a host fetches for it). Fixed 4 MiB chunks for comparison.
//!
//! `cargo run --release -p vsnap-e2e --example fleet_chunking` as root, after
//! building the shim and engine (see scripts/bench.sh fleet).

use std::collections::HashSet;
use std::path::Path;

use sha2::Digest;
use vsnap_e2e::snapshot_env::setup;
use vsnap_registry::chunking::{chunk_reader, Params};

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    m["contents"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| dir.join(k))
        .collect()
}

/// (digest, len) of every chunk of every file.
fn cut(dir: &Path, params: Option<Params>) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for f in files(dir) {
        let bytes = std::fs::read(&f).unwrap();
        match params {
            Some(p) => {
                for piece in chunk_reader(&bytes[..], p).unwrap() {
                    out.push((piece.digest, piece.len));
                }
            }
            None => {
                for c in bytes.chunks(4 << 20) {
                    let d = vsnap_artifact::key::hex(&sha2::Sha256::digest(c));
                    out.push((d, c.len() as u64));
                }
            }
        }
    }
    out
}

fn main() {
    let resident: u64 = std::env::var("BENCH_RESIDENT_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let e = setup("fleet-chunking");
    let env = format!("VSNAP_ENGINE_RESIDENT_MB={resident}");
    e.create_good("d1", "one", &[&env]);
    e.create_good("d2", "two", &[&env]);
    let (one, two) = (e.artifact("one"), e.artifact("two"));
    let k = 1u32 << 10;
    let m = 1u32 << 20;
    let candidates: Vec<(String, Option<Params>)> = vec![
        ("fixed 4 MiB".into(), None),
        (
            "64K/256K/1M".into(),
            Some(Params {
                min: 64 * k,
                avg: 256 * k,
                max: m,
            }),
        ),
        (
            "256K/1M/4M".into(),
            Some(Params {
                min: 256 * k,
                avg: m,
                max: 4 * m,
            }),
        ),
        (
            "512K/2M/8M".into(),
            Some(Params {
                min: 512 * k,
                avg: 2 * m,
                max: 8 * m,
            }),
        ),
        (
            "1M/4M/16M".into(),
            Some(Params {
                min: m,
                avg: 4 * m,
                max: 16 * m,
            }),
        ),
    ];
    println!("| chunking | chunks (2nd) | mean chunk | 2nd capture's bytes not in the 1st |");
    println!("|---|---|---|---|");
    for (label, p) in candidates {
        let a = cut(&one, p);
        let b = cut(&two, p);
        let have: HashSet<&String> = a.iter().map(|(d, _)| d).collect();
        let total: u64 = b.iter().map(|(_, l)| l).sum();
        let mut seen = HashSet::new();
        let new: u64 = b
            .iter()
            .filter(|(d, _)| !have.contains(d) && seen.insert(d.clone()))
            .map(|(_, l)| l)
            .sum();
        println!(
            "| {label} | {} | {:.2} MiB | {:.1} MiB of {:.1} MiB ({:.1}%) |",
            b.len(),
            total as f64 / b.len() as f64 / m as f64,
            new as f64 / m as f64,
            total as f64 / m as f64,
            100.0 * new as f64 / total as f64
        );
    }
}
