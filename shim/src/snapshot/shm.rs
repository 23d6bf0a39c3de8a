//! A `/dev/shm` bind-mounted from the host is an external mount to CRIU: its
//! files are not in the image, yet the engine's shared memory lives there.
//! vsnap copies them into the artifact right after the dump (the engine waits
//! for its activation then, touching nothing) and puts them back into the
//! new container's folder before the restore.

use std::fs;
use std::path::Path;

use vsnap_artifact::layout;

use crate::error::{Error, Result};

/// The artifact's folder for them.
pub const ARTIFACT_DIR: &str = "dev-shm";

/// Copies the regular files of `host_shm` into `to` (created 0700).
pub fn carry(host_shm: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)
        .map_err(|e| Error::io(format!("capture: create {}", to.display()), e))?;
    copy_regular_files(host_shm, to, "capture: /dev/shm")
}

/// Copies the carried files into the new container's `/dev/shm` folder,
/// refusing to overwrite what is already there.
pub fn put_back(from: &Path, host_shm: &Path) -> Result<()> {
    if !from.is_dir() {
        return Ok(());
    }
    for e in
        fs::read_dir(from).map_err(|e| Error::io(format!("restore: read {}", from.display()), e))?
    {
        let e = e.map_err(|e| Error::io("restore: /dev/shm", e))?;
        let target = host_shm.join(e.file_name());
        if fs::symlink_metadata(&target).is_ok() {
            return Err(Error::FailedPrecondition(format!(
                "restore: /dev/shm: {} already exists in the container's /dev/shm folder",
                target.display()
            )));
        }
    }
    copy_regular_files(from, host_shm, "restore: /dev/shm")
}

/// Most bytes of shared memory carried per file (as CRIU's ghost limit).
const FILE_LIMIT: u64 = 64 << 30;

/// The container can write both folders: nothing is followed or overwritten
/// (artifact::layout::copy_regular_nofollow); the copies are 0600, root's.
fn copy_regular_files(from: &Path, to: &Path, phase: &str) -> Result<()> {
    for e in
        fs::read_dir(from).map_err(|e| Error::io(format!("{phase}: read {}", from.display()), e))?
    {
        let e = e.map_err(|e| Error::io(phase.to_string(), e))?;
        let dest = to.join(e.file_name());
        layout::copy_regular_nofollow(&e.path(), &dest, FILE_LIMIT)
            .map_err(|err| Error::FailedPrecondition(format!("{phase}: {err}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_go_into_the_artifact_and_back_without_overwriting() {
        let dir = tempfile::tempdir().unwrap();
        let (shm, art, new) = (
            dir.path().join("shm"),
            dir.path().join("art"),
            dir.path().join("new"),
        );
        fs::create_dir_all(&shm).unwrap();
        fs::create_dir_all(&new).unwrap();
        fs::write(shm.join("psm_1"), b"shared").unwrap();
        carry(&shm, &art).unwrap();
        put_back(&art, &new).unwrap();
        assert_eq!(fs::read(new.join("psm_1")).unwrap(), b"shared");
        let err = put_back(&art, &new).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
    }
}
