//! Benchmark: a real engine's shape under vsnap, side by side in one run on
//! one private containerd (release builds):
//!
//! 1. vLLM 0.33.0's own snapshot server over the stand-in engine
//!    (tests/vllm-standin), from its OCI image: create (its cold start to
//!    the ready file, the capture's phases) and BENCH_RUNS restores (`ctr
//!    run` until Start returned: the copy released and its canary checked
//!    over HTTP), against its cold start measured as `ctr run` of the same
//!    container until the ready file, plus the release until it answers.
//! 2. What carrying the writable layer costs: the reference engine from an
//!    image, writing 0, 100 MiB and 1 GiB (BENCH_LAYER_MB) of random bytes
//!    into its root filesystem at cold start and holding the file open;
//!    per size the capture's checkpoint and packing times, the tar's size,
//!    and BENCH_RUNS restores: `ctr run` wall time and the shim's
//!    `rootfs_ms` (checking and unpacking the layer).
//!
//! Run by `scripts/bench.sh real-engine`. Report (markdown) on stdout.

use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, median};
use vsnap_e2e::cmd::{run, CmdOutput};
use vsnap_e2e::engine::{engine_rootfs, free_port, wait_listening};
use vsnap_e2e::image::import_image;
use vsnap_e2e::snapshot_env::{setup, Env, RT};
use vsnap_e2e::vllm::{self, BARRIER_FLAGS};

fn ctr_run(e: &Env, args: &[String]) -> (CmdOutput, f64) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = Instant::now();
    let out = run(e.c.ctr_command(&args), None, Duration::from_secs(600));
    (out, t.elapsed().as_secs_f64() * 1000.0)
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn timings(e: &Env, id: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap())
        .unwrap()
}

fn vllm_part(e: &Env, runs: usize) {
    vllm::import_image(&e.c, "default");
    let argv = vllm::server_argv(&BARRIER_FLAGS, &[]);
    let base = |id: &str, plan: &str, port: u16| {
        let mut a = strings(&[
            "run",
            "-d",
            "--net-host",
            "--seccomp",
            "--runtime",
            RT,
            "--runtime-config-path",
        ]);
        a.push(e.config.clone());
        for ann in [
            format!("vsnap.io/plan={plan}"),
            "vsnap.io/artifact=vllm".into(),
            format!("vsnap.io/listen=127.0.0.1:{port}"),
            "vsnap.io/after-capture=exit".into(),
        ] {
            a.extend(["--annotation".into(), ann]);
        }
        a.extend([vllm::IMAGE.to_string(), id.to_string()]);
        a.extend(argv.iter().cloned());
        a
    };
    // Its cold start: from Start until the engine is built, has run its
    // canary and slept (the ready file: `cold_start_to_capture_ready`),
    // over BENCH_RUNS creates. A server that binds instead would add its
    // wake-up and bind, so this is a lower bound of the cold start.
    let mut cold = Vec::new();
    for i in 0..runs {
        let id = format!("cold{i}");
        let mut args = base(&id, "create", free_port());
        let at = args
            .iter()
            .position(|a| a == "vsnap.io/artifact=vllm")
            .unwrap();
        args[at] = format!("vsnap.io/artifact=cold{i}");
        let (out, _) = ctr_run(e, &args);
        assert!(out.ok(), "{out:?}");
        let m = e.wait_manifest(&format!("cold{i}"));
        cold.push(
            m["timings_ms"]["cold_start_to_capture_ready"]
                .as_f64()
                .unwrap(),
        );
        e.wait_stopped(&id);
        e.remove(&id);
        let _ = std::fs::remove_dir_all(e.artifact(&format!("cold{i}")));
    }
    let (out, _) = ctr_run(e, &base("donor", "create", free_port()));
    assert!(out.ok(), "{out:?}");
    let m = e.wait_manifest("vllm");
    e.wait_stopped("donor");
    e.remove("donor");
    let mut restore = Vec::new();
    let mut phases = Vec::new();
    for i in 0..runs {
        let id = format!("copy{i}");
        let port = free_port();
        let (out, wall) = ctr_run(e, &base(&id, "restore", port));
        assert!(out.ok(), "{out:?}");
        assert_eq!(vllm::canary(port, None).0, 200);
        restore.push(wall);
        phases.push(timings(e, &id));
        e.remove(&id);
    }
    let t = &m["timings_ms"];
    let (c, r) = (median(cold), median(restore));
    let phase = |k: &str| {
        median(
            phases
                .iter()
                .map(|p| p[k].as_f64().unwrap_or(0.0))
                .collect(),
        )
    };
    println!("## vLLM 0.33.0's snapshot server (stand-in engine), {runs} runs each, medians\n");
    println!("| quantity | ms |\n|---|---|");
    println!("| cold start to the ready file (built, canary run, asleep: a lower bound of a cold start) | {c:.0} |");
    println!(
        "| restore (`ctr run` until Start returned: restored, released, canary checked) | {r:.0} |"
    );
    println!("| restore / cold start | {:.2} |", r / c);
    println!("| capture: cold start to the ready file / inventory / checkpoint (incl. packing the layer) / packing | {} / {} / {} / {} |",
        t["cold_start_to_capture_ready"], t["inventory"], t["checkpoint"], t["rootfs"]);
    println!("| restore phases: preflight / rootfs / CRIU / activation / listener | {:.0} / {:.0} / {:.0} / {:.0} / {:.0} |",
        phase("preflight_ms"), phase("rootfs_ms"), phase("criu_restore_ms"), phase("activation_ms"), phase("listener_ms"));
    println!(
        "| CRIU images | {} MiB |\n",
        m["image_bytes"].as_u64().unwrap_or(0) >> 20
    );
}

const LAYER_IMAGE: &str = "localhost/vsnap-ref-engine:bench-layer";

fn layer_part(e: &Env, runs: usize, sizes: &[u64]) {
    let work = e.c.dir.join("layer-image");
    let root = engine_rootfs(&work);
    std::fs::create_dir_all(root.join("root")).unwrap();
    import_image(&e.c, &work, &root, LAYER_IMAGE, serde_json::json!({}));
    println!("## Carrying the writable layer (reference engine from an image), {runs} restores per size, medians\n");
    println!("| layer | upper.tar | capture: checkpoint (incl. packing) | packing | restore (`ctr run`) | restore: rootfs_ms (check + unpack) | restore minus the 0 MiB row |");
    println!("|---|---|---|---|---|---|---|");
    let mut base_restore = None;
    for &mb in sizes {
        let name = format!("layer{mb}");
        let script = format!(
            "busybox mkdir -p /root/.cache/compiled && \
             busybox dd if=/dev/urandom of=/root/.cache/compiled/blob bs=1M count={mb} 2>/dev/null; \
             exec 3</root/.cache/compiled/blob && exec /vsnap-ref-engine"
        );
        let args = |id: &str, plan: &str, port: u16| {
            let mut a = strings(&[
                "run",
                "-d",
                "--net-host",
                "--runtime",
                RT,
                "--runtime-config-path",
            ]);
            a.push(e.config.clone());
            for ann in [
                format!("vsnap.io/plan={plan}"),
                format!("vsnap.io/artifact={name}"),
                format!("vsnap.io/listen=127.0.0.1:{port}"),
                "vsnap.io/after-capture=exit".into(),
            ] {
                a.extend(["--annotation".into(), ann]);
            }
            a.extend([
                LAYER_IMAGE.into(),
                id.into(),
                "/bin/sh".into(),
                "-c".into(),
                script.clone(),
            ]);
            a
        };
        let donor = format!("{name}-donor");
        let (out, _) = ctr_run(e, &args(&donor, "create", free_port()));
        assert!(out.ok(), "{out:?}");
        let m = e.wait_manifest(&name);
        e.wait_stopped(&donor);
        e.remove(&donor);
        let tar = m["contents"]["rootfs/upper.tar"]["size"]
            .as_u64()
            .unwrap_or(0);
        let mut walls = Vec::new();
        let mut unpack = Vec::new();
        for i in 0..runs {
            let id = format!("{name}-copy{i}");
            let port = free_port();
            let (out, wall) = ctr_run(e, &args(&id, "restore", port));
            assert!(out.ok(), "{out:?}");
            wait_listening(port, Duration::from_secs(30));
            walls.push(wall);
            unpack.push(timings(e, &id)["rootfs_ms"].as_f64().unwrap_or(0.0));
            e.remove(&id);
        }
        let r = median(walls);
        let extra = base_restore.map_or("—".to_string(), |b: f64| format!("{:+.0} ms", r - b));
        base_restore.get_or_insert(r);
        println!(
            "| {mb} MiB | {:.1} MiB | {} ms | {} ms | {r:.0} ms | {:.0} ms | {extra} |",
            tar as f64 / (1 << 20) as f64,
            m["timings_ms"]["checkpoint"],
            m["timings_ms"]["rootfs"],
            median(unpack),
        );
        let _ = std::fs::remove_dir_all(e.artifact(&name));
    }
    println!();
}

fn main() {
    let runs = env_num("BENCH_RUNS", 5) as usize;
    let sizes: Vec<u64> = std::env::var("BENCH_LAYER_MB")
        .unwrap_or_else(|_| "0,100,1024".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let e = setup("bench-real-engine");
    std::fs::write(
        &e.config,
        format!(
            "artifact_root = \"{}\"\ncapture_timeout_s = 600\nactivation_timeout_s = 300\n",
            e.artifacts.display()
        ),
    )
    .unwrap();
    println!(
        "# Real engine shapes under vsnap ({})\n",
        std::env::var("BENCH_DATE").unwrap_or_default()
    );
    vllm_part(&e, runs);
    layer_part(&e, runs, &sizes);
}
