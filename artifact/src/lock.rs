//! One writer per artifact name, and no removal of an artifact in use: an
//! advisory `flock` on `<root>/.locks/<name>.lock`, held by the process that
//! creates or removes (exclusive) or restores (shared) the artifact. The
//! kernel drops it when the holder dies, so a crash never leaves it stuck.

use std::fs::{DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{ArtifactError, Result};

/// A lock file opened (created 0600 when missing, never through a
/// symlink, never truncated) for `flock`.
pub fn open_lock_file(path: &Path) -> Result<File> {
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ArtifactError::io(path, "open", e))
}

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

    /// Whether anyone holds the lock of `name`, shared or exclusive, read
    /// from `/proc/locks` without taking the lock or creating anything: an
    /// observer (a listing) never makes a concurrent restore or capture fail.
    /// Locks held by processes outside the caller's pid namespace are not
    /// shown there; removal must still take [`ArtifactLock::exclusive`].
    pub fn is_held(root: &Path, name: &str) -> Result<bool> {
        held(&root.join(".locks").join(format!("{name}.lock")))
    }

    /// Whether a pull of `name` is under way: its pull lock
    /// (`<root>/.pull/locks/<name>.lock`, which `vsnap pull` holds from
    /// its first chunk to its publish) held, read as [`ArtifactLock::is_held`].
    pub fn pull_under_way(root: &Path, name: &str) -> Result<bool> {
        held(&root.join(".pull/locks").join(format!("{name}.lock")))
    }

    fn take(root: &Path, name: &str, how: FlockArg) -> Result<Self> {
        let dir = root.join(".locks");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ArtifactError::io(&dir, "create", e))?;
        let path = dir.join(format!("{name}.lock"));
        let file = open_lock_file(&path)?;
        match Flock::lock(file, how) {
            Ok(lock) => Ok(Self { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                Err(ArtifactError::Locked(name.to_string()))
            }
            Err((_, e)) => Err(ArtifactError::io(&path, "lock", e.into())),
        }
    }
}

/// Whether anyone holds a `flock` on the lock file at `path` (`/proc/locks`).
fn held(path: &Path) -> Result<bool> {
    let md = match std::fs::symlink_metadata(path) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(ArtifactError::io(path, "stat", e)),
    };
    let proc_locks = Path::new("/proc/locks");
    let locks = std::fs::read_to_string(proc_locks)
        .map_err(|e| ArtifactError::io(proc_locks, "read", e))?;
    Ok(flock_listed(&locks, md.dev(), md.ino()))
}

/// Whether `/proc/locks` lists a granted `flock` on the inode `dev`/`ino`
/// (`N: FLOCK ADVISORY WRITE PID MAJ:MIN:INO 0 EOF`; waiters, `N: -> FLOCK`,
/// do not hold it).
fn flock_listed(proc_locks: &str, dev: u64, ino: u64) -> bool {
    let inode = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    proc_locks.lines().any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&inode.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_under_way_is_seen_by_its_lock() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!ArtifactLock::pull_under_way(dir.path(), "a").unwrap());
        let locks = dir.path().join(".pull/locks");
        std::fs::create_dir_all(&locks).unwrap();
        let file = std::fs::File::create(locks.join("a.lock")).unwrap();
        assert!(!ArtifactLock::pull_under_way(dir.path(), "a").unwrap());
        file.lock().unwrap();
        assert!(ArtifactLock::pull_under_way(dir.path(), "a").unwrap());
        assert!(!ArtifactLock::pull_under_way(dir.path(), "b").unwrap());
        assert!(
            !ArtifactLock::is_held(dir.path(), "a").unwrap(),
            "another lock"
        );
        drop(file);
        assert!(!ArtifactLock::pull_under_way(dir.path(), "a").unwrap());
    }

    #[test]
    fn a_held_lock_is_seen_without_taking_it() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!ArtifactLock::is_held(dir.path(), "a").unwrap());
        assert!(
            !dir.path().join(".locks").exists(),
            "looking creates nothing"
        );
        let r = ArtifactLock::shared(dir.path(), "a").unwrap();
        assert!(ArtifactLock::is_held(dir.path(), "a").unwrap());
        assert!(!ArtifactLock::is_held(dir.path(), "b").unwrap());
        drop(r);
        assert!(!ArtifactLock::is_held(dir.path(), "a").unwrap());
        let w = ArtifactLock::exclusive(dir.path(), "a").unwrap();
        assert!(ArtifactLock::is_held(dir.path(), "a").unwrap());
        drop(w);
        assert!(!ArtifactLock::is_held(dir.path(), "a").unwrap());
    }

    #[test]
    fn proc_locks_lines_are_matched_by_device_and_inode() {
        let dev = libc::makedev(0xfe, 0x01);
        let locks = "1: FLOCK  ADVISORY  WRITE 26722 fe:01:5472257 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 26723 fe:01:77 0 EOF\n\
                     3: POSIX  ADVISORY  WRITE 26724 fe:01:88 0 EOF\n";
        assert!(flock_listed(locks, dev, 5472257));
        assert!(!flock_listed(locks, dev, 547225));
        assert!(!flock_listed(locks, libc::makedev(0xfe, 0), 5472257));
        assert!(!flock_listed(locks, dev, 77), "a waiter holds nothing");
        assert!(!flock_listed(locks, dev, 88), "not an flock");
    }

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
