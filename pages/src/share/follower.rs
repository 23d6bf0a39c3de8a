//! The follower's side of the share: a thread receives the leader's
//! messages (a sealed chunk is checked and mapped as it comes), and the
//! fillers ask [`Follower::next`] what to place: a chunk received, else one
//! the leader said to skip, else (once the leader was silent for
//! [`PATIENCE`], or is gone) one read from the last chunk backwards. Each
//! chunk is claimed once under the state's lock: a chunk that comes after
//! it was claimed is dropped, so every chunk is placed exactly once.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use vsnap_artifact::content::chunk_mismatch;

use super::chunk::{open_sealed, Mapping};
use super::job::{chunk_len, chunks, Job};
use super::wire::{self, Kind, Message};
use crate::error::{PageError, Phase};

/// How long a filler waits for the leader's next chunk before it reads
/// one itself.
pub(super) const PATIENCE: Duration = Duration::from_millis(1000);

enum Have {
    Waiting,
    Shared(Mapping),
    Skipped,
    Claimed,
}

struct State {
    /// Per file of the share, per chunk.
    have: Vec<Vec<Have>>,
    connected: bool,
    /// When the leader was last heard of (or the fill began).
    heard: Instant,
    damaged: Option<(usize, usize)>,
    /// Chunks placed from the share, and read here.
    shared: u64,
    read: u64,
}

struct Inner {
    sock: OwnedFd,
    files: Vec<(String, u64)>,
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
}

/// This restore follows the share's leader.
pub(crate) struct Follower {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Follower {
    /// Receives the leader's messages on `sock` for `files`.
    pub(super) fn start(sock: OwnedFd, files: Vec<(String, u64)>) -> Result<Self, PageError> {
        let have = files
            .iter()
            .map(|(_, size)| (0..chunks(*size)).map(|_| Have::Waiting).collect())
            .collect();
        let inner = Arc::new(Inner {
            sock,
            files,
            state: Mutex::new(State {
                have,
                connected: true,
                heard: Instant::now(),
                damaged: None,
                shared: 0,
                read: 0,
            }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("vsnap-share".into())
            .spawn(move || i.listen())
            .map_err(|e| PageError::failed(Phase::Share, "the follower's thread", e))?;
        Ok(Follower {
            inner,
            thread: Some(thread),
        })
    }

    /// The fill begins: the leader's patience counts from now.
    pub(crate) fn begin(&self) {
        self.inner.state.lock().expect("lock").heard = Instant::now();
    }

    /// Chunks placed from the share, and read here.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let s = self.inner.state.lock().expect("lock");
        (s.shared, s.read)
    }

    /// What a filler places next; `None` once every chunk is claimed. A
    /// damage the leader found fails it as this restore's own would,
    /// naming `dir`.
    pub(crate) fn next(&self, stop: &AtomicBool, dir: &Path) -> Result<Option<Job>, PageError> {
        let mut s = self.inner.state.lock().expect("lock");
        loop {
            if stop.load(Ordering::SeqCst) {
                return Err(PageError::cancelled(Phase::Place));
            }
            if let Some((file, chunk)) = s.damaged {
                let (rel, size) = &self.inner.files[file];
                return Err(PageError::Damaged(chunk_mismatch(dir, rel, chunk, *size)));
            }
            if let Some(job) = s.claim_received() {
                return Ok(Some(job));
            }
            let waiting = s.last_waiting();
            let Some((file, chunk)) = waiting else {
                return Ok(None);
            };
            if !s.connected || s.heard.elapsed() >= PATIENCE {
                s.have[file][chunk] = Have::Claimed;
                s.read += 1;
                return Ok(Some(Job::Read { file, chunk }));
            }
            s = self
                .inner
                .wake
                .wait_timeout(s, Duration::from_millis(50))
                .expect("lock")
                .0;
        }
    }

    /// A shared chunk is placed: the leader may count it as let go.
    pub(crate) fn done(&self, file: usize, chunk: usize) {
        self.inner.done(file, chunk);
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl State {
    /// A chunk received (first) or skipped by the leader, claimed.
    fn claim_received(&mut self) -> Option<Job> {
        for (file, chunks) in self.have.iter_mut().enumerate() {
            for (chunk, h) in chunks.iter_mut().enumerate() {
                if let Have::Shared(_) = h {
                    let Have::Shared(map) = std::mem::replace(h, Have::Claimed) else {
                        unreachable!("matched above")
                    };
                    self.shared += 1;
                    return Some(Job::Shared { file, chunk, map });
                }
            }
        }
        for (file, chunks) in self.have.iter_mut().enumerate() {
            for (chunk, h) in chunks.iter_mut().enumerate() {
                if let Have::Skipped = h {
                    *h = Have::Claimed;
                    self.read += 1;
                    return Some(Job::Read { file, chunk });
                }
            }
        }
        None
    }

    /// The last chunk nobody has yet: the leader goes the other way.
    fn last_waiting(&self) -> Option<(usize, usize)> {
        self.have
            .iter()
            .enumerate()
            .rev()
            .find_map(|(file, chunks)| {
                let chunk = chunks.iter().rposition(|h| matches!(h, Have::Waiting))?;
                Some((file, chunk))
            })
    }
}

impl Inner {
    fn done(&self, file: usize, chunk: usize) {
        let (rel, size) = &self.files[file];
        let m = Message::new(Kind::Done, rel, chunk, chunk_len(*size, chunk));
        // The leader gone, nobody counts.
        let _ = wire::send(self.sock.as_raw_fd(), &m);
    }

    /// Until the leader goes or this restore ends: the leader's messages.
    fn listen(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(50u16)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                _ => {}
            }
            let got = wire::receive(self.sock.as_raw_fd());
            let mut s = self.state.lock().expect("lock");
            match got {
                Ok(Some(m)) => self.take(&mut s, m),
                Ok(None) => s.connected = false,
                Err(e) => {
                    log::warn!("{e} (from the leader): reading the rest here");
                    s.connected = false;
                }
            }
            let connected = s.connected;
            drop(s);
            self.wake.notify_all();
            if !connected {
                return;
            }
        }
    }

    /// One message of the leader. A chunk that is not what it should be
    /// (unsealed, of another size, of a file or chunk this restore does not
    /// have) is refused: read here.
    fn take(&self, s: &mut State, m: Message) {
        s.heard = Instant::now();
        let Some(file) = self.files.iter().position(|(r, _)| *r == m.file) else {
            log::warn!(
                "page share: the leader named {}, not a pages file here",
                m.file
            );
            return;
        };
        let Some(h) = s.have[file].get_mut(m.chunk) else {
            log::warn!(
                "page share: the leader named {} chunk {}, past its end",
                m.file,
                m.chunk
            );
            return;
        };
        match (m.kind, m.fd) {
            (Kind::Damaged, _) => s.damaged = Some((file, m.chunk)),
            (Kind::Skip, _) if matches!(h, Have::Waiting) => *h = Have::Skipped,
            (Kind::Chunk, Some(fd)) if matches!(h, Have::Waiting) => {
                let want = chunk_len(self.files[file].1, m.chunk);
                match open_sealed(&fd, want) {
                    Ok(map) => *h = Have::Shared(map),
                    Err(e) => {
                        log::warn!(
                            "{} chunk {} from the leader refused: {e}: read here",
                            m.file,
                            m.chunk
                        );
                        *h = Have::Skipped;
                        self.done(file, m.chunk);
                    }
                }
            }
            // Claimed here already: dropped.
            (Kind::Chunk, _) => self.done(file, m.chunk),
            _ => {}
        }
    }
}
