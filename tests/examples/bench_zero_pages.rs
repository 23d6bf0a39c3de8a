//! Benchmark: zero pages elided (issue 34). One engine whose memory is half
//! zero pages (BENCH_RESIDENT_MB of data, as many MiB present and all
//! zero), captured twice in one run on a private containerd: with
//! `elide_zero_pages` (the default) and without. Side by side: the page
//! images' bytes, the artifact's bytes on disk, the capture's digest phase
//! (elision and digests), and warm restores of each (`ctr run -d` to the
//! engine serving; the page server's fill), alternating. Run by
//! `scripts/bench.sh zero-pages` (release builds). Environment: BENCH_RUNS
//! (restores of each, default 3), BENCH_RESIDENT_MB (default 512).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, median};
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{setup, Env};

/// A warm restore of `name` as `id`: seconds to serving, and the page
/// server's fill in ms.
fn restore(e: &Env, id: &str, name: &str, env: &[&str]) -> (f64, f64) {
    let port = free_port();
    let t = Instant::now();
    let out = e.run(id, "restore", name, port, env);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(300), "{id} listening");
        std::thread::sleep(Duration::from_millis(5));
    }
    let serving = t.elapsed().as_secs_f64();
    let phases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap())
            .unwrap();
    e.remove(id);
    let fill = phases["page_fill_ms"].as_f64().unwrap_or(f64::NAN);
    (serving, fill)
}

/// A capture of `name`: its manifest.
fn capture(e: &Env, name: &str, env: &[&str]) -> serde_json::Value {
    let bare: Vec<&str> = env.iter().copied().filter(|a| *a != "--env").collect();
    serde_json::from_slice(&e.create_good(&format!("{name}-donor"), name, &bare)).unwrap()
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let mb = env_num("BENCH_RESIDENT_MB", 512);
    let (resident, zero) = (
        format!("VSNAP_ENGINE_RESIDENT_MB={mb}"),
        format!("VSNAP_ENGINE_ZERO_MB={mb}"),
    );
    let env = ["--env", resident.as_str(), "--env", zero.as_str()];
    let e = setup("bench-zp");
    let config = std::fs::read_to_string(&e.config).unwrap();
    std::fs::write(&e.config, format!("{config}elide_zero_pages = false\n")).unwrap();
    let full = capture(&e, "full", &env);
    let full_digest = digest_s(&e);
    std::fs::write(&e.config, &config).unwrap();
    let elided = capture(&e, "elided", &env);
    let elided_digest = digest_s(&e) - full_digest;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..runs {
        eprintln!("bench: pair {} of {runs}", i + 1);
        let a = || restore(&e, &format!("el-{i}"), "elided", &env);
        let b = || restore(&e, &format!("fu-{i}"), "full", &env);
        if i % 2 == 0 {
            with.push(a());
            without.push(b());
        } else {
            without.push(b());
            with.push(a());
        }
    }
    println!("### Zero pages elided ({resident}, {zero}; {runs} warm restores of each)");
    println!();
    println!("| capture | page images (MiB) | elided (MiB) | artifact on disk (MiB) | digest phase (ms) | restore to serving (median s) | page fill (median ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, m, name, r, digest) in [
        (
            "elide_zero_pages = true",
            &elided,
            "elided",
            &with,
            elided_digest,
        ),
        (
            "elide_zero_pages = false",
            &full,
            "full",
            &without,
            full_digest,
        ),
    ] {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let pages = m["memory"]["pages_bytes"].as_u64().unwrap();
        let gone = m["zero_pages"]["elided_bytes"].as_u64().unwrap_or(0);
        let disk = vsnap_artifact::layout::bytes_under(&e.artifact(name));
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.0} |",
            mib(pages),
            mib(gone),
            mib(disk),
            digest * 1000.0,
            median(r.iter().map(|x| x.0).collect()),
            median(r.iter().map(|x| x.1).collect()),
        );
    }
}

/// The seconds all captures so far spent in their digest phase (elision
/// included), from the metrics journal.
fn digest_s(e: &Env) -> f64 {
    let out = e.vsnap(&["metrics"]);
    let series = "vsnap_phase_duration_seconds_sum{op=\"capture\",phase=\"digest\"}";
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}
