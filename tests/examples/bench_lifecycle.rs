//! Benchmark: how a shim that is restoring answers, and how fast a kill ends
//! a restore. Side by side in one run, on a private containerd:
//!
//! 1. latency of `ctr task ls` (State of every task) and `ctr task metrics`
//!    of another container in the same shim (Stats), while the shim is idle
//!    and while it restores a 1 GiB artifact (CRIU and activation);
//! 2. kill-to-exit: `ctr task kill -s SIGKILL` of a container CRIU is
//!    restoring, to the moment its Start returns and to the moment State
//!    says STOPPED.
//!
//! Run by `scripts/bench.sh lifecycle` (release builds). Environment:
//! BENCH_RESTORES (default 5), BENCH_RESIDENT_MB (default 1024).

use std::time::{Duration, Instant};

use vsnap_e2e::bench::env_num;
use vsnap_e2e::cmd::run;
use vsnap_e2e::containerd::is_mounted;
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{poll_every, setup, Env};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// p50, p99 and max of `xs` (ms).
fn summary(xs: &mut [f64]) -> String {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| xs[((xs.len() as f64 - 1.0) * q).round() as usize];
    format!(
        "| {} | {:.1} | {:.1} | {:.1} |",
        xs.len(),
        at(0.5),
        at(0.99),
        xs[xs.len() - 1]
    )
}

/// One State and one Stats call; their latencies.
fn probe(e: &Env, state: &mut Vec<f64>, stats: &mut Vec<f64>) {
    let t = Instant::now();
    e.c.ctr_ok(&["task", "ls"]);
    state.push(ms(t.elapsed()));
    let t = Instant::now();
    e.c.ctr_ok(&["task", "metrics", "plain"]);
    stats.push(ms(t.elapsed()));
}

fn main() {
    let restores = env_num("BENCH_RESTORES", 5);
    let resident = format!(
        "VSNAP_ENGINE_RESIDENT_MB={}",
        env_num("BENCH_RESIDENT_MB", 1024)
    );
    let e = setup("bench-lc");
    eprintln!("bench: creating the artifact ({resident})");
    e.create_good("donor", "big", &[&resident]);
    let group = ["--annotation", "io.kubernetes.cri.sandbox-id=plain"];
    let mut args = vec!["run", "-d", "--runtime", "io.vsnap.v1"];
    args.extend_from_slice(&group);
    args.extend_from_slice(&["--rootfs", &e.rootfs, "plain", "/bin/sleep", "100000"]);
    e.c.ctr_ok(&args);

    let (mut idle_state, mut idle_stats) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        probe(&e, &mut idle_state, &mut idle_stats);
    }

    let (mut busy_state, mut busy_stats) = (Vec::new(), Vec::new());
    let mut restore_ms = Vec::new();
    let mut extra = vec!["--env", resident.as_str()];
    extra.extend_from_slice(&group);
    for i in 0..restores {
        let id = format!("copy{i}");
        let cmd = e.run_command(&id, "restore", "big", free_port(), &extra, &[]);
        let t = Instant::now();
        let ctr = std::thread::spawn(move || run(cmd, None, Duration::from_secs(300)));
        let criu_root = e.c.runc_root().join(&id).join("criu-root");
        poll_every(
            Duration::from_millis(2),
            Duration::from_secs(60),
            "criu-root",
            || is_mounted(&criu_root),
        );
        while !ctr.is_finished() {
            probe(&e, &mut busy_state, &mut busy_stats);
        }
        let out = ctr.join().unwrap();
        assert!(out.ok(), "{id}: {out:?}");
        restore_ms.push(ms(t.elapsed()));
        e.remove(&id);
    }

    let (mut to_start_end, mut to_stopped) = (Vec::new(), Vec::new());
    for i in 0..restores {
        let id = format!("killed{i}");
        let cmd = e.run_command(&id, "restore", "big", free_port(), &extra, &[]);
        let ctr = std::thread::spawn(move || run(cmd, None, Duration::from_secs(300)));
        let criu_root = e.c.runc_root().join(&id).join("criu-root");
        poll_every(
            Duration::from_millis(2),
            Duration::from_secs(60),
            "criu-root",
            || is_mounted(&criu_root),
        );
        let t = Instant::now();
        e.c.ctr_ok(&["task", "kill", "-s", "SIGKILL", &id]);
        let (mut ended, mut stopped) = (None, None);
        while ended.is_none() || stopped.is_none() {
            if ended.is_none() && ctr.is_finished() {
                ended = Some(t.elapsed());
            }
            if stopped.is_none() && e.task_status(&id).is_none_or(|s| s == "STOPPED") {
                stopped = Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        to_start_end.push(ms(ended.unwrap()));
        to_stopped.push(ms(stopped.unwrap()));
        let out = ctr.join().unwrap();
        assert!(
            !out.ok() && out.stderr.contains("cancelled"),
            "{id}: {out:?}"
        );
        e.remove(&id);
    }
    e.remove("plain");

    println!("| calls | n | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| `ctr task ls` (State), shim idle {}",
        summary(&mut idle_state)
    );
    println!(
        "| `ctr task ls` (State), shim restoring {}",
        summary(&mut busy_state)
    );
    println!(
        "| `ctr task metrics` of another container, shim idle {}",
        summary(&mut idle_stats)
    );
    println!(
        "| `ctr task metrics` of another container, shim restoring {}",
        summary(&mut busy_stats)
    );
    println!();
    println!("| kill of a container CRIU is restoring | n | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    println!(
        "| restore `ctr run -d`, not killed (for scale) {}",
        summary(&mut restore_ms)
    );
    println!(
        "| kill -> Start returns (CANCELLED) {}",
        summary(&mut to_start_end)
    );
    println!("| kill -> State says STOPPED {}", summary(&mut to_stopped));
}
