//! Benchmark: `vsnap pull` from a loopback registry against a raw copy of
//! the same bytes, side by side in one run. One private containerd (host A)
//! captures the reference engine with `BENCH_RESIDENT_MB` of memory (512 by
//! default), `vsnap push` sends it to a docker-registry 2.8 on 127.0.0.1;
//! then, alternating (ABAB), B pulls it (HTTP, sha256 of every chunk while it
//! streams, each written once into its place in the files, the BLAKE3
//! content check, fsync and publish) and `cat` copies the registry's stored chunk files (the same
//! bytes) into one file followed by `sync` of that file. Page cache warm for
//! both (the registry's files were just written or read). Each pull's peak
//! disk use is sampled every 50 ms (B's artifact root, as `du` counts it:
//! what the pull keeps to resume, its files, the published artifact).
//!
//! Run by `scripts/bench.sh fleet` (release builds). Environment:
//! BENCH_RUNS (pairs, default 3), BENCH_RESIDENT_MB.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, median, vsnap_json};
use vsnap_e2e::cmd::run;
use vsnap_e2e::containerd::shim_binary;
use vsnap_e2e::disk::{disk_use, DiskPeak};
use vsnap_e2e::registry::Registry;
use vsnap_e2e::snapshot_env::{setup, Env};

fn vsnap(env: &Env, args: &[&str]) -> serde_json::Value {
    vsnap_json(Path::new(&env.config), args)
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = env_num("BENCH_RESIDENT_MB", 512);
    let a = setup("bench-fleet-a");
    let b = setup("bench-fleet-b");
    let registry = Registry::start(&a.c.dir);
    for e in [&a, &b] {
        let mut config = std::fs::read_to_string(&e.config).unwrap();
        config.push_str(&format!(
            "[registries.\"{}\"]\nplain_http = true\n",
            registry.host()
        ));
        std::fs::write(&e.config, config).unwrap();
    }
    // Signed as in a fleet: A signs, B trusts A's key.
    let (private, public) = (a.c.dir.join("k"), a.c.dir.join("k.pub"));
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.args(["key", "generate", "--private"])
        .arg(&private)
        .arg("--public")
        .arg(&public);
    assert!(run(cmd, None, Duration::from_secs(30)).ok());
    for (e, line) in [
        (
            &a,
            format!("fleet_signing_key = \"{}\"\n", private.display()),
        ),
        (
            &b,
            format!("fleet_trusted_keys = [\"{}\"]\n", public.display()),
        ),
    ] {
        let config = std::fs::read_to_string(&e.config).unwrap();
        std::fs::write(&e.config, format!("{line}{config}")).unwrap();
    }

    let env = format!("VSNAP_ENGINE_RESIDENT_MB={resident}");
    a.create_good("donor", "big", &[&env]);
    let r = format!("{}/bench/big:v1", registry.host());
    let t = Instant::now();
    let pushed = vsnap(&a, &["push", "big", &r]);
    let push_s = t.elapsed().as_secs_f64();
    let bytes = pushed["bytes"].as_u64().unwrap();
    eprintln!("pushed {bytes} bytes in {push_s:.2} s: {pushed}");

    // The registry's chunk files: what a raw copy reads.
    let blobs: Vec<String> =
        std::fs::read_dir(registry.dir.join("data/docker/registry/v2/blobs/sha256"))
            .unwrap()
            .flatten()
            .flat_map(|p| std::fs::read_dir(p.path()).unwrap().flatten())
            .map(|d| d.path().join("data").display().to_string())
            .collect();
    let copy_to = b.c.dir.join("raw-copy");
    // The same chunks over HTTP from the registry, 4 at a time, into
    // /dev/null: what the registry and loopback allow, with no hashing or
    // writing on the client's side. (The two manifests are stored as blobs
    // too but served only as manifests: their 404s are expected.)
    let urls: Vec<String> = blobs
        .iter()
        .map(|p| {
            let hex = Path::new(p).parent().unwrap().file_name().unwrap();
            format!(
                "http://{}/v2/bench/big/blobs/sha256:{}",
                registry.host(),
                hex.to_string_lossy()
            )
        })
        .collect();
    let curl = format!(
        "printf '%s\\n' {} | xargs -P4 -n1 curl -s -o /dev/null -w \"%{{http_code}} \"",
        urls.join(" ")
    );

    let (mut pulls, mut copies, mut curls) = (Vec::new(), Vec::new(), Vec::new());
    let mut peaks = Vec::new();
    for i in 0..runs {
        let name = format!("p{i}");
        let before = disk_use(&b.artifacts);
        let peak = DiskPeak::start(&b.artifacts, Duration::from_millis(50));
        let t = Instant::now();
        let pulled = vsnap(&b, &["pull", &r, &name]);
        pulls.push(t.elapsed().as_secs_f64());
        let (peak, _) = peak.stop();
        peaks.push(peak.saturating_sub(before) as f64 / bytes as f64);
        assert_eq!(pulled["reused"], 0, "{pulled}");
        eprintln!("pull {i}: {}", pulled["timings_ms"]);
        vsnap(&b, &["rm", &name]);

        let t = Instant::now();
        let script = format!(
            "cat {} > {} && sync {}",
            blobs.join(" "),
            copy_to.display(),
            copy_to.display()
        );
        assert!(Command::new("sh")
            .args(["-c", &script])
            .status()
            .unwrap()
            .success());
        copies.push(t.elapsed().as_secs_f64());
        std::fs::remove_file(&copy_to).unwrap();

        let t = Instant::now();
        let out = Command::new("sh").args(["-c", &curl]).output().unwrap();
        curls.push(t.elapsed().as_secs_f64());
        let codes = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && codes.split_whitespace().all(|c| c == "200" || c == "404"),
            "curl: {codes} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mb = bytes as f64 / (1 << 20) as f64;
    println!(
        "| {mb:.0} MiB artifact, {} chunks ({} distinct) | median of {runs} | MiB/s |",
        pushed["chunks"], pushed["unique_chunks"]
    );
    println!("|---|---|---|");
    let (p, c) = (median(pulls.clone()), median(copies.clone()));
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
        median(peaks.clone())
    );
    let h = median(curls.clone());
    println!(
        "| `curl` of every chunk from the registry to /dev/null, 4 parallel | {h:.2} s | {:.0} |",
        mb / h
    );
    println!(
        "| `vsnap push` (first, every chunk sent) | {push_s:.2} s | {:.0} |",
        mb / push_s
    );
    eprintln!(
        "pull runs: {pulls:?}; copy runs: {copies:?}; curl runs: {curls:?}; peak disk: {peaks:?}"
    );
}
