//! Benchmark: restores against the machine's limits, warm and cold, in one
//! run on one private containerd and one artifact of the reference engine
//! (`BENCH_RESIDENT_MB` of memory it never releases, 2048 by default, which
//! lands in the CRIU image).
//!
//! - **fill limit**: `pread` of the artifact's largest image file into
//!   freshly mapped anonymous memory, one thread per core, 4 KiB pages,
//!   from the page cache (`vsnap_e2e::bench::fill`), right before each round
//!   of warm restores; the median;
//! - **huge-page fill limit**: the same into a mapping advised
//!   `MADV_HUGEPAGE`, right after it; the restores of a second artifact,
//!   the engine's resident block advised `MADV_HUGEPAGE`
//!   (`VSNAP_ENGINE_RESIDENT_HUGE=1`), are held to it;
//! - **disk**: the cold read of all the image files (after dropping the
//!   page cache), by `cat images/*` and by `dd bs=16M` of each file, right
//!   before each round of cold restores; the faster of the two medians;
//! - **restores**: `ctr run -d` of the restore (it returns once the copy
//!   validated its canary and listens), `BENCH_RUNS` with a warm page cache
//!   and `BENCH_COLD_RUNS` right after dropping it, interleaved. Throughput
//!   = image bytes / (wall time - the engine's activation), so that the
//!   engine's own recovery does not count; the shim's phases come from
//!   `vsnap-restore.json`;
//! - the two ratios the restore is held to: warm / fill limit, cold / disk,
//!   as medians against medians, and as the median of each restore against
//!   the limit measured in its own round (a shared machine's rates drift
//!   by the minute, the disk's most).
//!
//! With `BENCH_COMPARE` (a line of runtime config, e.g.
//! `page_placement = "criu"`) every restore is also run under the config
//! with that line, in ABBA order, and reported beside; a line that acts at
//! capture (`seal_at_rest = false`, `elide_zero_pages = false`) has an
//! artifact of its own, captured under it. `BENCH_COMPARE=
//! no-criu-cache` instead runs the second case's restores with CRIU's
//! kernel-probe cache taken away (on a host whose `/run` is no tmpfs,
//! where `vsnap host criu-cache` put it: CRIU then probes in every run).
//! With `BENCH_AGAINST` (another shim binary: the build before a change)
//! every restore is also run by that shim, in the same containerd, ABBA,
//! of an artifact of the same engine that shim captured itself (the build
//! before a change may not read the artifact format of this one).
//!
//! Run by `scripts/bench.sh restore-limits` (release builds). Environment:
//! BENCH_RUNS (warm restores per configuration, 5), BENCH_COLD_RUNS (cold
//! restores per configuration and disk reads, 3), BENCH_RESIDENT_MB
//! (2048), BENCH_COMPARE, BENCH_KEEP_LOGS (a folder: each restore's CRIU
//! log and `vsnap-restore.json`, and containerd's log, copied there).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use vsnap_e2e::bench::{criu_cache, criu_cache_off, drop_caches, env_num, fill, median, use_shim};
use vsnap_e2e::cmd::run;
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{setup, Env};

/// One restore's wall time and the shim's phases, in ms.
#[derive(Clone, Copy)]
struct Restore {
    wall: f64,
    preflight: f64,
    verify: f64,
    criu: f64,
    fill: f64,
    activation: f64,
    listener: f64,
    /// From `ctr run -d`'s start to the shim's Create (ctr, containerd,
    /// the shim's start), and from the shim's record of the timings (just
    /// before Start answers) to ctr's exit; NaN where the shim does not
    /// record the two moments.
    before_shim: f64,
    after_shim: f64,
    /// The limit measured in this restore's round (the fill limit warm,
    /// the faster of `cat` and `dd` cold).
    limit: f64,
}

impl Restore {
    /// Image bytes / (wall - activation), GB/s.
    fn throughput(&self, bytes: u64) -> f64 {
        gbs(bytes, (self.wall - self.activation) / 1000.0)
    }

    /// Everything but CRIU's work and the engine's activation: preflight,
    /// spec, the shim's and ctr's round trips, the listener probe.
    fn own(&self) -> f64 {
        self.wall - self.criu - self.activation
    }
}

fn restore(e: &Env, id: &str, artifact: &str, env: &[String]) -> Restore {
    let extra: Vec<&str> = env.iter().flat_map(|kv| ["--env", kv.as_str()]).collect();
    let cmd = e.run_command(id, "restore", artifact, free_port(), &extra, &[]);
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let (t, began) = (Instant::now(), unix());
    let out = run(cmd, None, Duration::from_secs(600));
    let wall = t.elapsed().as_secs_f64() * 1000.0;
    let ended = unix();
    eprintln!("bench: {id}: `ctr run -d` {wall:.1} ms");
    assert!(out.ok(), "{id}: {out:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.bundle(id).join("vsnap-restore.json")).unwrap())
            .unwrap();
    if let Ok(keep) = std::env::var("BENCH_KEEP_LOGS") {
        // CRIU's own log of the restore (timestamped), for a closer look.
        let log = e.bundle(id).join("criu-work/restore.log");
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(log, Path::new(&keep).join(format!("{id}-restore.log")));
        let _ = std::fs::write(
            Path::new(&keep).join(format!("{id}.json")),
            json.to_string(),
        );
    }
    e.remove(id);
    let ms = |k: &str| json[k].as_f64().unwrap_or(0.0);
    let at = |k: &str| json[k].as_f64().unwrap_or(f64::NAN);
    Restore {
        wall,
        preflight: ms("preflight_ms"),
        verify: ms("verify_ms"),
        criu: ms("criu_restore_ms"),
        fill: ms("page_fill_ms"),
        activation: ms("activation_ms"),
        listener: ms("listener_ms"),
        before_shim: (at("create_began_unix_s") - began) * 1000.0,
        after_shim: (ended - at("recorded_unix_s")) * 1000.0,
        limit: f64::NAN,
    }
}

/// Seconds `sh -c script` took (it must succeed).
fn timed_sh(script: &str) -> f64 {
    let t = Instant::now();
    let ok = Command::new("sh")
        .args(["-c", script])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{script}");
    t.elapsed().as_secs_f64()
}

fn image_files(images: &Path) -> Vec<(PathBuf, u64)> {
    let mut files: Vec<(PathBuf, u64)> = std::fs::read_dir(images)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| (e.path(), e.metadata().unwrap().len()))
        .collect();
    files.sort();
    files
}

fn gbs(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// A runtime configuration the restores run under: the bench's own, or
/// that with `BENCH_COMPARE`'s line appended.
struct Case {
    name: String,
    config: String,
    /// Whether CRIU finds its kernel-probe cache in this case's restores.
    criu_cache: bool,
    /// The shim binary containerd runs for them (`BENCH_AGAINST`), else the
    /// one under test.
    shim: Option<PathBuf>,
    /// The engine's resident block advised `MADV_HUGEPAGE` (its own
    /// artifact): held to the huge-page fill limit.
    huge: bool,
    /// Restores an artifact of its own, captured under its config (a
    /// line of capture-time config: `seal_at_rest`, `elide_zero_pages`).
    own_artifact: bool,
    /// Its artifact's image bytes.
    bytes: u64,
    warm: Vec<Restore>,
    cold: Vec<Restore>,
}

fn main() {
    let warm_runs = env_num("BENCH_RUNS", 5).max(1) as usize;
    let cold_runs = env_num("BENCH_COLD_RUNS", 3).max(1) as usize;
    let resident = format!(
        "VSNAP_ENGINE_RESIDENT_MB={}",
        env_num("BENCH_RESIDENT_MB", 2048)
    );
    let compare = std::env::var("BENCH_COMPARE").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let e = setup("bench-limits");
    let base = std::fs::read_to_string(&e.config).unwrap();
    let (kdat, removable) = criu_cache(Path::new(&e.config));
    let mut cases = vec![Case {
        name: "defaults".into(),
        config: base.clone(),
        criu_cache: true,
        shim: None,
        huge: false,
        own_artifact: false,
        bytes: 0,
        warm: Vec::new(),
        cold: Vec::new(),
    }];
    if compare.trim() == NO_CRIU_CACHE {
        assert!(
            removable,
            "{NO_CRIU_CACHE}: CRIU keeps {} on a tmpfs run folder itself here",
            kdat.display()
        );
        cases.push(Case {
            name: "without CRIU's kernel-probe cache".into(),
            config: base.clone(),
            criu_cache: false,
            shim: None,
            huge: false,
            own_artifact: false,
            bytes: 0,
            warm: Vec::new(),
            cold: Vec::new(),
        });
    } else if !compare.trim().is_empty() {
        cases.push(Case {
            name: format!("`{}`", compare.trim()),
            config: format!("{base}{}\n", compare.trim()),
            criu_cache: true,
            shim: None,
            huge: false,
            own_artifact: CAPTURE_KEYS.iter().any(|k| compare.trim().starts_with(k)),
            bytes: 0,
            warm: Vec::new(),
            cold: Vec::new(),
        });
    }
    if let Ok(against) = std::env::var("BENCH_AGAINST") {
        let against = std::fs::canonicalize(&against)
            .unwrap_or_else(|e| panic!("BENCH_AGAINST={against}: {e}"));
        cases.push(Case {
            name: format!("shim {}", against.display()),
            config: base.clone(),
            criu_cache: true,
            shim: Some(against),
            huge: false,
            own_artifact: false,
            bytes: 0,
            warm: Vec::new(),
            cold: Vec::new(),
        });
    }
    // The same engine with its resident block eligible for huge pages.
    cases.push(Case {
        name: "resident block `MADV_HUGEPAGE`".into(),
        config: base.clone(),
        criu_cache: true,
        shim: None,
        huge: true,
        own_artifact: false,
        bytes: 0,
        warm: Vec::new(),
        cold: Vec::new(),
    });
    let huge_env = [resident.clone(), "VSNAP_ENGINE_RESIDENT_HUGE=1".to_string()];
    eprintln!("bench: creating the artifacts ({resident}, and with huge pages advised)");
    e.create_good("donor", "big", &[&resident]);
    e.create_good("donor-huge", "big-huge", &[&huge_env[0], &huge_env[1]]);
    if let Some(against) = cases.iter().find_map(|c| c.shim.clone()) {
        use_shim(&e, Some(&against));
        e.create_good("donor-against", "big-against", &[&resident]);
        use_shim(&e, None);
    }
    if let Some(c) = cases.iter().find(|c| c.own_artifact) {
        std::fs::write(&e.config, &c.config).unwrap();
        e.create_good("donor-compare", "big-compare", &[&resident]);
        std::fs::write(&e.config, &base).unwrap();
    }
    let images = e.artifact("big").join("images");
    let files = image_files(&images);
    let bytes: u64 = files.iter().map(|f| f.1).sum();
    let largest = files.iter().max_by_key(|f| f.1).unwrap().clone();
    let huge_bytes: u64 = image_files(&e.artifact("big-huge").join("images"))
        .iter()
        .map(|f| f.1)
        .sum();
    for c in &mut cases {
        c.bytes = if c.huge { huge_bytes } else { bytes };
    }
    let dir = images.display().to_string();

    let dd_all = format!(
        "for f in '{dir}'/*; do dd if=\"$f\" of=/dev/null bs=16M status=none || exit 1; done"
    );
    let cat_all = format!("cat '{dir}'/* > /dev/null");
    let (mut fills, mut cat, mut dd) = (Vec::new(), Vec::new(), Vec::new());
    let mut huge_fills = Vec::new();

    // Per round: the fill limit, then each case warm (ABBA across rounds);
    // then, while cold runs are due, the disk's cold rate and each case
    // right after a drop of the page cache. Each limit is measured right
    // before the restores held to it: a shared machine's rates drift by the
    // minute.
    timed_sh(&cat_all);
    let mut n = 0;
    let mut cache_on = true;
    for round in 0..warm_runs.max(cold_runs) {
        let mut order: Vec<usize> = (0..cases.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for cold in [false, true] {
            if (cold && round >= cold_runs) || (!cold && round >= warm_runs) {
                continue;
            }
            let limit = if cold {
                drop_caches();
                dd.push(gbs(bytes, timed_sh(&dd_all)));
                drop_caches();
                cat.push(gbs(bytes, timed_sh(&cat_all)));
                cat[cat.len() - 1].max(dd[dd.len() - 1])
            } else {
                eprintln!("bench: the fill limit");
                let (b, s) = fill(std::slice::from_ref(&largest.0), cores, false);
                fills.push(gbs(b, s));
                let (b, s) = fill(std::slice::from_ref(&largest.0), cores, true);
                huge_fills.push(gbs(b, s));
                fills[fills.len() - 1]
            };
            for &k in &order {
                n += 1;
                let id = format!("r{n}");
                std::fs::write(&e.config, &cases[k].config).unwrap();
                // Taken away or put back only when this case differs from
                // the one before.
                if cases[k].criu_cache != cache_on {
                    match cases[k].criu_cache {
                        true => drop(criu_cache(Path::new(&e.config))),
                        false => criu_cache_off(&kdat),
                    }
                    cache_on = cases[k].criu_cache;
                }
                use_shim(&e, cases[k].shim.as_deref());
                if cold {
                    drop_caches();
                }
                let state = if cold { "cold" } else { "warm" };
                eprintln!("bench: restore {id}, {state} page cache, {}", cases[k].name);
                let (artifact, env, limit) = match cases[k].huge {
                    true if !cold => ("big-huge", &huge_env[..], huge_fills[huge_fills.len() - 1]),
                    true => ("big-huge", &huge_env[..], limit),
                    false if cases[k].own_artifact => {
                        ("big-compare", std::slice::from_ref(&resident), limit)
                    }
                    false if cases[k].shim.is_some() => {
                        ("big-against", std::slice::from_ref(&resident), limit)
                    }
                    false => ("big", std::slice::from_ref(&resident), limit),
                };
                let r = Restore {
                    limit,
                    ..restore(&e, &id, artifact, env)
                };
                match cold {
                    true => cases[k].cold.push(r),
                    false => cases[k].warm.push(r),
                }
            }
        }
        timed_sh(&cat_all);
    }
    std::fs::write(&e.config, base).unwrap();
    if !cache_on {
        criu_cache(Path::new(&e.config));
    }
    if let Ok(keep) = std::env::var("BENCH_KEEP_LOGS") {
        let _ = std::fs::copy(
            e.c.dir.join("containerd.log"),
            Path::new(&keep).join("containerd.log"),
        );
    }
    report(&Report {
        cores,
        kdat: format!(
            "{} ({})",
            kdat.display(),
            match removable {
                true => "bind-mounted from a tmpfs by `vsnap host criu-cache`",
                false => "on a tmpfs run folder, CRIU's own",
            }
        ),
        bytes,
        files: files.len(),
        largest: largest.1,
        fill_limit: median(fills.clone()),
        fills,
        huge_fill_limit: median(huge_fills.clone()),
        huge_fills,
        disk: median(cat.clone()).max(median(dd.clone())),
        cat,
        dd,
        cases,
    });
}

/// The keys of a `BENCH_COMPARE` line that act at capture: its case
/// restores an artifact captured under it.
const CAPTURE_KEYS: [&str; 2] = ["seal_at_rest", "elide_zero_pages"];

/// `BENCH_COMPARE`'s value that compares restores without CRIU's cache.
const NO_CRIU_CACHE: &str = "no-criu-cache";

struct Report {
    cores: usize,
    kdat: String,
    bytes: u64,
    files: usize,
    largest: u64,
    fills: Vec<f64>,
    fill_limit: f64,
    huge_fills: Vec<f64>,
    huge_fill_limit: f64,
    cat: Vec<f64>,
    dd: Vec<f64>,
    disk: f64,
    cases: Vec<Case>,
}

fn list(xs: &[f64]) -> String {
    xs.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The median restore throughput (image bytes / (wall - activation)).
fn throughput(bytes: u64, rs: &[Restore]) -> f64 {
    median(rs.iter().map(|r| r.throughput(bytes)).collect())
}

/// The median of each restore's throughput against the limit measured in
/// its own round.
fn paired(bytes: u64, rs: &[Restore]) -> f64 {
    median(rs.iter().map(|r| r.throughput(bytes) / r.limit).collect())
}

fn report(r: &Report) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "machine: {} cores, load average {}",
        r.cores,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("CRIU's kernel-probe cache: {}", r.kdat);
    println!(
        "artifact: {} image files, {:.3} GB (largest {:.3} GB); GB = 10^9 bytes",
        r.files,
        r.bytes as f64 / 1e9,
        r.largest as f64 / 1e9
    );
    println!();
    println!("| limit | runs (GB/s) | median GB/s |");
    println!("|---|---|---:|");
    println!(
        "| fill: `pread` of the largest image into fresh memory, {} threads, 4 KiB pages | {} | {:.2} |",
        r.cores,
        list(&r.fills),
        r.fill_limit
    );
    println!(
        "| fill as above, the mapping `MADV_HUGEPAGE` (huge pages) | {} | {:.2} |",
        list(&r.huge_fills),
        r.huge_fill_limit
    );
    println!(
        "| disk, cold: `cat images/*` | {} | {:.2} |",
        list(&r.cat),
        median(r.cat.clone())
    );
    println!(
        "| disk, cold: `dd bs=16M` of each image | {} | {:.2} |",
        list(&r.dd),
        median(r.dd.clone())
    );
    println!();
    println!("| configuration | page cache | n | image bytes / (wall - activation), GB/s | against | ratio | each against its round's limit, median |");
    println!("|---|---|---:|---:|---|---:|---:|");
    for c in &r.cases {
        let warm = match c.huge {
            true => ("huge-page fill limit", r.huge_fill_limit),
            false => ("fill limit", r.fill_limit),
        };
        for (state, rs, limit_name, limit) in [
            ("warm", &c.warm, warm.0, warm.1),
            ("cold", &c.cold, "disk", r.disk),
        ] {
            let gbs = throughput(c.bytes, rs);
            println!(
                "| {} | {state} | {} | {gbs:.2} | {limit_name} {limit:.2} | **{:.2}** | **{:.2}** |",
                c.name,
                rs.len(),
                gbs / limit,
                paired(c.bytes, rs)
            );
        }
    }
    for c in &r.cases {
        println!();
        println!("{}, phases (median ms):", c.name);
        println!();
        phases(c);
    }
}

fn phases(c: &Case) {
    println!("| phase | warm | cold |");
    println!("|---|---:|---:|");
    let row = |name: &str, f: &dyn Fn(&Restore) -> f64| {
        let m = |rs: &[Restore]| median(rs.iter().map(f).collect());
        println!("| {name} | {:.1} | {:.1} |", m(&c.warm), m(&c.cold));
    };
    row("`ctr run -d` wall", &|x| x.wall);
    row("preflight (in Create)", &|x| x.preflight);
    row(
        "CRIU restore (`runc restore`, placement, verification)",
        &|x| x.criu,
    );
    row("  of it: CRIU's own restore, before the placement", &|x| {
        x.criu - x.fill
    });
    row("  of it: page placement after CRIU's own restore", &|x| {
        x.fill
    });
    row("  verification of the other files (beside CRIU)", &|x| {
        x.verify
    });
    row("activation + canary (the engine)", &|x| x.activation);
    row("listener probe", &|x| x.listener);
    row(
        "restore's own time: wall - CRIU restore - activation",
        &|x| x.own(),
    );
    row(
        "  of it: ctr and containerd until the shim's Create",
        &|x| x.before_shim,
    );
    row(
        "  of it: the shim (Create, Start outside CRIU and activation)",
        &|x| x.own() - x.before_shim - x.after_shim,
    );
    row("  of it: containerd and ctr after the shim's Start", &|x| {
        x.after_shim
    });
}
