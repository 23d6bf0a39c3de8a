//! Chunk digests taken as a file's bytes stream by: a chunk hashed piece by
//! piece by its reader, a file read as a stream and checked, and a file's
//! digest taken by the code that writes it, as it writes it
//! ([`WrittenDigest`]: the shim's compaction of the page images, so the
//! capture's digest pass, [`digest_with`](super::digest_with), need not
//! read the file again).

use std::path::Path;

use super::check::{chunk_mismatch, damaged};
use super::{FileDigest, CHUNK};
use crate::error::Result;

/// One chunk's digest computed piece by piece, as
/// [`verify`](super::verify) computes it: for a reader that hashes the bytes
/// it also uses (the shim's page server places each piece into the restored
/// memory right after hashing it).
#[derive(Default)]
pub struct ChunkDigest(blake3::Hasher);

impl ChunkDigest {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Whether the bytes hashed are chunk `chunk` of `digest`; otherwise
    /// the error [`verify`](super::verify) gives for it (naming `dir`,
    /// `rel`, the chunk and its byte range).
    pub fn check(&self, dir: &Path, rel: &str, digest: &FileDigest, chunk: usize) -> Result<()> {
        let got = self.0.finalize().to_hex().to_string();
        if digest.chunks.get(chunk).map(String::as_str) == Some(got.as_str()) {
            return Ok(());
        }
        Err(chunk_mismatch(dir, rel, chunk, digest.size))
    }
}

/// Reads one covered file front to back (`inner`), checking each chunk
/// against its digest as the bytes pass: for a file used as a stream (the
/// carried writable layer, unpacked at a restore's create), so it is read
/// once. A chunk that does not match, or a size other than the recorded
/// one, is an `InvalidData` error naming the file and the chunk, at the
/// latest when the stream ends.
pub struct VerifyingReader<R> {
    inner: R,
    dir: std::path::PathBuf,
    rel: String,
    digest: FileDigest,
    chunk: usize,
    in_chunk: u64,
    total: u64,
    hasher: ChunkDigest,
    ended: bool,
}

impl<R: std::io::Read> VerifyingReader<R> {
    pub fn new(inner: R, dir: &Path, rel: &str, digest: &FileDigest) -> Self {
        VerifyingReader {
            inner,
            dir: dir.to_path_buf(),
            rel: rel.to_string(),
            digest: digest.clone(),
            chunk: 0,
            in_chunk: 0,
            total: 0,
            hasher: ChunkDigest::new(),
            ended: false,
        }
    }

    /// Reads what is left (a stream's reader may stop before the end), so
    /// every byte is checked; the error names the damage.
    pub fn finish(mut self) -> std::io::Result<()> {
        std::io::copy(&mut self, &mut std::io::sink()).map(drop)
    }

    fn check_chunk(&mut self) -> std::io::Result<()> {
        let checked = self
            .hasher
            .check(&self.dir, &self.rel, &self.digest, self.chunk);
        self.hasher = ChunkDigest::new();
        self.chunk += 1;
        self.in_chunk = 0;
        checked.map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
    }
}

impl<R: std::io::Read> std::io::Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.ended {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        let size = self.digest.size;
        let bad = |what: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                damaged(&self.dir, &self.rel, what).to_string(),
            )
        };
        if n == 0 && !buf.is_empty() {
            self.ended = true;
            if self.total != size {
                return Err(bad(format!(
                    "holds {} bytes, the manifest says {size}",
                    self.total
                )));
            }
            if self.in_chunk > 0 {
                self.check_chunk()?;
            }
            return Ok(0);
        }
        if self.total + n as u64 > size {
            return Err(bad(format!(
                "holds more than the {size} bytes the manifest says"
            )));
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let take = rest.len().min((CHUNK - self.in_chunk) as usize);
            self.hasher.update(&rest[..take]);
            self.in_chunk += take as u64;
            rest = &rest[take..];
            if self.in_chunk == CHUNK {
                self.check_chunk()?;
            }
        }
        self.total += n as u64;
        Ok(n)
    }
}

/// The digest of a file's bytes handed over in order, from its first: the
/// same [`FileDigest`] as [`digest`](super::digest) takes of a file that
/// holds those bytes.
#[derive(Default)]
pub struct WrittenDigest {
    chunks: Vec<String>,
    hasher: blake3::Hasher,
    in_chunk: u64,
    size: u64,
}

impl WrittenDigest {
    pub fn new() -> Self {
        Self::default()
    }

    /// The file's next `bytes`, right after those handed over before.
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.size += bytes.len() as u64;
        while !bytes.is_empty() {
            let take = bytes.len().min((CHUNK - self.in_chunk) as usize);
            self.hasher.update(&bytes[..take]);
            self.in_chunk += take as u64;
            bytes = &bytes[take..];
            if self.in_chunk == CHUNK {
                self.end_chunk();
            }
        }
    }

    /// The bytes handed over so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The digest of a file that holds exactly the bytes handed over.
    pub fn finish(mut self) -> FileDigest {
        if self.in_chunk > 0 {
            self.end_chunk();
        }
        FileDigest {
            size: self.size,
            chunks: self.chunks,
        }
    }

    fn end_chunk(&mut self) {
        self.chunks
            .push(self.hasher.finalize().to_hex().to_string());
        self.hasher.reset();
        self.in_chunk = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::artifact;
    use super::super::{digest, digest_with, verify, verify_except, Contents};
    use super::*;

    #[test]
    fn a_stream_is_checked_chunk_by_chunk_as_it_is_read() {
        use std::io::Read;
        let dir = artifact();
        let c = digest(dir.path(), 1).unwrap();
        let rel = "images/pages-1.img";
        let bytes = std::fs::read(dir.path().join(rel)).unwrap();
        let mut r = VerifyingReader::new(&bytes[..], dir.path(), rel, &c[rel]);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), bytes.len());
        // One byte changed in the second chunk: named when that chunk ends.
        let mut bad = bytes.clone();
        bad[CHUNK as usize + 7] ^= 1;
        let err = VerifyingReader::new(&bad[..], dir.path(), rel, &c[rel])
            .finish()
            .unwrap_err();
        assert!(
            err.to_string().contains("images/pages-1.img chunk 1"),
            "{err}"
        );
        // Shorter than recorded.
        let err = VerifyingReader::new(&bytes[..100], dir.path(), rel, &c[rel])
            .finish()
            .unwrap_err();
        assert!(err.to_string().contains("holds 100 bytes"), "{err}");
    }

    #[test]
    fn a_chunk_hashed_in_pieces_checks_like_verify() {
        let dir = artifact();
        let c = digest(dir.path(), 1).unwrap();
        let rel = "images/pages-1.img";
        let bytes = std::fs::read(dir.path().join(rel)).unwrap();
        let chunk = &bytes[CHUNK as usize..2 * CHUNK as usize];
        let mut d = ChunkDigest::new();
        for piece in chunk.chunks(3 << 20) {
            d.update(piece);
        }
        d.check(dir.path(), rel, &c[rel], 1).unwrap();
        // Its file left to that reader, the rest still verified in full.
        let mut bytes = bytes;
        bytes[5] ^= 1;
        std::fs::write(dir.path().join(rel), &bytes).unwrap();
        verify_except(dir.path(), &c, 2, &[rel.to_string()]).unwrap();
        assert!(verify(dir.path(), &c, 2).is_err());
        let e = d
            .check(dir.path(), rel, &c[rel], 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("damaged") && e.contains("images/pages-1.img chunk 0 (bytes 0-67108863)"),
            "{e}"
        );
    }

    #[test]
    fn bytes_handed_over_in_any_pieces_digest_as_the_file_does() {
        let dir = artifact();
        let c = digest(dir.path(), 2).unwrap();
        for rel in ["images/pages-1.img", "images/core-1.img"] {
            let bytes = std::fs::read(dir.path().join(rel)).unwrap();
            for piece in [1 << 20, 4096 * 3 + 1, bytes.len().max(1)] {
                let mut d = WrittenDigest::new();
                for p in bytes.chunks(piece) {
                    d.update(p);
                }
                assert_eq!(d.size(), bytes.len() as u64);
                assert_eq!(d.finish(), c[rel], "{rel} in pieces of {piece}");
            }
        }
        // An empty file has no chunk, as digest records it.
        std::fs::write(dir.path().join("control/empty"), b"").unwrap();
        let c = digest(dir.path(), 1).unwrap();
        assert_eq!(WrittenDigest::new().finish(), c["control/empty"]);
    }

    #[test]
    fn digests_taken_as_written_are_kept_and_the_rest_read() {
        let dir = artifact();
        let whole = digest(dir.path(), 2).unwrap();
        let rel = "images/pages-1.img";
        let mut d = WrittenDigest::new();
        d.update(&std::fs::read(dir.path().join(rel)).unwrap());
        let written = Contents::from([(rel.to_string(), d.finish())]);
        assert_eq!(digest_with(dir.path(), 2, written.clone()).unwrap(), whole);

        // Not read again: a digest handed over is taken as it is...
        let mut other = written.clone();
        other.get_mut(rel).unwrap().chunks[0] = "0".repeat(64);
        let got = digest_with(dir.path(), 1, other.clone()).unwrap();
        assert_eq!(got[rel], other[rel]);
        // ...but only for a covered file of that size.
        let mut short = written.clone();
        short.get_mut(rel).unwrap().size -= 1;
        let e = digest_with(dir.path(), 1, short).unwrap_err().to_string();
        assert!(
            e.contains("images/pages-1.img holds") && e.contains("hashed as it was written"),
            "{e}"
        );
        let stray = Contents::from([("work/dump.log".to_string(), written[rel].clone())]);
        let e = digest_with(dir.path(), 1, stray).unwrap_err().to_string();
        assert!(
            e.contains("work/dump.log") && e.contains("not a covered file"),
            "{e}"
        );
    }
}
