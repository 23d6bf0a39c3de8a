//! Checking chunks as their bytes are used: a chunk hashed piece by piece
//! by its reader, and a file read as a stream.

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

#[cfg(test)]
mod tests {
    use super::super::testing::artifact;
    use super::super::{digest, verify, verify_except};
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
}
