//! Content-defined chunking (FastCDC 2020) of an artifact's files.
//!
//! CRIU writes a process's pages in address order; a second capture of the
//! same engine holds mostly the same pages, but shifted wherever a mapping
//! grew or moved. Fixed-size chunks would all differ after the first shift;
//! content-defined cut points move with the content, so unchanged runs of
//! pages keep their chunks and their digests, and a registry stores them once.
//! A file smaller than the minimum chunk is one chunk.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::crypt::Sealer;
use serde::{Deserialize, Serialize};
use vsnap_artifact::at_rest::FileCipher;

/// FastCDC bounds, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

/// 512 KiB / 2 MiB / 8 MiB, measured on two captures of the reference
/// engine (docs/fleet.md, `tests/examples/fleet_chunking.rs`): of the
/// second capture's 256 MiB, 2.6 MiB were in chunks the first lacked, in
/// 133 chunks; 1 MiB / 4 MiB / 16 MiB needed 78 chunks but 11.1 MiB (every
/// small change costs a whole chunk), 256 KiB / 1 MiB / 4 MiB 231 chunks
/// for 1.7 MiB. Each chunk is a registry request (and a HEAD on push).
pub const PARAMS: Params = Params {
    min: 512 << 10,
    avg: 2 << 20,
    max: 8 << 20,
};

/// One chunk of a file: where it is, and the layer that carries it: its
/// sha256 (`sha256:<hex>`) and size. In clear the layer is the chunk; sealed
/// (crate::crypt) it is the chunk's envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub offset: u64,
    pub len: u64,
    pub digest: String,
    pub size: u64,
}

/// The chunks of everything `source` yields, in order.
pub fn chunk_reader(source: impl Read, params: Params) -> std::io::Result<Vec<Piece>> {
    chunk_reader_sealed(source, params, None)
}

/// As [`chunk_reader`], each chunk's layer sealed with `sealer` when given.
pub fn chunk_reader_sealed(
    source: impl Read,
    params: Params,
    sealer: Option<&Sealer>,
) -> std::io::Result<Vec<Piece>> {
    let cdc = fastcdc::v2020::StreamCDC::new(
        source,
        params.min as usize,
        params.avg as usize,
        params.max as usize,
    );
    let mut pieces = Vec::new();
    for chunk in cdc {
        let chunk = chunk.map_err(std::io::Error::from)?;
        let (digest, size) = match sealer {
            Some(s) => {
                let sealed = s.seal(&chunk.data);
                (crate::sha256_digest(&sealed), sealed.len() as u64)
            }
            None => (crate::sha256_digest(&chunk.data), chunk.length as u64),
        };
        pieces.push(Piece {
            offset: chunk.offset,
            len: chunk.length as u64,
            digest,
            size,
        });
    }
    Ok(pieces)
}

/// The chunks of the regular file at `path` (never through a symlink), and
/// its size; their layers sealed with `sealer` when given.
pub fn chunk_file(
    path: &Path,
    params: Params,
    sealer: Option<&Sealer>,
    opened: Option<&FileCipher>,
) -> std::io::Result<(Vec<Piece>, u64)> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let md = file.metadata()?;
    if !md.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    // Read no further than the size it has now: the caller compares sizes.
    let opened = Opened {
        inner: std::io::BufReader::with_capacity(1 << 20, file.take(md.len())),
        cipher: opened,
        at: 0,
    };
    let pieces = chunk_reader_sealed(opened, params, sealer)?;
    Ok((pieces, md.len()))
}

/// A file sealed at rest read opened: its chunks are of the plaintext.
struct Opened<'c, R> {
    inner: R,
    cipher: Option<&'c FileCipher>,
    at: u64,
}

impl<R: Read> Read for Opened<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(c) = self.cipher {
            c.apply(self.at, &mut buf[..n]);
        }
        self.at += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise (pages of a model's weights look like this).
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    const SMALL: Params = Params {
        min: 4096,
        avg: 16384,
        max: 65536,
    };

    #[test]
    fn chunks_cover_the_input_in_order_within_the_bounds() {
        let data = noise(1 << 20, 1);
        let pieces = chunk_reader(&data[..], SMALL).unwrap();
        let mut at = 0;
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(p.offset, at);
            assert!(p.len <= SMALL.max as u64);
            if i + 1 < pieces.len() {
                assert!(p.len >= SMALL.min as u64);
            }
            let bytes = &data[p.offset as usize..(p.offset + p.len) as usize];
            assert_eq!(p.digest, crate::sha256_digest(bytes));
            at += p.len;
        }
        assert_eq!(at, data.len() as u64);
        assert!(pieces.len() > 20, "{}", pieces.len());
    }

    #[test]
    fn sealed_chunks_cut_alike_and_carry_envelopes() {
        let data = noise(1 << 20, 5);
        let sealer = Sealer::new(&vsnap_artifact::encryption::EncryptionKey::from_secret(
            [9; 32],
        ));
        let plain = chunk_reader(&data[..], SMALL).unwrap();
        let sealed = chunk_reader_sealed(&data[..], SMALL, Some(&sealer)).unwrap();
        assert_eq!(plain.len(), sealed.len());
        for (p, s) in plain.iter().zip(&sealed) {
            assert_eq!((p.offset, p.len), (s.offset, s.len));
            assert_eq!(p.size, p.len);
            assert_eq!(s.size, s.len + crate::crypt::OVERHEAD);
            assert_ne!(p.digest, s.digest);
            let bytes = &data[s.offset as usize..(s.offset + s.len) as usize];
            assert_eq!(s.digest, crate::sha256_digest(&sealer.seal(bytes)));
        }
        assert_eq!(
            chunk_reader_sealed(&data[..], SMALL, Some(&sealer)).unwrap(),
            sealed,
            "deterministic: a second push finds the same blobs"
        );
    }

    #[test]
    fn a_small_file_is_one_chunk_and_an_empty_one_none() {
        assert_eq!(chunk_reader(&b"core"[..], PARAMS).unwrap().len(), 1);
        assert!(chunk_reader(&b""[..], PARAMS).unwrap().is_empty());
    }

    /// Bytes inserted near the start shift everything after them: content-
    /// defined cut points resynchronise, so most chunks keep their digest.
    #[test]
    fn an_insertion_changes_only_the_chunks_around_it() {
        let data = noise(2 << 20, 7);
        let mut shifted = data[..5000].to_vec();
        shifted.extend_from_slice(&noise(777, 9));
        shifted.extend_from_slice(&data[5000..]);
        let a = chunk_reader(&data[..], SMALL).unwrap();
        let b = chunk_reader(&shifted[..], SMALL).unwrap();
        let theirs: std::collections::HashSet<_> = a.iter().map(|p| &p.digest).collect();
        let shared = b.iter().filter(|p| theirs.contains(&p.digest)).count();
        assert!(
            shared + 3 >= b.len(),
            "{shared} of {} chunks shared after a 777-byte insertion",
            b.len()
        );
    }

    #[test]
    fn a_file_is_chunked_without_following_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pages-1.img");
        std::fs::write(&f, noise(300_000, 3)).unwrap();
        let (pieces, size) = chunk_file(&f, SMALL, None, None).unwrap();
        assert_eq!(size, 300_000);
        assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), size);
        std::os::unix::fs::symlink(&f, dir.path().join("link")).unwrap();
        assert!(chunk_file(&dir.path().join("link"), SMALL, None, None).is_err());
    }
}
