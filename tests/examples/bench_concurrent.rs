//! Benchmark: eight restores of one artifact started at once, against the
//! machine's 4 KiB fill limit measured in the same run, on one private
//! containerd (a node that boots with eight GPUs starts eight engines from
//! one artifact).
//!
//! - **first**: the artifact written back and read once (warm), and one
//!   restore by each shim, not counted;
//! - **fill limit**: `pread` of the artifact's largest image file into
//!   freshly mapped anonymous memory, one thread per core, 4 KiB pages,
//!   warm (`vsnap_e2e::bench::fill`), right before each round;
//! - **a round**: `BENCH_COPIES` (8) `ctr run -d` of the restore started
//!   together (each returns once its copy validated its canary and
//!   listens); the wall time until the last returned; each copy's phases
//!   from its `vsnap-restore.json`; every copy's answers compared with a
//!   cold-started engine's;
//! - **aggregate placement**: the bytes the copies' page servers placed,
//!   all together, / the slowest copy's placement (`page_fill_ms`: from the
//!   end of its CRIU restore to its last page in place), against the
//!   round's fill limit.
//!
//! With `BENCH_AGAINST` (another shim binary: the build before a change)
//! each round also runs the copies under that shim, in the same
//! containerd, ABBA across rounds; with `BENCH_SHARE_OFF=1`, under this
//! shim with `share_pages = false` (each copy reads and hashes every chunk
//! itself). Run by `scripts/bench.sh concurrent` (release builds).
//! Environment: BENCH_RUNS (rounds per case, 2), BENCH_COPIES (8),
//! BENCH_RESIDENT_MB (1024).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{env_num, fill, median, use_shim};
use vsnap_e2e::cmd::run;
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, setup, Env};

/// One copy's phases, in ms, and the bytes its page server placed.
struct Copy {
    wall: f64,
    criu: f64,
    fill: f64,
    slot_wait: f64,
    verify: f64,
    activation: f64,
    placed: u64,
    /// Chunks placed from another copy's sealed chunk, and read itself.
    from_share: f64,
    read: f64,
}

/// One round of a shim: the copies started together.
struct Round {
    /// From the start of the first `ctr run -d` to the last one's return.
    all_serve: f64,
    copies: Vec<Copy>,
    /// The fill limit measured right before the round, GB/s.
    limit: f64,
}

impl Round {
    /// All copies' placed bytes / the slowest copy's placement, GB/s.
    fn aggregate(&self) -> f64 {
        let bytes: u64 = self.copies.iter().map(|c| c.placed).sum();
        let slowest = self.copies.iter().map(|c| c.fill).fold(0.0, f64::max);
        bytes as f64 / (slowest / 1000.0) / 1e9
    }
}

struct Case {
    name: String,
    shim: Option<PathBuf>,
    /// A line added to the runtime config for its rounds.
    config: Option<&'static str>,
    rounds: Vec<Round>,
}

fn copy_of(e: &Env, id: &str, wall: f64) -> Copy {
    let path = e.bundle(id).join("vsnap-restore.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let ms = |k: &str| json[k].as_f64().unwrap_or(f64::NAN);
    Copy {
        wall,
        criu: ms("criu_restore_ms"),
        fill: ms("page_fill_ms"),
        slot_wait: ms("page_slot_wait_ms"),
        verify: ms("verify_ms"),
        activation: ms("activation_ms"),
        placed: json["pages_placed_bytes"].as_u64().unwrap_or(0),
        from_share: ms("page_chunks_from_share"),
        read: ms("page_chunks_read"),
    }
}

/// `copies` restores started together; each answers like `reference`.
fn round(e: &Env, tag: &str, copies: usize, resident: &str, reference: &[Answer]) -> Round {
    let started = Instant::now();
    let runs: Vec<_> = (0..copies)
        .map(|k| {
            let (id, port) = (format!("{tag}-{k}"), free_port());
            let cmd = e.run_command(&id, "restore", "big", port, &["--env", resident], &[]);
            let t = Instant::now();
            let h = std::thread::spawn(move || {
                let out = run(cmd, None, Duration::from_secs(600));
                (out, t.elapsed().as_secs_f64() * 1000.0)
            });
            (id, port, h)
        })
        .collect();
    let mut done = Vec::new();
    for (id, port, h) in runs {
        let (out, wall) = h.join().unwrap();
        assert!(out.ok(), "{id}: {out:?}");
        done.push((id, port, wall));
    }
    let all_serve = started.elapsed().as_secs_f64() * 1000.0;
    eprintln!("bench: {tag}: {copies} copies serve after {all_serve:.0} ms");
    let copies = done
        .iter()
        .map(|(id, port, wall)| {
            assert_eq!(answers(*port), reference, "{id} answers like a cold start");
            copy_of(e, id, *wall)
        })
        .collect();
    for (id, _, _) in &done {
        e.remove(id);
    }
    Round {
        all_serve,
        copies,
        limit: f64::NAN,
    }
}

type Answer = (serde_json::Value, serde_json::Value, serde_json::Value);

fn main() {
    let runs = env_num("BENCH_RUNS", 2).max(1) as usize;
    let copies = env_num("BENCH_COPIES", 8).max(1) as usize;
    let resident_mb = env_num("BENCH_RESIDENT_MB", 1024);
    let resident = format!("VSNAP_ENGINE_RESIDENT_MB={resident_mb}");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let e = setup("bench-concurrent");
    let mut cases = vec![Case {
        name: "this shim".into(),
        shim: None,
        config: None,
        rounds: Vec::new(),
    }];
    if std::env::var("BENCH_SHARE_OFF").is_ok_and(|v| v == "1") {
        cases.push(Case {
            name: "this shim, `share_pages = false`".into(),
            shim: None,
            config: Some("share_pages = false\n"),
            rounds: Vec::new(),
        });
    }
    if let Ok(against) = std::env::var("BENCH_AGAINST") {
        let against = std::fs::canonicalize(&against)
            .unwrap_or_else(|err| panic!("BENCH_AGAINST={against}: {err}"));
        cases.push(Case {
            name: format!("shim {}", against.display()),
            shim: Some(against),
            config: None,
            rounds: Vec::new(),
        });
    }
    let config = std::fs::read_to_string(&e.config).unwrap();
    let use_case = |c: &Case| {
        use_shim(&e, c.shim.as_deref());
        let text = config.clone() + c.config.unwrap_or("");
        std::fs::write(&e.config, text).unwrap();
    };
    let reference = answers(HostEngine::start().port);
    e.mount_points_in_rootfs();
    eprintln!("bench: creating the artifact ({resident})");
    e.create_good("donor", "big", &[&resident]);
    let largest = vsnap_e2e::snapshot_env::largest_image(&e.artifact("big"), true);
    let image_bytes: u64 = vsnap_e2e::containerd::list(&e.artifact("big").join("images"))
        .iter()
        .map(|n| std::fs::metadata(e.artifact("big").join("images").join(n)).map_or(0, |m| m.len()))
        .sum();
    // The artifact just written: its pages on the disk and in the page
    // cache before the first round, which would otherwise pay for both.
    let warm = format!(
        "sync && cat '{}'/* > /dev/null",
        e.artifact("big").join("images").display()
    );
    let ok = std::process::Command::new("sh")
        .args(["-c", &warm])
        .status();
    assert!(ok.is_ok_and(|s| s.success()), "{warm}");
    // One restore by each shim, not counted: in three runs without it the
    // first round (always the shim under test's) was the slowest of all.
    for (k, c) in cases.iter().enumerate() {
        use_case(c);
        round(&e, &format!("w{k}"), 1, &resident, &reference);
    }
    let mut fills = Vec::new();
    for r in 0..runs {
        let mut order: Vec<usize> = (0..cases.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let (b, s) = fill(std::slice::from_ref(&largest), cores, false);
            let limit = b as f64 / s / 1e9;
            fills.push(limit);
            use_case(&cases[k]);
            eprintln!(
                "bench: round {r}, {}: fill limit {limit:.2} GB/s",
                cases[k].name
            );
            let tag = format!("c{r}{k}");
            let round = Round {
                limit,
                ..round(&e, &tag, copies, &resident, &reference)
            };
            cases[k].rounds.push(round);
        }
    }
    use_case(&cases[0]);
    e.assert_nothing_left();
    report(cores, copies, image_bytes, &fills, &cases);
}

fn list(xs: impl Iterator<Item = f64>, digits: usize) -> String {
    xs.map(|x| format!("{x:.digits$}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(cores: usize, copies: usize, image_bytes: u64, fills: &[f64], cases: &[Case]) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "machine: {cores} cores, load average {}; artifact: {:.3} GB of images; GB = 10^9 bytes",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        image_bytes as f64 / 1e9
    );
    println!();
    println!(
        "fill limit (`pread` of the largest image into fresh memory, {cores} threads, 4 KiB pages), before each round: {} GB/s, median {:.2}",
        list(fills.iter().copied(), 2),
        median(fills.to_vec())
    );
    println!();
    println!("| shim | rounds | {copies} copies all serve, ms | aggregate placement, GB/s | against the round's fill limit | slowest copy's placement, ms |");
    println!("|---|---:|---|---|---|---|");
    for c in cases {
        let rs = &c.rounds;
        println!(
            "| {} | {} | {} | {} | **{}** | {} |",
            c.name,
            rs.len(),
            list(rs.iter().map(|r| r.all_serve), 0),
            list(rs.iter().map(Round::aggregate), 2),
            list(rs.iter().map(|r| r.aggregate() / r.limit), 2),
            list(
                rs.iter()
                    .map(|r| r.copies.iter().map(|c| c.fill).fold(0.0, f64::max)),
                0
            ),
        );
    }
    for c in cases {
        println!();
        println!(
            "{}, each copy's phases (ms; min / median / max over every copy of every round):",
            c.name
        );
        println!();
        println!("| phase | min | median | max |");
        println!("|---|---:|---:|---:|");
        let all: Vec<&Copy> = c.rounds.iter().flat_map(|r| &r.copies).collect();
        let row = |name: &str, f: &dyn Fn(&Copy) -> f64| {
            let xs: Vec<f64> = all.iter().map(|c| f(c)).filter(|x| !x.is_nan()).collect();
            if xs.is_empty() {
                println!("| {name} | - | - | - |");
                return;
            }
            let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            println!(
                "| {name} | {min:.0} | {:.0} | {max:.0} |",
                median(xs.clone())
            );
        };
        row("`ctr run -d` wall", &|x| x.wall);
        row("CRIU restore (`runc restore`, placement)", &|x| x.criu);
        row("  of it: page placement after CRIU's own restore", &|x| {
            x.fill
        });
        row(
            "    of it: the fillers' wait for a slot, all fillers added",
            &|x| x.slot_wait,
        );
        row("    chunks placed from another copy's (share)", &|x| {
            x.from_share
        });
        row("    chunks read and hashed itself", &|x| x.read);
        row("verification of the other files (beside CRIU)", &|x| {
            x.verify
        });
        row("activation + canary (the engine)", &|x| x.activation);
    }
}
