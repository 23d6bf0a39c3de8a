//! The shim's side of the metrics journal (vsnap_artifact::journal): every
//! restore and capture outcome, its phases' times and the failed phase,
//! appended under the artifact root for `vsnap metrics`. A journal that
//! cannot be written is logged and never fails the container.

use std::path::{Path, PathBuf};
use std::time::Duration;

use vsnap_artifact::journal::{self, Op, Record};

/// Appends `r` now (for code already off the runtime's threads).
pub fn record_now(root: &Path, r: &Record) {
    if let Err(e) = journal::record(root, r) {
        log::warn!("{}: {e}", r.artifact);
    }
}

/// Appends `r` from a blocking thread (an fsync and a file lock), without
/// holding up the caller.
pub fn record(root: &Path, r: Record) {
    let root: PathBuf = root.to_path_buf();
    tokio::task::spawn_blocking(move || record_now(&root, &r));
}

/// A record of `op` on `artifact` that took `total`.
pub fn outcome(op: Op, artifact: &str, total: Duration) -> Record {
    Record::now(op, artifact, true, total.as_secs_f64())
}

/// A restore refused at create (lock, MAC, host, workload, sizes).
pub fn preflight_failed(root: &Path, artifact: &str, took: Duration) {
    record_now(
        root,
        &outcome(Op::Restore, artifact, took).failed_in("preflight"),
    );
}
