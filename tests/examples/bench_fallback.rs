//! Benchmark: what an `auto` start that falls back costs (issue 33). Side
//! by side in one run, on a private containerd, paired and alternating:
//!
//! 1. a plain create: `auto` of a name with no artifact (cold start, then
//!    capture and publish);
//! 2. a fallback at create: `auto` of a name whose artifact was truncated
//!    (the restore preflight refuses it, it is set aside, the same create
//!    starts cold and captures anew);
//! 3. for scale, a warm restore of the fresh artifact.
//!
//! Each is timed from `ctr run -d` to the engine listening (serving) and
//! to the new manifest (published). Run by `scripts/bench.sh fallback`
//! (release builds). Environment: BENCH_RUNS (pairs, default 3),
//! BENCH_RESIDENT_MB (default 512), BENCH_INIT_MS (the engine's start-up
//! work, default 2000).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, median};
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{largest_image, setup, truncate_a_page, Env};

/// Seconds from now until `done` holds, polled every 5 ms (panics at 300 s).
fn until(started: Instant, what: &str, mut done: impl FnMut() -> bool) -> f64 {
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(300), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
    started.elapsed().as_secs_f64()
}

/// An `auto` start of `name` as `id`: (serving, published) in seconds.
fn auto_start(e: &Env, id: &str, name: &str, env: &[&str]) -> (f64, f64) {
    let port = free_port();
    let manifest = e.manifest(name);
    let t = Instant::now();
    let out = e.run(id, "auto", name, port, env);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    let serving = until(t, "listening", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let published = until(t, "published", || manifest.exists());
    (serving, published)
}

fn main() {
    let runs = env_num("BENCH_RUNS", 3);
    let resident = format!(
        "VSNAP_ENGINE_RESIDENT_MB={}",
        env_num("BENCH_RESIDENT_MB", 512)
    );
    let init = format!("VSNAP_ENGINE_INIT_MS={}", env_num("BENCH_INIT_MS", 2000));
    let env = ["--env", resident.as_str(), "--env", init.as_str()];
    let e = setup("bench-fb");
    let (mut create, mut fallback, mut restore) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        // The artifact the fallback will refuse, made and damaged first.
        let bad = format!("fb-{i}");
        auto_start(&e, &format!("{bad}-0"), &bad, &env);
        e.remove(&format!("{bad}-0"));
        truncate_a_page(&largest_image(&e.artifact(&bad), true));
        let plain = || {
            let r = auto_start(&e, &format!("new-{i}"), &format!("new-{i}"), &env);
            e.remove(&format!("new-{i}"));
            r
        };
        let fall = || {
            let r = auto_start(&e, &format!("{bad}-1"), &bad, &env);
            e.remove(&format!("{bad}-1"));
            r
        };
        eprintln!("bench: pair {} of {runs}", i + 1);
        if i % 2 == 0 {
            create.push(plain());
            fallback.push(fall());
        } else {
            fallback.push(fall());
            create.push(plain());
        }
        let t = Instant::now();
        let port = free_port();
        let out = e.run(&format!("{bad}-2"), "auto", &bad, port, &env);
        assert!(out.ok(), "{out:?}");
        restore.push(until(t, "restored", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        }));
        e.remove(&format!("{bad}-2"));
    }
    report(runs, &resident, &init, &create, &fallback, &restore);
}

fn report(
    runs: u64,
    resident: &str,
    init: &str,
    create: &[(f64, f64)],
    fallback: &[(f64, f64)],
    restore: &[f64],
) {
    let col = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(xs.iter().map(f).collect());
    let (cs, cp) = (col(create, |x| x.0), col(create, |x| x.1));
    let (fs, fp) = (col(fallback, |x| x.0), col(fallback, |x| x.1));
    println!("### `auto` that falls back vs a plain create ({runs} pairs; {resident}, {init})");
    println!();
    println!("| start | serving (median s) | published (median s) |");
    println!("|---|---:|---:|");
    println!("| plain create (`auto`, no artifact) | {cs:.2} | {cp:.2} |");
    println!("| fallback (`auto`, truncated artifact set aside) | {fs:.2} | {fp:.2} |");
    println!(
        "| warm restore of the fresh artifact | {:.2} | |",
        median(restore.to_vec())
    );
    println!();
    println!(
        "fallback / create: serving {:.2}, published {:.2}; fallback - create: {:+.0} ms of serving (the refused preflight and the set aside, against the run's noise)",
        fs / cs,
        fp / cp,
        (fs - cs) * 1000.0
    );
}
