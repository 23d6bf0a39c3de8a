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
    /// Chunks fetched from the registry now, and those an earlier,
    /// interrupted pull of this name and digest had landed (checked again,
    /// not fetched).
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
    /// Chunks fetched, checked (sealed: opened) and written at their
    /// places in the partial pull's files.
    pub fetch: u64,
    /// The partial pull made (its files at their sizes, sparse) or taken
    /// over (the chunks an earlier pull landed checked again), before the
    /// fetch.
    pub assemble: u64,
    /// The content digests of every file.
    pub verify: u64,
    /// fsync, seal, rename.
    pub publish: u64,
    /// A streamed pull's (`--stream-fd`): from the fetch's start until a
    /// restore could start (every chunk CRIU reads itself landed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<u64>,
    /// A streamed pull's: how long the publish waited for the restore to
    /// stop reading the tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readers: Option<u64>,
}

pub(super) fn ms(since: std::time::Instant) -> u64 {
    since.elapsed().as_millis() as u64
}
