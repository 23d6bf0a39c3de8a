//! The host's filler budget: how many page-server fillers place pages at
//! once across every restore of the host, not per restore.
//!
//! Each shim runs its own page server (containerd runs one shim per
//! container), and each server has one filler per core: eight restores
//! started together would run eight times as many fillers as cores, each
//! reading, hashing and copying against the others and against eight
//! CRIUs. With a budget, a filler places a chunk only while it holds one of
//! the budget's slots: an exclusive `flock` on `<dir>/slot-<i>` (one file
//! per slot, one slot per core, at most 8). It takes the slot for one chunk
//! and lets it go, so every restore under way gets its turns.
//!
//! - No stale slot: a lock goes with its descriptor, so a shim that dies
//!   (or is killed) holding one frees it at once.
//! - No deadlock: a filler holds at most one slot and waits for nothing
//!   else while it does (a chunk is read, hashed and placed, then the slot
//!   goes). A waiting filler waits for a chunk of another restore to end.
//! - Each restore gets a filler eventually: every holder lets go after one
//!   chunk; at worst a restore waits until the others are placed.
//!   Its wait counts in its fill, which its activation deadline bounds; a
//!   kill cancels the restore as before (the filler stops once it holds a
//!   slot, after at most another restore's chunk).

use std::fs::{DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::{PageError, Phase};

/// The most slots a budget has: the fillers' own cap.
pub const MAX_SLOTS: usize = 8;

/// The host's filler slots under one folder.
#[derive(Debug, Clone)]
pub struct Budget {
    dir: PathBuf,
    slots: usize,
}

/// A slot held: placing a chunk is allowed until it is dropped.
pub(super) struct Slot {
    _lock: Flock<File>,
    /// How long the filler waited for it.
    pub(super) waited: Duration,
}

impl Budget {
    /// The budget of `slots` slots (1 to [`MAX_SLOTS`]) in `dir`, made
    /// (root-only, 0700) when missing. A folder that is a symlink, is not
    /// this user's or that others may write is refused: whoever could
    /// write there could hold every slot.
    pub fn open(dir: &Path, slots: usize) -> Result<Self, PageError> {
        private_dir(dir, Phase::Budget)?;
        Ok(Budget {
            dir: dir.to_path_buf(),
            slots: slots.clamp(1, MAX_SLOTS),
        })
    }

    /// How many fillers of the host may place pages at once.
    #[cfg(test)]
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Takes a slot: the first free one from `from` on, else waits for
    /// slot `from` (its holder lets go after a chunk, or dies).
    pub(super) fn take(&self, from: usize) -> Result<Slot, PageError> {
        let t = Instant::now();
        for k in 0..self.slots {
            match Flock::lock(
                self.file((from + k) % self.slots)?,
                FlockArg::LockExclusiveNonblock,
            ) {
                Ok(lock) => return Ok(self.held(lock, t)),
                Err((_, Errno::EWOULDBLOCK)) => {}
                Err((_, e)) => return Err(self.failed(from + k, e)),
            }
        }
        let home = from % self.slots;
        loop {
            match Flock::lock(self.file(home)?, FlockArg::LockExclusive) {
                Ok(lock) => return Ok(self.held(lock, t)),
                Err((_, Errno::EINTR)) => {}
                Err((_, e)) => return Err(self.failed(home, e)),
            }
        }
    }

    fn held(&self, lock: Flock<File>, since: Instant) -> Slot {
        Slot {
            _lock: lock,
            waited: since.elapsed(),
        }
    }

    fn failed(&self, i: usize, e: Errno) -> PageError {
        let path = self.path(i % self.slots);
        PageError::failed(Phase::Budget, path.display(), format!("lock: {e}"))
    }

    fn path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("slot-{i}"))
    }

    /// Slot `i`'s file, opened anew: each holder its own open file (a
    /// `flock` belongs to an open file, not to a process or a thread).
    fn file(&self, i: usize) -> Result<File, PageError> {
        let path = self.path(i);
        File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| PageError::failed(Phase::Budget, path.display(), format!("open: {e}")))
    }
}

/// Makes `dir` (root-only, 0700) when missing and refuses a folder that is
/// a symlink, is not this user's or that others may write: whoever could
/// write there could take what the shims of the host share in it. Errors
/// are of `phase`.
pub(super) fn private_dir(dir: &Path, phase: Phase) -> Result<(), PageError> {
    let fail = |detail: String| PageError::failed(phase, dir.display(), detail);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail(format!("create: {e}")))?;
    let md = std::fs::symlink_metadata(dir).map_err(|e| fail(e.to_string()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !md.is_dir() || md.uid() != me || md.permissions().mode() & 0o022 != 0 {
        return Err(fail(format!(
            "not a folder of uid {me} that only it may write"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn never_more_holders_than_slots_and_every_taker_gets_one() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Budget::open(&dir.path().join("fillers"), 2).unwrap();
        let (now, most, turns) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        std::thread::scope(|s| {
            for t in 0..6 {
                let (budget, now, most, turns) = (&budget, &now, &most, &turns);
                s.spawn(move || {
                    for _ in 0..20 {
                        let slot = budget.take(t).unwrap();
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(200));
                        now.fetch_sub(1, Ordering::SeqCst);
                        turns.fetch_add(1, Ordering::SeqCst);
                        drop(slot);
                    }
                });
            }
        });
        assert_eq!(
            turns.load(Ordering::SeqCst),
            120,
            "every taker got its turns"
        );
        assert_eq!(
            most.load(Ordering::SeqCst),
            2,
            "two slots, two holders at most"
        );
    }

    #[test]
    fn a_taker_waits_for_a_held_slot_and_gets_it_when_it_goes() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Budget::open(dir.path(), 1).unwrap();
        let held = budget.take(0).unwrap();
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || budget.take(0).map(|_| Instant::now()))
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished(), "the only slot is held");
        // The waiter's take returns only once the slot goes (on a loaded
        // host its thread may not even have asked yet: no bound on when).
        let dropped = Instant::now();
        drop(held);
        let got = waiter.join().unwrap().unwrap();
        assert!(got >= dropped, "got the slot before it went");
    }

    #[test]
    fn a_holder_that_dies_frees_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let budget = Budget::open(dir.path(), 1).unwrap();
        // Another process holds the slot: a shell takes it with flock(1)
        // and becomes a sleep, the only holder of the descriptor.
        let path = dir.path().join("slot-0");
        let mut holder = std::process::Command::new("sh")
            .args(["-c", "exec 9>>\"$0\" && flock 9 && exec sleep 600"])
            .arg(&path)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let f = budget.file(0).unwrap();
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Err((_, Errno::EWOULDBLOCK)) => break,
                Ok(_) => assert!(Instant::now() < deadline, "flock(1) never took the slot"),
                Err((_, e)) => panic!("{e}"),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Killed, its lock goes with it: the taker gets the slot.
        holder.kill().unwrap();
        holder.wait().unwrap();
        budget.take(0).unwrap();
    }

    #[tokio::test]
    async fn a_page_server_places_its_chunks_under_the_budget() {
        use super::super::protocol::RESTORE_FINISHED;
        use super::super::server::PageServer;
        use super::super::testing::{artifact, connect, deadline, region, send_task, verified};
        use crate::plan::{FillerBudget, PagePlan};
        use std::io::Write;
        let r = region(3 << 20, 0);
        let (dir, v, data) = artifact(13, &r);
        let budget = Budget::open(&dir.path().join("fillers"), 1).unwrap();
        // Another restore holds the host's only slot.
        let held = budget.take(0).unwrap();
        let images = dir.path().join("images");
        let plan = PagePlan {
            budget: Some(FillerBudget {
                dir: dir.path().join("fillers"),
                slots: 1,
            }),
            ..verified(&images, 2, v)
        };
        let server = PageServer::start(plan, dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 13, r.fd());
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        let finished = tokio::spawn(server.finish(deadline()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!finished.is_finished(), "no chunk is placed without a slot");
        drop(held);
        let placed = finished.await.unwrap().unwrap();
        // Counted, but not bounded below: on a loaded host the filler may
        // have asked for the slot late in the 200 ms.
        assert!(placed.slot_wait > Duration::ZERO, "{placed:?}");
        // SAFETY: the region is mapped and every page of it is now present.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(memory == &data[..]);
    }

    #[test]
    fn a_folder_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Budget::open(&open, 2).unwrap_err().to_string();
        assert!(e.contains("only it may write"), "{e}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(Budget::open(&link, 2).is_err());
        let made = dir.path().join("a/fillers");
        assert_eq!(Budget::open(&made, 64).unwrap().slots(), MAX_SLOTS);
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
