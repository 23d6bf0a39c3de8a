//! Memory images sealed at rest: an artifact's pages files
//! (`images/pages-<id>.img`, the tree's memory, secrets included) stored
//! encrypted with a key only this host can derive, on the capturing host
//! and on every host that pulled a copy.
//!
//! The cipher is a position-addressable stream cipher (AES-256 in CTR mode
//! by default, ChaCha20 the other one a manifest may name): byte `n` of a
//! file is sealed by XOR with byte `n` of its keystream, so a file is
//! sealed in place at its own offsets (a capture), a chunk is sealed where
//! it lands at any offset (a pull), and any piece is opened in the
//! reader's own buffer (the page server), each without reading anything
//! else.
//!
//! Keys: `salt` is 16 random bytes, new for each artifact on each host,
//! recorded in the manifest (`sealed`); the artifact's key is
//! BLAKE3-derived from the host key and the salt, and each file's key from
//! the artifact's key and the file's name. A key is used for one file of
//! one artifact only, so the IV is fixed and the counter follows the byte
//! offset (AES-256-CTR: the IV is zero, the 128-bit counter the 16-byte
//! block's index; ChaCha20: the nonce is the file's 128 GiB span, the
//! counter the 64-byte block in it): no two plaintexts are ever sealed with
//! one keystream position, apart from the same bytes written again at
//! their own place (a resumed pull).
//!
//! Every byte of a sealed file is sealed, a file-system hole's too: a
//! reader opens every byte it reads, so a hole kept as one would open to
//! noise. (A capture's all-zero pages are holes of the pagemap, not of the
//! pages file, which is compacted: they are neither stored nor sealed.)
//!
//! There is no MAC per piece: integrity is the manifest's, whose content
//! digests are taken over the plaintext and MAC'd with the host key. A
//! changed ciphertext byte opens to a changed plaintext byte, and the
//! chunk's digest fails before anything of it is used.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use aes::Aes256;
use ctr::cipher::{KeyIvInit, StreamCipher, StreamCipherSeek};
use serde::{Deserialize, Serialize};

use crate::error::{ArtifactError, Result};
use crate::key::{hex, unhex, HostKey};

/// What a capture and a pull seal with: AES-256-CTR on the CPU's AES
/// instructions opened 4.7 GiB/s per core on this project's x86 machines
/// (release build), ChaCha20 1.95 GiB/s (`cipher_throughput` below,
/// docs/benchmarks.md): every byte of a restore is opened once on the
/// fillers' cores, so the faster cipher costs the restore least. Its
/// 128-bit counter addresses any file size. ChaCha20 stays readable for a
/// host without AES instructions, should one seal with it.
pub const CIPHER: Cipher = Cipher::Aes256Ctr;

const ARTIFACT_KEY: &str = "vsnap 2026-12-07 sealed at rest: artifact key";
const FILE_KEY: &str = "vsnap 2026-12-07 sealed at rest: file key";
const SALT_BYTES: usize = 16;
/// Bytes sealed at a time in place.
const PIECE: usize = 1 << 20;

/// The stream cipher a sealed artifact's files are sealed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Cipher {
    #[serde(rename = "aes-256-ctr")]
    Aes256Ctr,
    /// IETF ChaCha20, a nonce per 128 GiB span of a file.
    #[serde(rename = "chacha20")]
    ChaCha20,
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cipher::Aes256Ctr => "aes-256-ctr",
            Cipher::ChaCha20 => "chacha20",
        })
    }
}

/// How an artifact's pages files are sealed: the manifest's `sealed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sealed {
    pub cipher: Cipher,
    /// 16 random bytes, hex: with the host key, the artifact's key.
    pub salt: String,
}

impl Sealed {
    /// A new artifact's sealing with [`CIPHER`] and a random salt.
    pub fn fresh() -> Result<Self> {
        Self::fresh_with(CIPHER)
    }

    pub fn fresh_with(cipher: Cipher) -> Result<Self> {
        let mut salt = [0u8; SALT_BYTES];
        File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut salt))
            .map_err(|e| ArtifactError::io(Path::new("/dev/urandom"), "read", e))?;
        Ok(Sealed {
            cipher,
            salt: hex(&salt),
        })
    }

    /// What opens (and seals) the artifact's files with this host's `key`.
    pub fn opener(&self, key: &HostKey) -> Result<Opener> {
        let salt = unhex(&self.salt)
            .filter(|s| s.len() == SALT_BYTES)
            .ok_or_else(|| {
                ArtifactError::Invalid(format!(
                    "sealed: salt {:?} is not {SALT_BYTES} bytes of hex",
                    self.salt
                ))
            })?;
        Ok(Opener {
            cipher: self.cipher,
            key: key.derive(ARTIFACT_KEY, &salt),
        })
    }
}

/// Whether the artifact's file `rel` is one sealed at rest: a pages file
/// of its images (every task's, shared memory's too).
pub fn is_sealed(rel: &str) -> bool {
    rel.strip_prefix("images/pages-")
        .and_then(|n| n.strip_suffix(".img"))
        .is_some_and(|n| !n.is_empty() && !n.contains('/'))
}

/// One sealed artifact's key: each of its sealed files' ciphers.
#[derive(Clone)]
pub struct Opener {
    cipher: Cipher,
    key: [u8; 32],
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opener({})", self.cipher)
    }
}

impl Opener {
    /// The cipher of the artifact's file `rel`; None for a file stored in
    /// clear.
    pub fn file(&self, rel: &str) -> Option<FileCipher> {
        is_sealed(rel).then(|| {
            let mut h = blake3::Hasher::new_derive_key(FILE_KEY);
            h.update(&self.key);
            h.update(rel.as_bytes());
            FileCipher {
                cipher: self.cipher,
                key: *h.finalize().as_bytes(),
            }
        })
    }

    pub fn cipher(&self) -> Cipher {
        self.cipher
    }
}

/// One sealed file's keystream.
#[derive(Clone)]
pub struct FileCipher {
    cipher: Cipher,
    key: [u8; 32],
}

impl fmt::Debug for FileCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileCipher({})", self.cipher)
    }
}

impl FileCipher {
    /// `data`, bytes `[at, at + len)` of the file, sealed if they were in
    /// clear, opened if they were sealed (the same XOR with the keystream).
    pub fn apply(&self, at: u64, data: &mut [u8]) {
        match self.cipher {
            Cipher::Aes256Ctr => {
                let mut c = ctr::Ctr128BE::<Aes256>::new(&self.key.into(), &[0u8; 16].into());
                c.seek(at);
                c.apply_keystream(data);
            }
            Cipher::ChaCha20 => self.chacha20(at, data),
        }
    }

    /// IETF ChaCha20 counts 2^32 blocks of 64 bytes (256 GiB) per nonce,
    /// and refuses to reach the end: the file's span of 128 GiB is its
    /// nonce, the offset in the span its counter, so that any offset of any
    /// file size has its own keystream.
    fn chacha20(&self, mut at: u64, mut data: &mut [u8]) {
        const SPAN: u64 = 64 << 31;
        while !data.is_empty() {
            let span = at / SPAN;
            let n = ((span + 1) * SPAN - at).min(data.len() as u64) as usize;
            let mut nonce = [0u8; 12];
            nonce[4..].copy_from_slice(&span.to_le_bytes());
            let mut c = chacha20::ChaCha20::new(&self.key.into(), &nonce.into());
            c.seek(at % SPAN);
            let (head, rest) = std::mem::take(&mut data).split_at_mut(n);
            c.apply_keystream(head);
            at += n as u64;
            data = rest;
        }
    }
}

/// Seals (or opens) every byte of the file at `path` in place; returns
/// its size.
pub fn apply_in_place(path: &Path, c: &FileCipher) -> Result<u64> {
    let file = File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ArtifactError::io(path, "open", e))?;
    let size = file
        .metadata()
        .map_err(|e| ArtifactError::io(path, "stat", e))?
        .len();
    let mut buf = vec![0u8; PIECE];
    let mut at = 0;
    while at < size {
        let n = (size - at).min(PIECE as u64) as usize;
        let piece = &mut buf[..n];
        file.read_exact_at(piece, at)
            .map_err(|e| ArtifactError::io(path, "read", e))?;
        c.apply(at, piece);
        file.write_all_at(piece, at)
            .map_err(|e| ArtifactError::io(path, "write", e))?;
        at += n as u64;
    }
    Ok(size)
}

/// Seals every sealed file of the artifact folder `dir` (its
/// `images/pages-*.img`) in place; returns their names and bytes.
pub fn seal_tree(dir: &Path, opener: &Opener) -> Result<(Vec<String>, u64)> {
    let images = dir.join("images");
    let in_dir = |e| ArtifactError::io(&images, "read", e);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&images).map_err(in_dir)? {
        let entry = entry.map_err(in_dir)?;
        let rel = format!("images/{}", entry.file_name().to_string_lossy());
        if is_sealed(&rel) && entry.file_type().map_err(in_dir)?.is_file() {
            names.push(rel);
        }
    }
    names.sort();
    let mut bytes = 0;
    for rel in &names {
        let c = opener.file(rel).expect("a sealed file");
        bytes += apply_in_place(&dir.join(rel), &c)?;
    }
    Ok((names, bytes))
}

#[cfg(test)]
#[path = "at_rest_tests.rs"]
mod tests;
