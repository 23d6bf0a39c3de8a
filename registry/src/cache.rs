//! The pull's download cache, `<root>/.pull/blobs/sha256/<hex>`:
//! content-addressed, so an interrupted pull resumes by keeping the blobs it
//! already has. A blob is written to `<hex>.part-<pid>-<n>`, hashed while it
//! streams, and renamed to its digest only when its size and sha256 match:
//! a name without `.part` is a complete blob. One left by an earlier run is
//! hashed again before it is used (disks rot; a reused blob is checked
//! once), and removed if it no longer matches.

use std::fs::{DirBuilder, File};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::Digest;

use crate::error::{RegistryError, Result};
use crate::sha256_hex;

static PART: AtomicU64 = AtomicU64::new(0);

pub struct BlobCache {
    pub dir: PathBuf,
}

impl BlobCache {
    /// `<root>/.pull/blobs/sha256`, created 0700; partial downloads of
    /// pulls that died are removed.
    pub fn open(root: &Path) -> Result<Self> {
        let dir = root.join(".pull/blobs/sha256");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| RegistryError::io(format!("create {}", dir.display()), e))?;
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = part_pid(&name) {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(BlobCache { dir })
    }

    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir
            .join(sha256_hex(digest).expect("a checked sha256 digest"))
    }

    /// Whether a complete blob of `digest` and `size` is cached and still
    /// matches (hashed again); one that no longer matches is removed.
    pub fn holds(&self, digest: &str, size: u64) -> Result<bool> {
        let path = self.path(digest);
        let file = match File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(RegistryError::io(format!("open {}", path.display()), e)),
        };
        let md = file
            .metadata()
            .map_err(|e| RegistryError::io(format!("stat {}", path.display()), e))?;
        let intact = md.is_file()
            && md.len() == size
            && hash_file(file)
                .map_err(|e| RegistryError::io(format!("read {}", path.display()), e))?
                == digest;
        if !intact {
            let _ = std::fs::remove_file(&path);
        }
        Ok(intact)
    }

    /// `bytes` derived from blob `digest` (its opened plaintext) written
    /// whole into a file of this process's own beside it, named as a part
    /// (`<hex>.part-<pid>-<n>`): never taken for a complete blob, and swept
    /// by a later pull once this process is gone. Its path.
    pub fn write_part(&self, digest: &str, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.part_path(digest);
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| RegistryError::io(format!("create {}", path.display()), e))?;
        if let Err(e) = file.write_all(bytes) {
            let _ = std::fs::remove_file(&path);
            return Err(RegistryError::io(format!("write {}", path.display()), e));
        }
        Ok(path)
    }

    fn part_path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!(
            "{}.part-{}-{}",
            sha256_hex(digest).expect("a checked sha256 digest"),
            std::process::id(),
            PART.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// A writer for the blob `digest` of `size` bytes.
    pub fn writer(&self, digest: &str, size: u64) -> Result<BlobWriter> {
        let done = self.path(digest);
        let part = self.part_path(digest);
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&part)
            .map_err(|e| RegistryError::io(format!("create {}", part.display()), e))?;
        Ok(BlobWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            part,
            done,
            hasher: sha2::Sha256::new(),
            written: 0,
            size,
            digest: digest.to_string(),
            finished: false,
        })
    }
}

/// The pid in `<hex>.part-<pid>-<n>`.
fn part_pid(name: &str) -> Option<u32> {
    let (_, rest) = name.split_once(".part-")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// sha256 of everything `file` holds, as an OCI digest.
pub fn hash_file(mut file: File) -> std::io::Result<String> {
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!(
        "sha256:{}",
        vsnap_artifact::key::hex(&hasher.finalize())
    ))
}

/// A blob being downloaded: hashed as it is written, renamed into the cache
/// only by [`BlobWriter::finish`] when it is whole and matches; removed when
/// dropped unfinished.
pub struct BlobWriter {
    file: std::io::BufWriter<File>,
    part: PathBuf,
    done: PathBuf,
    hasher: sha2::Sha256,
    written: u64,
    size: u64,
    digest: String,
    finished: bool,
}

/// Why a downloaded blob was not accepted.
#[derive(Debug)]
pub enum BlobProblem {
    /// More bytes than its descriptor's size.
    TooLong {
        size: u64,
    },
    /// All its bytes, and they hash to `got`.
    Mismatch {
        got: String,
    },
    /// Fewer bytes than its size.
    Short {
        written: u64,
        size: u64,
    },
    Io(std::io::Error),
}

impl std::fmt::Display for BlobProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobProblem::TooLong { size } => write!(f, "holds more than its {size} bytes"),
            BlobProblem::Mismatch { got } => {
                write!(f, "does not match its digest (the bytes hash to {got})")
            }
            BlobProblem::Short { written, size } => {
                write!(f, "ended after {written} of {size} bytes")
            }
            BlobProblem::Io(e) => write!(f, "{e}"),
        }
    }
}

impl BlobWriter {
    pub fn write(&mut self, bytes: &[u8]) -> std::result::Result<(), BlobProblem> {
        self.written += bytes.len() as u64;
        if self.written > self.size {
            return Err(BlobProblem::TooLong { size: self.size });
        }
        self.hasher.update(bytes);
        self.file.write_all(bytes).map_err(BlobProblem::Io)
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Checks size and digest, then renames the blob to its digest.
    pub fn finish(mut self) -> std::result::Result<(), BlobProblem> {
        if self.written != self.size {
            return Err(BlobProblem::Short {
                written: self.written,
                size: self.size,
            });
        }
        let got = format!(
            "sha256:{}",
            vsnap_artifact::key::hex(&std::mem::take(&mut self.hasher).finalize())
        );
        if got != self.digest {
            return Err(BlobProblem::Mismatch { got });
        }
        self.file.flush().map_err(BlobProblem::Io)?;
        std::fs::rename(&self.part, &self.done).map_err(BlobProblem::Io)?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sha256_digest;

    #[test]
    fn a_blob_enters_the_cache_only_whole_and_matching() {
        let root = tempfile::tempdir().unwrap();
        let cache = BlobCache::open(root.path()).unwrap();
        let data = b"some pages".to_vec();
        let digest = sha256_digest(&data);
        assert!(!cache.holds(&digest, 10).unwrap());

        let mut w = cache.writer(&digest, 10).unwrap();
        w.write(&data[..4]).unwrap();
        drop(w);
        assert_eq!(
            std::fs::read_dir(&cache.dir).unwrap().count(),
            0,
            "a dropped part is removed"
        );

        let mut w = cache.writer(&digest, 10).unwrap();
        w.write(b"some PAGES").unwrap();
        let e = w.finish().unwrap_err().to_string();
        assert!(e.contains("does not match its digest"), "{e}");
        assert!(!cache.path(&digest).exists());

        let mut w = cache.writer(&digest, 10).unwrap();
        assert!(matches!(
            w.write(b"some pages!"),
            Err(BlobProblem::TooLong { .. })
        ));
        drop(w);

        let mut w = cache.writer(&digest, 10).unwrap();
        w.write(&data[..3]).unwrap();
        assert!(matches!(
            w.finish(),
            Err(BlobProblem::Short { written: 3, .. })
        ));

        let mut w = cache.writer(&digest, 10).unwrap();
        w.write(&data).unwrap();
        w.finish().unwrap();
        assert!(cache.holds(&digest, 10).unwrap());
        assert_eq!(std::fs::read_dir(&cache.dir).unwrap().count(), 1);
    }

    #[test]
    fn a_rotten_cached_blob_is_removed_and_dead_parts_are_swept() {
        let root = tempfile::tempdir().unwrap();
        let cache = BlobCache::open(root.path()).unwrap();
        let digest = sha256_digest(b"abc");
        std::fs::write(cache.path(&digest), b"abd").unwrap();
        assert!(!cache.holds(&digest, 3).unwrap());
        assert!(
            !cache.path(&digest).exists(),
            "removed, to be fetched again"
        );
        let hex = sha256_hex(&digest).unwrap();
        // A pid past the kernel's limit is dead; our own pid is alive.
        let dead = cache.dir.join(format!("{hex}.part-999999999-0"));
        let ours = cache
            .dir
            .join(format!("{hex}.part-{}-77", std::process::id()));
        std::fs::write(&dead, b"x").unwrap();
        std::fs::write(&ours, b"x").unwrap();
        BlobCache::open(root.path()).unwrap();
        assert!(!dead.exists() && ours.exists());
        assert_eq!(part_pid("ab.part-12-3"), Some(12));
        assert_eq!(part_pid("ab"), None);
    }
}
