//! What the benchmarks (`tests/examples/bench_*.rs`, run by
//! `scripts/bench.sh`) share: their numeric settings from the environment,
//! medians, and the `vsnap` CLI beside the shim asked for JSON.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::cmd::run;
use crate::containerd::shim_binary;

/// With `BENCH_LINK_MBPS` set, a proxy in front of `registry` that gives
/// the pull's 4 connections that many MB/s between them; else none.
pub fn link(registry: &crate::registry::Registry) -> Option<crate::registry::SlowProxy> {
    std::env::var("BENCH_LINK_MBPS").ok().map(|_| {
        let per_connection = env_num("BENCH_LINK_MBPS", 125) * 1_000_000 / 4;
        crate::registry::SlowProxy::start(registry.port, per_connection)
    })
}

/// The environment variable `name` as a number, or `default`.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The middle value (the upper one of an even count) of the values that
/// are numbers; NaN when none is.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.retain(|x| !x.is_nan());
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `vsnap --config CONFIG ARGS... --json` (the CLI beside the shim), its
/// answer; panics naming the command when it fails.
pub fn vsnap_json(config: &Path, args: &[&str]) -> serde_json::Value {
    let mut cmd = Command::new(shim_binary().with_file_name("vsnap"));
    cmd.arg("--config").arg(config).args(args).arg("--json");
    let out = run(cmd, None, Duration::from_secs(600));
    assert!(out.ok(), "vsnap {args:?}: {out:?}");
    serde_json::from_str(&out.stdout).unwrap()
}

/// CRIU's kernel-probe cache on this host (`vsnap host criu-cache`, run
/// with `config`): its path, and whether the bench may take it away
/// (`state` "mounted": vsnap put it there; "own": CRIU keeps it on a tmpfs
/// run folder itself).
pub fn criu_cache(config: &Path) -> (std::path::PathBuf, bool) {
    let v = vsnap_json(config, &["host", "criu-cache"]);
    let path = std::path::PathBuf::from(v["cache"].as_str().unwrap());
    (path, v["state"] == "mounted")
}

/// Takes the cache `criu_cache` mounted at `path` away (every layer), so
/// that the next CRIU probes the kernel as on a host without it.
pub fn criu_cache_off(path: &Path) {
    loop {
        let rows = vsnap_host::mountinfo::own().unwrap();
        if !rows.iter().any(|r| r.mount_point == path) {
            return;
        }
        let ok = Command::new("umount")
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "umount {}", path.display());
    }
}

/// Points containerd's shim (a link in the instance's `bin`, which
/// containerd runs for each new container) at `shim`, or back at the one
/// under test (`BENCH_AGAINST`: the build before a change).
pub fn use_shim(e: &crate::snapshot_env::Env, shim: Option<&Path>) {
    let link = e.c.dir.join("bin").join(crate::containerd::SHIM_NAME);
    let target = shim.map_or_else(shim_binary, Path::to_path_buf);
    let tmp = link.with_extension("next");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(tmp, link).unwrap();
}

/// Drops the page cache, machine-wide (`sync; echo 3 > drop_caches`), so
/// that the next read of a file comes from the disk.
pub fn drop_caches() {
    let ok = Command::new("sh")
        .args(["-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "drop the page cache (as root)");
}

/// The machine's fresh-memory fill rate: `threads` threads `pread` the
/// bytes of `paths` into one freshly mapped private anonymous region
/// (each page faulted, zeroed and filled, as a restore must place it), in
/// the page server's order (`vsnap_pages::chunks`: 64 MiB chunks, file by
/// file, to whichever thread asks next, each read in 8 MiB pieces
/// straight into its place); with `huge` the region is first
/// `madvise(MADV_HUGEPAGE)`d. Returns the bytes and the seconds the fill
/// took (the mapping's set-up and tear-down not counted).
pub fn fill(paths: &[std::path::PathBuf], threads: usize, huge: bool) -> (u64, f64) {
    use vsnap_pages::chunks::{fillers, read_chunk, Chunks};
    let files: Vec<std::fs::File> = paths
        .iter()
        .map(|p| std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    let sizes: Vec<u64> = files.iter().map(|f| f.metadata().unwrap().len()).collect();
    let total: u64 = sizes.iter().sum();
    assert!(total > 0 && threads > 0, "no bytes to place, or no threads");
    // Where each file's bytes go in the region.
    let starts: Vec<u64> = sizes
        .iter()
        .scan(0, |at, s| {
            *at += s;
            Some(*at - s)
        })
        .collect();
    // 2 MiB aligned and long, so huge pages can back all of it.
    let align = vsnap_pages::uffd::HUGE_PAGE;
    let len = (total as usize).div_ceil(align) * align;
    let region = vsnap_pages::uffd::Region::map(len, true).expect("mmap");
    let advice = if huge {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    region.advise(advice).expect("madvise");
    let base = region.addr as usize;
    let chunks = Chunks::of(&sizes);
    let piece = 8 << 20;
    let t = std::time::Instant::now();
    let filled = fillers(
        threads,
        |_| {
            while let Some(c) = chunks.next() {
                let dest = base + (starts[c.file] + c.start) as usize;
                // SAFETY: each chunk writes its own range of the region.
                let buf =
                    unsafe { std::slice::from_raw_parts_mut(dest as *mut u8, c.len() as usize) };
                read_chunk(&files[c.file], "a pages file", c, piece, buf, |_, _| Ok(()))?;
            }
            Ok(())
        },
        || {},
    );
    filled.expect("pread");
    let secs = t.elapsed().as_secs_f64();
    drop(region);
    (total, secs)
}

/// A restore's preflight, CRIU and activation phases in ms, as
/// `"P | C | A"`, from the `vsnap-restore.json` of the task's `bundle`;
/// None without one (a start that restored nothing).
pub fn restore_phases(bundle: &Path) -> Option<String> {
    let bytes = std::fs::read(bundle.join("vsnap-restore.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let ms = |k: &str| v[k].as_f64().unwrap_or(0.0);
    Some(format!(
        "{:.0} | {:.0} | {:.0}",
        ms("preflight_ms"),
        ms("criu_restore_ms"),
        ms("activation_ms")
    ))
}
