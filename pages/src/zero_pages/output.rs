//! The compacted pages file's output, on a thread of its own: the kept
//! pages written down the file where they go, and hashed, as the
//! compaction hands them over. The hash is the file's content digest, so
//! the capture's digest pass skips the file (`content::digest_with`) and
//! each page is read once; the writes and the hash run beside the reads
//! and zero checks, on the second core.
//!
//! A write never reaches bytes the compaction has yet to read: each piece
//! is handed over once read, and its kept pages go no further down the
//! file than where the piece ended.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

use vsnap_artifact::content::WrittenDigest;
use vsnap_artifact::FileDigest;

/// Buffers in flight: one being filled, one being written and hashed, one
/// waiting.
const BUFFERS: usize = 3;

/// A piece handed over: its buffer, how many of its first bytes are kept,
/// and where they go in the file (`None`: they are there already).
struct Kept {
    buf: Vec<u8>,
    len: usize,
    write_at: Option<u64>,
}

/// Hands buffers to the compaction and takes them back filled, in the
/// file's order, for the output thread.
pub(super) struct Output<'scope> {
    to_write: SyncSender<Kept>,
    free: Receiver<Vec<u8>>,
    /// Buffers not yet allocated.
    unmade: usize,
    len: usize,
    thread: ScopedJoinHandle<'scope, Result<FileDigest, String>>,
}

impl<'scope> Output<'scope> {
    /// Starts the output thread of `file` (`name` in errors) in `scope`;
    /// buffers hold `len` bytes.
    pub(super) fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        file: &'scope File,
        name: &'scope str,
        len: usize,
    ) -> Self {
        let (to_write, kept) = mpsc::sync_channel::<Kept>(BUFFERS);
        let (give_back, free) = mpsc::sync_channel::<Vec<u8>>(BUFFERS);
        let thread = scope.spawn(move || {
            let mut digest = WrittenDigest::new();
            let mut failed = None;
            for k in kept {
                if failed.is_none() {
                    failed = write(file, name, &k).err();
                    digest.update(&k.buf[..k.len]);
                }
                // The compaction may be done and gone: then no one wants it.
                let _ = give_back.send(k.buf);
            }
            failed.map_or(Ok(digest.finish()), Err)
        });
        Output {
            to_write,
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
            .expect("the output thread hands every buffer back")
    }

    /// The file's next `len` bytes, the first of `buf`: written at
    /// `write_at` (`None`: they are in place), and hashed.
    pub(super) fn put(&mut self, buf: Vec<u8>, len: usize, write_at: Option<u64>) {
        self.to_write
            .send(Kept { buf, len, write_at })
            .expect("the output thread runs until the sender is dropped");
    }

    /// Once every write is done: the digest of every byte handed over, or
    /// the first write's error.
    pub(super) fn finish(self) -> Result<FileDigest, String> {
        drop(self.to_write);
        match self.thread.join() {
            Ok(d) => d,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

fn write(file: &File, name: &str, k: &Kept) -> Result<(), String> {
    let Some(at) = k.write_at.filter(|_| k.len > 0) else {
        return Ok(());
    };
    file.write_all_at(&k.buf[..k.len], at)
        .map_err(|e| format!("write {} bytes at {at} of {name}: {e}", k.len))
}
