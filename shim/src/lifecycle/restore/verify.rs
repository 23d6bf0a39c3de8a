//! The verification of a restore: every byte of the artifact hashed against
//! its manifest's digests, stopping between chunks once the start is
//! stopped. Beside CRIU where CRIU holds the restored tree stopped (criu.rs
//! runs it in the background), before CRIU where it cannot (GPUs:
//! verify_first.rs).

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::snapshot::artifact_error;
use crate::snapshot::plan::RestorePlan;
use crate::snapshot::DIGEST_THREADS;
use vsnap_artifact::{content, ArtifactError, Contents};

/// What a restore verifies: every file of `dir` against `contents`.
pub struct Verify {
    pub dir: PathBuf,
    pub contents: Contents,
    /// Beside CRIU (which leaves the tree stopped until then) or first.
    pub beside_criu: bool,
    /// Files hashed already (the carried writable layer, at create) or by
    /// the page server as it places them (pages.rs).
    pub hashed_elsewhere: Vec<String>,
    /// What opens the pages files sealed at rest, as they are hashed.
    pub sealed: Option<vsnap_artifact::at_rest::Opener>,
}

/// A verification under way, in a blocking thread.
pub type Verifying = JoinHandle<std::result::Result<Duration, ArtifactError>>;

impl Verify {
    /// What a snapshot restore verifies; None without `verify_contents`.
    /// The pages files the page server checks as it places them are left
    /// to it.
    pub fn of(s: &RestorePlan) -> Option<Self> {
        let mut hashed_elsewhere = s.verified_at_create.clone();
        hashed_elsewhere.extend(s.pages.iter().flat_map(|p| p.verified_files()));
        Some(Verify {
            dir: s.common.artifact_dir(),
            contents: s.contents.clone()?,
            beside_criu: s.holds_stopped(),
            hashed_elsewhere,
            sealed: s.sealed.clone(),
        })
    }

    /// Starts hashing; it stops between chunks once `stop` is set, and a
    /// mismatch cancels the restore through `cancel`.
    pub fn spawn(
        self,
        stop: Arc<AtomicBool>,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Verifying {
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let threads = if self.beside_criu {
                threads_beside_criu()
            } else {
                DIGEST_THREADS
            };
            let verified = content::verify_except_until(
                &self.dir,
                &self.contents,
                threads,
                &self.hashed_elsewhere,
                self.sealed.as_ref(),
                &stop,
            );
            if verified.is_err() {
                cancel.cancel();
            }
            verified.map(|()| started.elapsed())
        })
    }
}

/// The verification's result: how long it took, or the damage it found.
pub async fn joined(verifying: Option<Verifying>, deadline: &Deadline) -> Result<Duration> {
    let Some(h) = verifying else {
        return Ok(Duration::ZERO);
    };
    h.await
        .map_err(|e| Error::Other(e.to_string()))?
        .map_err(|e| match e {
            // A kill or the deadline stopped it: that is the error.
            ArtifactError::Stopped(m) => deadline.fail(format!("restore: verify: {m}")),
            e => artifact_error("restore: verify", e),
        })
}

/// Hashing threads while CRIU restores: one core is left to CRIU, which
/// places pages with one thread (on 2 cores, two hashing threads beside it
/// made the CRIU phase of a 1 GiB restore ~1.2-1.4x a stock runc restore;
/// one BLAKE3 thread still hashes faster than CRIU places the pages).
fn threads_beside_criu() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.saturating_sub(1).clamp(1, DIGEST_THREADS)
}
