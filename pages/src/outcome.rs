//! What the page server placed (why it could not: `crate::error`).

use std::time::Duration;

/// What the server placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placed {
    pub tasks: usize,
    pub bytes: u64,
    /// Of `bytes`, those in VMAs eligible for huge pages, written through
    /// the kernel's fault path (`huge.rs`) rather than `UFFDIO_COPY`.
    pub huge_bytes: u64,
    /// Eligible bytes placed in 4 KiB pages all the same (`huge_pages`:
    /// `never`, or past the host's free 2 MiB blocks under `when-free`).
    pub huge_declined_bytes: u64,
    /// The host's free 2 MiB blocks when the server chose (`when-free`).
    pub huge_free_blocks: Option<u64>,
    pub faults: u64,
    /// From the end of CRIU's restore to the last page in place.
    pub fill: Duration,
    /// Of `fill`, the fillers' wait for a slot of the host's budget (all
    /// fillers' waits added up).
    pub slot_wait: Duration,
    /// What this restore was to the others of its artifact (`pages/share`):
    /// "leader", "follower", or none (alone).
    pub share_role: Option<&'static str>,
    /// Chunks placed from another restore's sealed copy, not read here.
    pub chunks_from_share: u64,
    /// Chunks read, hashed and placed here.
    pub chunks_read: u64,
    /// A leader's: chunks it sent to at least one follower.
    pub chunks_shared_out: u64,
    /// A streamed restore's: when the last bytes it waited for arrived
    /// (ms since the epoch), as the pull recorded it.
    pub last_arrival_ms: Option<u64>,
}
