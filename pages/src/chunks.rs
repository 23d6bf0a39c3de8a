//! The fillers' work, as the server does it and the probes of
//! `tests/examples` measure it: the pages files cut into 64 MiB chunks
//! (the unit of their digests), taken in order by whichever filler asks
//! next; each chunk read a piece at a time into the filler's own
//! page-aligned buffer (`UFFDIO_COPY` wants a page-aligned source).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use vsnap_artifact::content::CHUNK;

use crate::error::{PageError, Phase};
use crate::images::PAGE_SIZE;

/// Bytes a filler reads, hashes and places at once.
pub const PIECE: u64 = 2 << 20;

/// One chunk of one file: bytes `[start, end)` of file `file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub file: usize,
    pub index: usize,
    pub start: u64,
    pub end: u64,
}

impl Chunk {
    /// Chunk `index` of file `file`, of `size` bytes.
    pub fn of(file: usize, size: u64, index: usize) -> Self {
        let start = index as u64 * CHUNK;
        Chunk {
            file,
            index,
            start,
            end: (start + CHUNK).min(size).max(start),
        }
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Every chunk of files of `sizes`, file by file, handed out in order to
/// whichever filler asks next.
pub struct Chunks {
    list: Vec<Chunk>,
    next: AtomicUsize,
}

impl Chunks {
    pub fn of(sizes: &[u64]) -> Self {
        let list = sizes
            .iter()
            .enumerate()
            .flat_map(|(f, &size)| {
                (0..size.div_ceil(CHUNK) as usize).map(move |c| Chunk::of(f, size, c))
            })
            .collect();
        Chunks {
            list,
            next: AtomicUsize::new(0),
        }
    }

    /// The next chunk nobody took yet; `None` once all are taken.
    pub fn next(&self) -> Option<Chunk> {
        self.list
            .get(self.next.fetch_add(1, Ordering::Relaxed))
            .copied()
    }

    /// How many chunks were handed out so far (what a reader ahead of the
    /// fillers follows).
    pub fn taken(&self) -> usize {
        self.next.load(Ordering::Relaxed).min(self.list.len())
    }

    /// How many chunks there are, taken or not.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Runs `fill(k)` on `threads` threads at once (fillers `0..threads`)
/// and returns the first error to happen. `failed` is called as soon as
/// one fails, so the others can stop (their own errors, a cancellation
/// most likely, are not the cause); a filler that panics fails too.
pub fn fillers(
    threads: usize,
    fill: impl Fn(usize) -> Result<(), PageError> + Sync,
    failed: impl Fn() + Sync,
) -> Result<(), PageError> {
    let first = std::sync::Mutex::new(None);
    let fail = |e: PageError| {
        first.lock().expect("lock").get_or_insert(e);
        failed();
    };
    std::thread::scope(|s| {
        let running: Vec<_> = (0..threads.max(1))
            .map(|k| {
                let (fill, fail) = (&fill, &fail);
                s.spawn(move || fill(k).map_err(fail))
            })
            .collect();
        for f in running {
            if f.join().is_err() {
                fail(PageError::failed(Phase::Place, "a filler", "panicked"));
            }
        }
    });
    match first.into_inner().expect("lock") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Reads `chunk` of `file` (`name` in errors) in pieces of `piece` bytes
/// and hands each to `each` with its offset in the file. Each piece is
/// read to the start of `buf`, or, where `buf` holds the whole chunk (a
/// memfd shared with other restores), to its own place in it.
pub fn read_chunk(
    file: &File,
    name: &str,
    chunk: Chunk,
    piece: u64,
    buf: &mut [u8],
    mut each: impl FnMut(u64, &mut [u8]) -> Result<(), PageError>,
) -> Result<(), PageError> {
    let whole = buf.len() as u64 >= chunk.len();
    let mut at = chunk.start;
    while at < chunk.end {
        let n = piece.min(chunk.end - at);
        let from = if whole {
            (at - chunk.start) as usize
        } else {
            0
        };
        let data = &mut buf[from..from + n as usize];
        file.read_exact_at(data, at).map_err(|e| {
            PageError::failed(Phase::Read, name, format!("read {n} bytes at {at}: {e}"))
        })?;
        each(at, data)?;
        at += n;
    }
    Ok(())
}

/// A page-aligned buffer of a filler's own.
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by one thread at a time.
unsafe impl Send for Buffer {}

impl Buffer {
    pub fn new(len: usize) -> Self {
        let layout =
            std::alloc::Layout::from_size_align(len, PAGE_SIZE as usize).expect("a layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "out of memory for a {len}-byte buffer");
        Buffer { ptr, len }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len, PAGE_SIZE as usize).expect("a layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn chunks_are_taken_in_file_then_offset_order() {
        let chunks = Chunks::of(&[CHUNK + 5, 0, 3]);
        assert_eq!(chunks.len(), 3);
        let got: Vec<_> = std::iter::from_fn(|| chunks.next()).collect();
        assert_eq!(
            got,
            [
                Chunk {
                    file: 0,
                    index: 0,
                    start: 0,
                    end: CHUNK
                },
                Chunk {
                    file: 0,
                    index: 1,
                    start: CHUNK,
                    end: CHUNK + 5
                },
                Chunk {
                    file: 2,
                    index: 0,
                    start: 0,
                    end: 3
                },
            ]
        );
        assert_eq!(chunks.next(), None, "each chunk once");
        assert_eq!(chunks.taken(), 3);
    }

    #[test]
    fn every_filler_runs_and_the_first_failure_stops_the_others() {
        let ran = Mutex::new(Vec::new());
        let run = |k| {
            ran.lock().unwrap().push(k);
            Ok(())
        };
        fillers(3, run, || {}).unwrap();
        let mut ran = ran.into_inner().unwrap();
        ran.sort();
        assert_eq!(ran, [0, 1, 2]);
        // Filler 1 fails; filler 0, joined first, stops as told: the cause
        // is filler 1's error, not filler 0's cancellation.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let e = fillers(
            2,
            |k| match k {
                1 => Err(PageError::failed(Phase::Place, "pid 1", "gone")),
                _ => {
                    while !stop.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                    Err(PageError::cancelled(Phase::Place))
                }
            },
            || stop.store(true, Ordering::SeqCst),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "place: pid 1: gone");
    }

    #[test]
    fn a_chunk_is_read_piece_by_piece() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages-1.img");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let chunk = Chunk::of(0, bytes.len() as u64, 0);
        let mut got = Vec::new();
        let mut buf = Buffer::new(4096);
        read_chunk(
            &file,
            "pages-1.img",
            chunk,
            4096,
            buf.as_mut_slice(),
            |at, d| {
                got.push((at, d.len()));
                assert_eq!(d, &bytes[at as usize..at as usize + d.len()]);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(got, [(0, 4096), (4096, 4096), (8192, 1808)]);
        let past = Chunk {
            end: 20_000,
            ..chunk
        };
        let e = read_chunk(
            &file,
            "pages-1.img",
            past,
            4096,
            buf.as_mut_slice(),
            |_, _| Ok(()),
        );
        let e = e.unwrap_err().to_string();
        assert!(
            e.starts_with("read: pages-1.img: read 4096 bytes at 8192"),
            "{e}"
        );
    }
}
