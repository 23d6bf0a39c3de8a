//! What the benchmarks (`tests/examples/bench_*.rs`, run by
//! `scripts/bench.sh`) share: their numeric settings from the environment,
//! medians, and the `vsnap` CLI beside the shim asked for JSON.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::cmd::run;
use crate::containerd::shim_binary;

/// The environment variable `name` as a number, or `default`.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The middle value (the upper one of an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
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
