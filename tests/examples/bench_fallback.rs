//! Benchmark: what an `auto` start that falls back costs (issue 33). Side
//! by side in one run, on a private containerd, paired and alternating:
//!
//! 1. a plain create: `auto` of a name with no artifact (cold start, then
//!    capture and publish);
//! 2. a fallback at create: `auto` of a name whose artifact was truncated
//!    (the restore preflight refuses it, it is set aside, the same create
//!    starts cold and captures anew);
//! 3. a fallback at Start: `auto` of a name whose pages image has a byte
//!    flipped (found beside CRIU: the restore attempt fails, the artifact
//!    is set aside, the same Start goes on as a cold start and captures);
//! 4. for scale, a warm restore of the fresh artifact.
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
use vsnap_e2e::snapshot_env::{flip_middle_byte, largest_image, setup, truncate_a_page, Env};

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
    let (mut create, mut fallback, mut at_start, mut restore) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        // The artifacts the fallbacks will refuse, made and damaged first:
        // one the preflight refuses, one whose damage is found at Start.
        let (bad, late) = (format!("fb-{i}"), format!("fs-{i}"));
        for name in [&bad, &late] {
            auto_start(&e, &format!("{name}-0"), name, &env);
            e.remove(&format!("{name}-0"));
        }
        truncate_a_page(&largest_image(&e.artifact(&bad), true));
        flip_middle_byte(&largest_image(&e.artifact(&late), true));
        let once = |id: String, name: &str| {
            let r = auto_start(&e, &id, name, &env);
            e.remove(&id);
            r
        };
        eprintln!("bench: round {} of {runs}", i + 1);
        // Each order in turn: no case always runs first.
        for k in 0..3 {
            match (i as usize + k) % 3 {
                0 => create.push(once(format!("new-{i}"), &format!("new-{i}"))),
                1 => fallback.push(once(format!("{bad}-1"), &bad)),
                _ => at_start.push(once(format!("{late}-1"), &late)),
            }
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
    let starts = Starts {
        create,
        fallback,
        at_start,
    };
    report(runs, &resident, &init, &starts, &restore);
}

/// (serving, published) of each start, per case.
struct Starts {
    create: Vec<(f64, f64)>,
    fallback: Vec<(f64, f64)>,
    at_start: Vec<(f64, f64)>,
}

fn report(runs: u64, resident: &str, init: &str, starts: &Starts, restore: &[f64]) {
    let col = |xs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| median(xs.iter().map(f).collect());
    let (cs, cp) = (col(&starts.create, |x| x.0), col(&starts.create, |x| x.1));
    let (fs, fp) = (
        col(&starts.fallback, |x| x.0),
        col(&starts.fallback, |x| x.1),
    );
    let (ss, sp) = (
        col(&starts.at_start, |x| x.0),
        col(&starts.at_start, |x| x.1),
    );
    println!("### `auto` that falls back vs a plain create ({runs} rounds; {resident}, {init})");
    println!();
    println!("| start | serving (median s) | published (median s) | serving / create |");
    println!("|---|---:|---:|---:|");
    println!("| plain create (`auto`, no artifact) | {cs:.2} | {cp:.2} | 1.00 |");
    println!(
        "| fallback at create (`auto`, truncated artifact set aside) | {fs:.2} | {fp:.2} | {:.2} |",
        fs / cs
    );
    println!(
        "| fallback at Start (`auto`, flipped byte found beside CRIU, same Start cold) | {ss:.2} | {sp:.2} | {:.2} |",
        ss / cs
    );
    println!(
        "| warm restore of the fresh artifact | {:.2} | | |",
        median(restore.to_vec())
    );
    println!();
    println!(
        "fallback at create - create: {:+.0} ms of serving; fallback at Start - create: {:+.0} ms (the failed restore attempt and the undo, against the run's noise)",
        (fs - cs) * 1000.0,
        (ss - cs) * 1000.0
    );
}
