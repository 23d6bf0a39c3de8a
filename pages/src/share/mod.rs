//! Several restores of one artifact at once share the reading and the
//! hashing of its pages files: the first restorer (the leader) reads and
//! checks each 64 MiB chunk as a single restore does, into a `memfd` that
//! it seals and hands to the others (the followers); a follower places the
//! chunk's pages from a read-only mapping of it, without reading or
//! hashing it again.
//!
//! - The leader holds a non-blocking exclusive `flock` on
//!   `<runtime_dir>/share/<key>.lock` and listens on `<key>.sock` (0600, the
//!   folder root's only, as the filler budget's); `key` names the
//!   artifact's sealed manifest (its MAC) and its folder.
//! - Each chunk the leader placed and found matching its digest goes to
//!   every follower as a sealed memfd (`chunk`, `wire`); a chunk it did
//!   not share (too many held already, or no follower yet) as a `Skip`; a
//!   damaged one as `Damaged`, which fails every follower as it fails the
//!   leader.
//! - A follower places what it received, reads itself what it was told to
//!   skip, what did not come in time (from the last chunk backwards, while
//!   the leader goes forwards) and all that remains once the leader went
//!   away; each chunk is placed once, whichever way it came (`follower`).
//! - A follower takes a filler slot only to place a chunk it holds or to
//!   read one itself: it never waits for the leader while holding one.
//! - Memory: the chunks shared and not yet placed by every follower that
//!   got them, at most `job::IN_FLIGHT` (64 MiB each), the leader's bound.
//!
//! - `chunk`: the sealed memfd, made and checked;
//! - `wire`: the messages on the share's socket;
//! - `leader`, `follower`: the two sides.

mod chunk;
mod follower;
mod job;
mod leader;
mod wire;

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::budget::private_dir;
use super::verify::Verification;
use crate::error::{PageError, Phase};

pub(super) use follower::Follower;
pub(super) use job::Job;
pub(super) use leader::Leader;

/// Where the restores of one artifact meet: `<runtime_dir>/share` and the
/// artifact's key.
#[derive(Debug, Clone)]
pub struct Sharing {
    pub dir: PathBuf,
    pub key: String,
}

impl Sharing {
    /// The meeting place of the restores of the artifact in `artifact`
    /// whose sealed manifest has MAC `mac`: the same bytes (the MAC covers
    /// every digest) in the same files (the folder), so a follower's own
    /// reads of a page it needs early read what the leader checked.
    pub fn new(runtime_dir: &Path, mac: &str, artifact: &Path) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"vsnap page share 1\0");
        h.update(mac.as_bytes());
        h.update(b"\0");
        h.update(artifact.as_os_str().as_encoded_bytes());
        let key = h.finalize().to_hex()[..32].to_string();
        Sharing {
            dir: runtime_dir.join("share"),
            key,
        }
    }

    fn path(&self, ext: &str) -> PathBuf {
        self.dir.join(format!("{}.{ext}", self.key))
    }
}

/// What a restore is to the others of its artifact.
pub(super) enum Role {
    Leader(Leader),
    Follower(Follower),
}

impl Role {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Role::Leader(_) => "leader",
            Role::Follower(_) => "follower",
        }
    }
}

/// The pages files of `v` as the share names them, with their sizes.
fn files(v: &Verification) -> Vec<(String, u64)> {
    v.files.iter().map(|(r, d)| (r.clone(), d.size)).collect()
}

/// Becomes the leader of `s` (the lock was free) or a follower of it;
/// `None` when neither (a leader that is going away, a name too long for a
/// socket): this restore then places its pages alone.
pub(super) fn join(s: &Sharing, v: &Verification) -> Result<Option<Role>, PageError> {
    private_dir(&s.dir, Phase::Share)?;
    for _ in 0..5 {
        match lock(&s.path("lock"))? {
            Some(lock) => {
                return Leader::start(lock, s.path("lock"), s.path("sock"), files(v))
                    .map(|l| Some(Role::Leader(l)))
            }
            None => match wire::connect(&s.path("sock")) {
                Ok(sock) => return Ok(Some(Role::Follower(Follower::start(sock, files(v))?))),
                // The leader is between its lock and its socket, or gone.
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            },
        }
    }
    Ok(None)
}

/// The lock at `path`, if free; `None` when another restore holds it. A
/// lock taken on a file its leader unlinked as it went is let go, and
/// `path` tried anew.
fn lock(path: &Path) -> Result<Option<Flock<File>>, PageError> {
    let fail = |detail: String| PageError::failed(Phase::Share, path.display(), detail);
    loop {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| fail(format!("open: {e}")))?;
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(fail(format!("lock: {e}"))),
        };
        let held = lock.metadata().map(|m| m.ino());
        let named = std::fs::symlink_metadata(path).map(|m| m.ino());
        if matches!((held, named), (Ok(a), Ok(b)) if a == b) {
            return Ok(Some(lock));
        }
    }
}

#[cfg(test)]
mod tests;
