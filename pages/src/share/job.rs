//! What the two sides of the share agree on: a chunk's length, the bound
//! on chunks held, and what a follower's filler does next.

use vsnap_artifact::content::CHUNK;

use super::chunk::Mapping;

/// The most chunks shared and still held by a follower at once (64 MiB of
/// memory each): past it the leader places its chunks as a lone restore
/// does and tells the followers to read them themselves.
pub(super) const IN_FLIGHT: usize = 8;

/// What a follower's filler does next.
pub(crate) enum Job {
    /// Chunk `chunk` of file `file`: read, hash and place it.
    Read { file: usize, chunk: usize },
    /// Place it from the leader's sealed chunk, checked already.
    Shared {
        file: usize,
        chunk: usize,
        map: Mapping,
    },
}

/// The length of chunk `chunk` of a file of `size` bytes.
pub(super) fn chunk_len(size: u64, chunk: usize) -> u64 {
    let start = chunk as u64 * CHUNK;
    (start + CHUNK).min(size).saturating_sub(start)
}

/// The chunks of a file of `size` bytes.
pub(super) fn chunks(size: u64) -> usize {
    size.div_ceil(CHUNK) as usize
}
