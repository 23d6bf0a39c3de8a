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
    copy_regular_files(host_shm, to, "capture: /dev/shm")?;
    remove_link_remaps(host_shm);
    Ok(())
}

/// What CRIU's `link-remap` names the links it makes for files open under
/// a name they lost (criu/files-reg.c: `link_remap.<id>`).
pub const LINK_REMAP_PREFIX: &str = "link_remap.";

/// Removes CRIU's link-remap files from a `/dev/shm` folder: after the
/// dump they are in the artifact (and the donor holds its files open);
/// after a restore CRIU opened them. Nothing of them stays on the host.
pub fn remove_link_remaps(host_shm: &Path) {
    let Ok(entries) = fs::read_dir(host_shm) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(LINK_REMAP_PREFIX)
        {
            if let Err(err) = fs::remove_file(e.path()) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("remove {}: {err}", e.path().display());
                }
            }
        }
    }
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
        fs::write(shm.join("link_remap.3"), b"sem").unwrap();
        carry(&shm, &art).unwrap();
        assert!(!shm.join("link_remap.3").exists(), "left on the host");
        assert!(shm.join("psm_1").exists());
        put_back(&art, &new).unwrap();
        assert_eq!(fs::read(new.join("psm_1")).unwrap(), b"shared");
        assert_eq!(fs::read(new.join("link_remap.3")).unwrap(), b"sem");
        let err = put_back(&art, &new).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        remove_link_remaps(&new);
        assert!(!new.join("link_remap.3").exists() && new.join("psm_1").exists());
    }
}
