//! Hashing an artifact's files chunk by chunk on several threads, each
//! chunk read a piece at a time.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::CHUNK;
use crate::at_rest::{FileCipher, Opener};
use crate::error::{ArtifactError, Result};

pub(super) fn chunk_count(size: u64) -> usize {
    size.div_ceil(CHUNK) as usize
}

/// One unit of work: a chunk of a file.
struct Unit {
    file: usize,
    chunk: usize,
}

/// Hashes the given chunks with `threads` threads; `each(file, chunk,
/// digest)` sees every result. Stops early once `each` returns an error.
pub(super) fn hash_chunks(
    dir: &Path,
    files: &[(String, File, u64)],
    threads: usize,
    each: &(dyn Fn(usize, usize, String) -> Result<()> + Sync),
) -> Result<()> {
    let never = AtomicBool::new(false);
    hash_chunks_until(dir, files, threads, &|_, _| false, each, None, &never)
}

/// As [`hash_chunks`], stopping (with [`ArtifactError::Stopped`]) before the
/// next chunk once `stop` is set: a chunk takes tens of milliseconds.
/// The chunks `skip(file, chunk)` names are not hashed (nor given to
/// `each`). With `opener`, the files sealed at rest are hashed opened
/// (their digests are of the plaintext).
pub(super) fn hash_chunks_until(
    dir: &Path,
    files: &[(String, File, u64)],
    threads: usize,
    skip: &(dyn Fn(usize, usize) -> bool + Sync),
    each: &(dyn Fn(usize, usize, String) -> Result<()> + Sync),
    opener: Option<&Opener>,
    stop: &AtomicBool,
) -> Result<()> {
    let units: Vec<Unit> = files
        .iter()
        .enumerate()
        .flat_map(|(file, (_, _, size))| {
            (0..chunk_count(*size)).map(move |chunk| Unit { file, chunk })
        })
        .filter(|u| !skip(u.file, u.chunk))
        .collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<ArtifactError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut buf = vec![0u8; PIECE];
                while !failed.load(Ordering::Relaxed) {
                    if stop.load(Ordering::Relaxed) {
                        failed.store(true, Ordering::Relaxed);
                        let e = ArtifactError::Stopped(format!(
                            "{}: verification stopped before its end",
                            dir.display()
                        ));
                        first_error.lock().expect("lock").get_or_insert(e);
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(u) = units.get(i) else { break };
                    let (rel, file, size) = &files[u.file];
                    let start = u.chunk as u64 * CHUNK;
                    let len = (size - start).min(CHUNK);
                    let sealed = opener.and_then(|o| o.file(rel));
                    let result = hash_range(file, &mut buf, start, len, sealed.as_ref())
                        .map_err(|e| ArtifactError::io(&dir.join(rel), "read", e))
                        .and_then(|digest| each(u.file, u.chunk, digest));
                    if let Err(e) = result {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().expect("lock").get_or_insert(e);
                    }
                }
            });
        }
    });
    match first_error.into_inner().expect("lock") {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Bytes read (and hashed) at a time: small enough to stay in the CPU's
/// cache between the copy out of the page cache and the hash (hashing whole
/// 64 MiB chunks streamed every byte through memory twice).
const PIECE: usize = 1 << 20;

/// The digest of chunk `chunk` of `file` (`size` bytes), read a piece at a
/// time and opened with `sealed` where sealed at rest.
pub(super) fn hash_chunk(
    file: &File,
    size: u64,
    chunk: usize,
    sealed: Option<&FileCipher>,
) -> std::io::Result<String> {
    let start = chunk as u64 * CHUNK;
    let len = size.saturating_sub(start).min(CHUNK);
    hash_range(file, &mut vec![0u8; PIECE], start, len, sealed)
}

/// The digest of `len` bytes of `file` at `start`, read `buf.len()` at a
/// time (and opened with `sealed`); a file that got shorter meanwhile is an
/// error. The same digest as hashing the range at once.
fn hash_range(
    file: &File,
    buf: &mut [u8],
    start: u64,
    len: u64,
    sealed: Option<&FileCipher>,
) -> std::io::Result<String> {
    let mut hasher = blake3::Hasher::new();
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], start + done)?;
        if let Some(c) = sealed {
            c.apply(start + done, &mut buf[..n]);
        }
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    Ok(hasher.finalize().to_hex().to_string())
}

#[cfg(test)]
mod tests {
    use super::super::testing::artifact;
    use super::*;

    #[test]
    fn pieces_hash_like_the_whole() {
        let dir = artifact();
        let path = dir.path().join("images/pages-1.img");
        let bytes = std::fs::read(&path).unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = vec![0u8; 1000];
        let start = CHUNK + 5;
        let len = bytes.len() as u64 - start;
        let got = hash_range(&file, &mut buf, start, len, None).unwrap();
        assert_eq!(
            got,
            blake3::hash(&bytes[start as usize..]).to_hex().to_string()
        );
    }
}
