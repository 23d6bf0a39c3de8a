//! Benchmark: a restore from a registry reference on a host that lacks the
//! artifact (the pull inside the restore) beside a cold start and a restore
//! of the same artifact already on the host, side by side on host B. Host A
//! (its own private containerd and artifact root) captures the reference
//! engine (`BENCH_RESIDENT_MB` resident, `BENCH_INIT_MS` of start-up work),
//! signs and pushes it to a real docker-registry on loopback; B trusts A's
//! fleet key. Per run on B, in ABC order: a cold start (`ctr run -d` without
//! a plan, until the engine listens), a restore with `vsnap.io/artifact-ref`
//! after `vsnap rm` of the artifact (pull + restore), and a restore of the
//! artifact then present. Every copy's answers are compared with the cold
//! start's.
//!
//! Run by `scripts/bench.sh fleet-restore` (release builds).

use std::time::{Duration, Instant};

use vsnap_e2e::bench::env_num;
use vsnap_e2e::cmd::run;
use vsnap_e2e::containerd::shim_binary;
use vsnap_e2e::engine::{free_port, wait_listening};
use vsnap_e2e::registry::Registry;
use vsnap_e2e::snapshot_env::{answers, setup, Env, RT};

fn vsnap(env: &Env, args: &[&str]) {
    let mut cmd = std::process::Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(&env.config).args(args);
    let out = run(cmd, None, Duration::from_secs(600));
    assert!(out.ok(), "vsnap {args:?}: {out:?}");
}

fn prepend(env: &Env, lines: &str) {
    let config = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{lines}{config}")).unwrap();
}

fn append(env: &Env, lines: &str) {
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str(lines);
    std::fs::write(&env.config, config).unwrap();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = env_num("BENCH_RESIDENT_MB", 512).to_string();
    let init = env_num("BENCH_INIT_MS", 5000).to_string();
    let a = setup("bfr-a");
    let mut b = setup("bfr-b");
    b.rootfs = a.rootfs.clone();
    let registry = Registry::start(&a.c.dir);
    let host = registry.host();
    let (private, public) = (a.c.dir.join("fleet.key"), a.c.dir.join("fleet.pub"));
    let (private, public) = (private.display().to_string(), public.display().to_string());
    vsnap(
        &a,
        &[
            "key",
            "generate",
            "--private",
            &private,
            "--public",
            &public,
        ],
    );
    let shared = a.c.dir.join("fingerprint.key");
    std::fs::write(&shared, [0x33u8; 32]).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let shared = format!("fleet_fingerprint_key = \"{}\"\n", shared.display());
    prepend(&a, &format!("fleet_signing_key = \"{private}\"\n{shared}"));
    prepend(
        &b,
        &format!("fleet_trusted_keys = [\"{public}\"]\n{shared}"),
    );
    let plain = format!("[registries.\"{host}\"]\nplain_http = true\n");
    append(&a, &plain);
    append(&b, &plain);

    let env = [
        format!("VSNAP_ENGINE_RESIDENT_MB={resident}"),
        format!("VSNAP_ENGINE_INIT_MS={init}"),
    ];
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    eprintln!("bench-fleet-restore: capturing on A ({resident} MiB resident, {init} ms init)");
    let manifest = a.create_good("bfr-donor", "bfr", &env);
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let bytes = manifest["image_bytes"].as_u64().unwrap_or(0);
    let reference = format!("{host}/fleet/bfr:v1");
    eprintln!("bench-fleet-restore: pushing to {reference}");
    vsnap(&a, &["push", "bfr", &reference]);

    let mut extra: Vec<String> = Vec::new();
    for kv in &env {
        extra.push("--env".into());
        extra.push(kv.to_string());
    }
    let with_ref = format!("vsnap.io/artifact-ref={reference}");
    let (mut cold, mut pulled, mut local) = (Vec::new(), Vec::new(), Vec::new());
    let mut expected = None;
    for i in 0..runs {
        // Cold start: no plan, the engine's own argv listening address.
        let id = format!("bfr-cold-{i}");
        let port = free_port();
        let port_s = port.to_string();
        let mut args = vec![
            "run",
            "-d",
            "--net-host",
            "--runtime",
            RT,
            "--runtime-config-path",
            &b.config,
        ];
        for e in &extra {
            args.push(e);
        }
        args.extend_from_slice(&[
            "--rootfs",
            &b.rootfs,
            &id,
            "/vsnap-ref-engine",
            "--host",
            "127.0.0.1",
            "--port",
            &port_s,
        ]);
        let t = Instant::now();
        b.c.ctr_ok(&args);
        wait_listening(port, Duration::from_secs(300));
        cold.push(t.elapsed().as_secs_f64() * 1000.0);
        let reply = answers(port);
        expected.get_or_insert_with(|| reply.clone());
        assert_eq!(
            Some(&reply),
            expected.as_ref(),
            "{id} answers as the first cold start"
        );
        b.remove(&id);

        // Restore from the reference, the artifact absent: pull + restore.
        if b.artifact("bfr").exists() {
            vsnap(&b, &["rm", "bfr"]);
        }
        let id = format!("bfr-pulled-{i}");
        let port = free_port();
        let mut more: Vec<&str> = vec!["--annotation", &with_ref];
        more.extend(extra.iter().map(String::as_str));
        let t = Instant::now();
        let out = b.run(&id, "restore", "bfr", port, &more);
        assert!(out.ok(), "{id}: {out:?}\n{}", b.c.log_tail());
        pulled.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(Some(&answers(port)), expected.as_ref(), "{id}");
        b.remove(&id);

        // The same restore with the artifact now here.
        let id = format!("bfr-local-{i}");
        let port = free_port();
        let t = Instant::now();
        let out = b.run(&id, "restore", "bfr", port, &more);
        assert!(out.ok(), "{id}: {out:?}\n{}", b.c.log_tail());
        local.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(Some(&answers(port)), expected.as_ref(), "{id}");
        b.remove(&id);
        eprintln!(
            "bench-fleet-restore: run {i}: cold {:.0} ms, pull + restore {:.0} ms, local restore {:.0} ms",
            cold[i as usize], pulled[i as usize], local[i as usize]
        );
    }
    let (c, p, l) = (median(&mut cold), median(&mut pulled), median(&mut local));
    println!("## Restore from a registry reference on a host without the artifact");
    println!();
    println!(
        "Artifact: {:.0} MiB of images ({resident} MiB resident, {init} ms init); registry: docker-registry on loopback; {runs} runs on host B, ABC order; medians (ms).",
        bytes as f64 / 1048576.0
    );
    println!();
    println!("| start on B | median (ms) | / cold start |");
    println!("|---|---:|---:|");
    println!("| cold start (`ctr run -d` until the engine listens) | {c:.0} | 1.000 |");
    println!(
        "| restore with `vsnap.io/artifact-ref`, artifact absent (pull + restore) | {p:.0} | {:.3} |",
        p / c
    );
    println!(
        "| restore, artifact present (pulled earlier) | {l:.0} | {:.3} |",
        l / c
    );
    println!();
    println!("Every copy answered like the first cold start.");
}
