//! An unlinked file in /dev/shm held open (VSNAP_ENGINE_SHM_KB), as a Python
//! multiprocessing SharedMemory or a POSIX semaphore leaves behind: the file
//! has no name any more, only the open descriptor keeps it. CRIU must carry
//! it in the image (link-remap) and put it back at restore; every reload
//! after the first checks its bytes.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use crate::failure::Failure;
use crate::prng::SplitMix64;

const SEED: u64 = 0x7368_6d00_0000_0042;

pub struct UnlinkedShm {
    file: File,
    len: usize,
    checksum: u64,
}

impl UnlinkedShm {
    /// `None` when `kb` is 0. With `keep_name` the file stays linked
    /// (`/dev/shm/vsnap-ref-engine-shm`, as a named shared memory segment).
    pub fn create(kb: u64, keep_name: bool) -> Result<Option<Self>, Failure> {
        if kb == 0 {
            return Ok(None);
        }
        let len = usize::try_from(kb * 1024)
            .map_err(|_| Failure::engine("VSNAP_ENGINE_SHM_KB is too large"))?;
        let path = if keep_name {
            "/dev/shm/vsnap-ref-engine-shm".to_string()
        } else {
            format!("/dev/shm/vsnap-ref-engine-{}", std::process::id())
        };
        let mut file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Failure::engine(format!("create {path}: {e}")))?;
        let bytes = stream(len);
        file.write_all(&bytes)
            .map_err(|e| Failure::engine(format!("write {path}: {e}")))?;
        if keep_name {
            crate::log(&format!("holding {path} ({kb} KiB)"));
        } else {
            std::fs::remove_file(&path)
                .map_err(|e| Failure::engine(format!("unlink {path}: {e}")))?;
            crate::log(&format!("holding an unlinked {kb} KiB file from /dev/shm"));
        }
        Ok(Some(UnlinkedShm {
            file,
            len,
            checksum: checksum(&bytes),
        }))
    }

    pub fn verify(&self) -> Result<(), Failure> {
        let mut bytes = vec![0u8; self.len];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(|e| Failure::engine(format!("read the unlinked /dev/shm file: {e}")))?;
        if checksum(&bytes) != self.checksum {
            return Err(Failure::engine(
                "the unlinked /dev/shm file changed: it did not survive the restore",
            ));
        }
        Ok(())
    }
}

fn stream(len: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(SEED);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unlinked_file_is_kept_and_verified() {
        let shm = UnlinkedShm::create(4, false).unwrap().unwrap();
        shm.verify().unwrap();
        shm.file.write_at(b"x", 0).unwrap();
        assert!(shm.verify().is_err(), "a changed byte is noticed");
        assert!(UnlinkedShm::create(0, false).unwrap().is_none());
    }
}
