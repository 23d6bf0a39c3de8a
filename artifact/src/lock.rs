//! One writer per artifact name, and no removal of an artifact in use: an
//! advisory `flock` on `<root>/.locks/<name>.lock`, held by the process that
//! creates (exclusive) or restores / inspects (shared) the artifact. The
//! kernel drops it when the holder dies, so a crash never leaves it stuck.

use std::fs::{DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{ArtifactError, Result};

pub struct ArtifactLock {
    _lock: Flock<File>,
}

impl std::fmt::Debug for ArtifactLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ArtifactLock")
    }
}

impl ArtifactLock {
    /// An exclusive lock, or `Locked` when anyone holds it.
    pub fn exclusive(root: &Path, name: &str) -> Result<Self> {
        Self::take(root, name, FlockArg::LockExclusiveNonblock)
    }

    /// A shared lock (many readers), or `Locked` while a writer holds it.
    pub fn shared(root: &Path, name: &str) -> Result<Self> {
        Self::take(root, name, FlockArg::LockSharedNonblock)
    }

    fn take(root: &Path, name: &str, how: FlockArg) -> Result<Self> {
        let dir = root.join(".locks");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ArtifactError::io(&dir, "create", e))?;
        let path = dir.join(format!("{name}.lock"));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| ArtifactError::io(&path, "open", e))?;
        match Flock::lock(file, how) {
            Ok(lock) => Ok(Self { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                Err(ArtifactError::Locked(name.to_string()))
            }
            Err((_, e)) => Err(ArtifactError::io(&path, "lock", e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_at_a_time_and_no_writer_beside_readers() {
        let dir = tempfile::tempdir().unwrap();
        let w = ArtifactLock::exclusive(dir.path(), "a").unwrap();
        assert!(matches!(
            ArtifactLock::exclusive(dir.path(), "a"),
            Err(ArtifactError::Locked(_))
        ));
        assert!(matches!(
            ArtifactLock::shared(dir.path(), "a"),
            Err(ArtifactError::Locked(_))
        ));
        ArtifactLock::exclusive(dir.path(), "b").unwrap();
        drop(w);
        let r1 = ArtifactLock::shared(dir.path(), "a").unwrap();
        let _r2 = ArtifactLock::shared(dir.path(), "a").unwrap();
        assert!(matches!(
            ArtifactLock::exclusive(dir.path(), "a"),
            Err(ArtifactError::Locked(_))
        ));
        drop(r1);
    }
}
