//! What a pull tells: the artifact, its chunks fetched and reused, and the
//! milliseconds of each phase.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    pub name: String,
    pub reference: String,
    pub digest: String,
    pub path: String,
    pub files: usize,
    pub bytes: u64,
    /// Distinct chunks (layers) of the artifact.
    pub chunks: usize,
    /// Chunks fetched from the registry now, and those already in the
    /// download cache (an earlier, interrupted pull).
    pub fetched: usize,
    pub fetched_bytes: u64,
    pub reused: usize,
    pub reused_bytes: u64,
    /// The trusted fleet key whose signature verified.
    pub signed_by: String,
    /// The fleet encryption key id it was decrypted with; None: it was
    /// stored in clear.
    pub decrypted_with: Option<String>,
    /// Where the time went.
    pub timings_ms: PullTimings,
}

/// Milliseconds of each phase of a pull.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PullTimings {
    /// Manifest, signature and config.
    pub resolve: u64,
    /// Chunks into the download cache (and cached ones hashed again).
    pub fetch: u64,
    /// Files written in the staging folder from the cache (sealed chunks
    /// opened, on every core).
    pub assemble: u64,
    /// The content digests of every file.
    pub verify: u64,
    /// fsync, seal, rename.
    pub publish: u64,
}

pub(super) fn ms(since: std::time::Instant) -> u64 {
    since.elapsed().as_millis() as u64
}
impl PullReport {
    /// Counts the chunks fetched now and those the cache already held.
    pub(super) fn count(&mut self, fetched: Vec<(bool, u64)>) {
        for (was_fetched, len) in fetched {
            if was_fetched {
                self.fetched += 1;
                self.fetched_bytes += len;
            } else {
                self.reused += 1;
                self.reused_bytes += len;
            }
        }
    }
}
