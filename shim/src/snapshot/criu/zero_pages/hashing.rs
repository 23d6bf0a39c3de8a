//! The compacted pages file's content digest, taken on a thread of its own
//! from the bytes the compaction keeps, as it keeps them: the capture's
//! digest pass then skips the file (`content::digest_with`), so each page
//! is read once, and the hash runs beside the compaction on the second
//! core rather than after it.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

use vsnap_artifact::content::WrittenDigest;
use vsnap_artifact::FileDigest;

/// Buffers in flight: one being filled, one being hashed, one waiting.
const BUFFERS: usize = 3;

/// A buffer of `len` bytes and how many of its first bytes are the file's.
type Filled = (Vec<u8>, usize);

/// Hands buffers to the compaction and takes them back filled, in the
/// file's order, for the hashing thread.
pub(super) struct Hashing<'scope> {
    to_hash: SyncSender<Filled>,
    free: Receiver<Vec<u8>>,
    /// Buffers not yet allocated.
    unmade: usize,
    len: usize,
    thread: ScopedJoinHandle<'scope, FileDigest>,
}

impl<'scope> Hashing<'scope> {
    /// Starts the hashing thread in `scope`; buffers hold `len` bytes.
    pub(super) fn start<'env>(scope: &'scope Scope<'scope, 'env>, len: usize) -> Self {
        let (to_hash, filled) = mpsc::sync_channel::<Filled>(BUFFERS);
        let (give_back, free) = mpsc::sync_channel::<Vec<u8>>(BUFFERS);
        let thread = scope.spawn(move || {
            let mut digest = WrittenDigest::new();
            for (buf, n) in filled {
                digest.update(&buf[..n]);
                // The compaction may be done and gone: then no one wants it.
                let _ = give_back.send(buf);
            }
            digest.finish()
        });
        Hashing {
            to_hash,
            free,
            unmade: BUFFERS,
            len,
            thread,
        }
    }

    /// A buffer to read the next piece into (its bytes are stale).
    pub(super) fn buffer(&mut self) -> Vec<u8> {
        if let Ok(buf) = self.free.try_recv() {
            return buf;
        }
        if self.unmade > 0 {
            self.unmade -= 1;
            return vec![0u8; self.len];
        }
        // Every buffer is out, so the thread holds one and gives it back.
        self.free
            .recv()
            .expect("the hashing thread hands every buffer back")
    }

    /// The file's next `n` bytes, the first of `buf`.
    pub(super) fn hash(&mut self, buf: Vec<u8>, n: usize) {
        self.to_hash
            .send((buf, n))
            .expect("the hashing thread runs until the sender is dropped");
    }

    /// The digest of every byte handed over.
    pub(super) fn finish(self) -> FileDigest {
        drop(self.to_hash);
        match self.thread.join() {
            Ok(d) => d,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
