//! The leader's side of the share: it places its own copy as a single
//! restore does, but reads each chunk into a memfd, which it seals and
//! sends to every follower once the chunk matched its digest; a thread
//! takes the followers' connections and their `Done`s.
//!
//! The leader never waits for a follower: a send that would block drops
//! that follower (it reads the rest itself), and past [`IN_FLIGHT`] chunks
//! held the leader shares no more until some are placed.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nix::fcntl::Flock;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::super::task::Task;
use super::super::verify::{place_chunk, PagesFile};
use super::chunk::Unsealed;
use super::job::{chunk_len, IN_FLIGHT};
use super::wire::{self, Kind, Message};
use crate::error::{PageError, Phase};

/// A share is of a whole artifact: a restore that streams never leads
/// one, so its chunks are never waited for here.
static NOT_STREAMED: AtomicBool = AtomicBool::new(false);

type Key = (usize, usize);

/// A follower connected.
struct Conn {
    sock: OwnedFd,
    /// The chunks it was sent and has not placed yet.
    holds: HashSet<Key>,
}

#[derive(Default)]
struct State {
    conns: Vec<Conn>,
    /// Chunks dealt with (sent, skipped or damaged): a follower that comes
    /// later is told to read them itself.
    dealt: Vec<Key>,
    damaged: Option<Key>,
    /// Per chunk sent, how many followers still hold it.
    held: HashMap<Key, usize>,
    /// Chunks being read into a memfd, to be sent.
    making: usize,
    /// Chunks sent to at least one follower.
    sent: u64,
}

struct Inner {
    files: Vec<(String, u64)>,
    state: Mutex<State>,
    stop: AtomicBool,
}

/// This restore leads the share: it listens, and shares what it checked.
pub(crate) struct Leader {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
    lock: Option<Flock<File>>,
    lock_path: PathBuf,
    sock_path: PathBuf,
}

impl Leader {
    /// Listens on `sock_path` for followers, `lock` held.
    pub(super) fn start(
        lock: Flock<File>,
        lock_path: PathBuf,
        sock_path: PathBuf,
        files: Vec<(String, u64)>,
    ) -> Result<Self, PageError> {
        let listener = wire::listen(&sock_path)?;
        let inner = Arc::new(Inner {
            files,
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("vsnap-share".into())
            .spawn(move || i.serve(listener))
            .map_err(|e| PageError::failed(Phase::Share, "the leader's thread", e))?;
        Ok(Leader {
            inner,
            thread: Some(thread),
            lock: Some(lock),
            lock_path,
            sock_path,
        })
    }

    /// Chunks sent to at least one follower.
    pub(crate) fn sent(&self) -> u64 {
        self.inner.state.lock().expect("lock").sent
    }

    /// Places chunk `chunk` of `f` (file `file` of the share) as
    /// [`place_chunk`] does; when followers may take it, read into a memfd
    /// that is sealed and sent to them once it matched its digest.
    pub(crate) fn place(
        &self,
        f: &PagesFile,
        file: usize,
        chunk: usize,
        task: Option<&Task>,
        dir: &Path,
        buf: &mut [u8],
    ) -> Result<(), PageError> {
        let key = (file, chunk);
        let made = match self.inner.reserve() {
            true => Unsealed::new(chunk_len(f.size, chunk) as usize)
                .inspect_err(|e| {
                    log::warn!("{} chunk {chunk}: {e}", f.rel);
                    self.inner.unreserve();
                })
                .ok(),
            false => None,
        };
        let Some(mut m) = made else {
            // Not shared: the followers read it themselves, now.
            self.inner.deal(key, Kind::Skip, None, false);
            let placed = place_chunk(f, chunk, task, dir, buf, &NOT_STREAMED);
            if let Err(PageError::Damaged(_)) = &placed {
                self.inner.deal(key, Kind::Damaged, None, false);
            }
            return placed;
        };
        if let Err(e) = place_chunk(f, chunk, task, dir, m.as_mut_slice(), &NOT_STREAMED) {
            let kind = match e {
                PageError::Damaged(_) => Kind::Damaged,
                _ => Kind::Skip,
            };
            self.inner.deal(key, kind, None, true);
            return Err(e);
        }
        match m.seal() {
            Ok(fd) => self.inner.deal(key, Kind::Chunk, Some(fd), true),
            Err(e) => {
                log::warn!("{} chunk {chunk}: {e}", f.rel);
                self.inner.deal(key, Kind::Skip, None, true);
            }
        }
        Ok(())
    }
}

impl Drop for Leader {
    /// The followers see their connections close (and read what is left
    /// themselves); the socket and the lock file go before the lock does,
    /// so the next restore of the artifact leads anew.
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.inner.state.lock().expect("lock").conns.clear();
        let _ = std::fs::remove_file(&self.sock_path);
        let _ = std::fs::remove_file(&self.lock_path);
        drop(self.lock.take());
    }
}

impl Inner {
    /// Whether a chunk may be made to share: a follower takes it, and
    /// fewer than [`IN_FLIGHT`] are held.
    fn reserve(&self) -> bool {
        let mut s = self.state.lock().expect("lock");
        let ok = !s.conns.is_empty() && s.held.len() + s.making < IN_FLIGHT;
        if ok {
            s.making += 1;
        }
        ok
    }

    fn unreserve(&self) {
        let mut s = self.state.lock().expect("lock");
        s.making = s.making.saturating_sub(1);
    }

    /// Tells every follower what became of chunk `key`: a `Chunk` with its
    /// sealed memfd, a `Skip` or `Damaged`. A follower that cannot take the
    /// message at once is dropped.
    /// `reserved`: it was made under [`Inner::reserve`].
    fn deal(&self, key: Key, kind: Kind, fd: Option<OwnedFd>, reserved: bool) {
        let (rel, size) = &self.files[key.0];
        let mut m = Message::new(kind, rel, key.1, chunk_len(*size, key.1));
        m.fd = fd;
        let mut s = self.state.lock().expect("lock");
        if reserved {
            s.making = s.making.saturating_sub(1);
        }
        s.dealt.push(key);
        if kind == Kind::Damaged {
            s.damaged = Some(key);
        }
        let mut holders = 0;
        s.conns
            .retain_mut(|c| match wire::send(c.sock.as_raw_fd(), &m) {
                Ok(()) => {
                    if kind == Kind::Chunk {
                        c.holds.insert(key);
                        holders += 1;
                    }
                    true
                }
                Err(e) => {
                    log::warn!("a follower dropped: {e}");
                    false
                }
            });
        if holders > 0 {
            s.held.insert(key, holders);
            s.sent += 1;
        }
        // The memfd's own descriptor goes here: the followers hold theirs.
    }

    /// Until the leader goes: takes followers and their `Done`s.
    fn serve(&self, listener: OwnedFd) {
        while !self.stop.load(Ordering::SeqCst) {
            let socks: Vec<OwnedFd> = {
                let s = self.state.lock().expect("lock");
                s.conns
                    .iter()
                    .filter_map(|c| c.sock.try_clone().ok())
                    .collect()
            };
            let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
            fds.extend(
                socks
                    .iter()
                    .map(|c| PollFd::new(c.as_fd(), PollFlags::POLLIN)),
            );
            let _ = poll(&mut fds, PollTimeout::from(50u16));
            let ready = |p: &PollFd| p.revents().is_some_and(|r| !r.is_empty());
            if ready(&fds[0]) {
                self.welcome(&listener);
            }
            if fds[1..].iter().any(ready) {
                self.hear();
            }
        }
    }

    /// A follower that connects is told of every chunk dealt with so far
    /// (to read itself) and of a damage.
    fn welcome(&self, listener: &OwnedFd) {
        let sock = match wire::accept(listener) {
            Ok(Some(sock)) => sock,
            Ok(None) => return,
            Err(e) => return log::warn!("{e}"),
        };
        let mut s = self.state.lock().expect("lock");
        let mut told = Vec::new();
        for &(file, chunk) in &s.dealt {
            let (rel, size) = &self.files[file];
            let kind = match s.damaged == Some((file, chunk)) {
                true => Kind::Damaged,
                false => Kind::Skip,
            };
            told.push(Message::new(kind, rel, chunk, chunk_len(*size, chunk)));
        }
        if let Err(e) = told
            .iter()
            .try_for_each(|m| wire::send(sock.as_raw_fd(), m))
        {
            return log::warn!("a follower dropped: {e}");
        }
        s.conns.push(Conn {
            sock,
            holds: HashSet::new(),
        });
    }

    /// Reads every `Done` waiting; a follower gone lets go of what it held.
    fn hear(&self) {
        let mut s = self.state.lock().expect("lock");
        let fds: Vec<i32> = s.conns.iter().map(|c| c.sock.as_raw_fd()).collect();
        let mut gone = Vec::new();
        for fd in fds {
            loop {
                match recv_nonblocking(fd) {
                    Ok(Some(m)) if m.kind == Kind::Done => {
                        let key = self.files.iter().position(|(r, _)| *r == m.file);
                        if let Some(key) = key.map(|f| (f, m.chunk)) {
                            release(&mut s, fd, key);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(()) => {
                        gone.push(fd);
                        break;
                    }
                }
            }
        }
        for fd in gone {
            let holds: Vec<Key> = s
                .conns
                .iter()
                .find(|c| c.sock.as_raw_fd() == fd)
                .map(|c| c.holds.iter().copied().collect())
                .unwrap_or_default();
            for key in holds {
                release(&mut s, fd, key);
            }
            s.conns.retain(|c| c.sock.as_raw_fd() != fd);
        }
    }
}

/// Follower `fd` no longer holds chunk `key`.
fn release(s: &mut State, fd: i32, key: Key) {
    let Some(c) = s.conns.iter_mut().find(|c| c.sock.as_raw_fd() == fd) else {
        return;
    };
    if !c.holds.remove(&key) {
        return;
    }
    if let Some(n) = s.held.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            s.held.remove(&key);
        }
    }
}

/// One message of a follower's non-blocking socket: `Ok(None)` when none
/// waits, `Err` when it is gone.
fn recv_nonblocking(fd: i32) -> Result<Option<Message>, ()> {
    use nix::sys::socket::{recv, MsgFlags};
    let mut peek = [0u8; 1];
    match recv(fd, &mut peek, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Err(nix::errno::Errno::EAGAIN) => Ok(None),
        Err(nix::errno::Errno::EINTR) => Ok(None),
        Err(_) | Ok(0) => Err(()),
        Ok(_) => match wire::receive(fd) {
            Ok(Some(m)) => Ok(Some(m)),
            Ok(None) | Err(_) => Err(()),
        },
    }
}
