//! CRIU's side of the lazy-pages socket (`criu/uffd.c`): listening on
//! `lazy-pages.socket` in the work folder, then per task an `int` pid and
//! its userfaultfd with one byte, a negative pid for a zombie, and
//! `RESTORE_FINISHED` once every task is in place.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{pid as task, PageError, Phase};

/// CRIU connects to this name in its work folder.
pub const SOCKET_NAME: &str = "lazy-pages.socket";
/// `LAZY_PAGES_RESTORE_FINISHED` ("RSTF").
pub(super) const RESTORE_FINISHED: u32 = 0x5253_5446;

/// Binds `socket`; a path too long for `sun_path` is reached through the
/// folder's descriptor.
pub(super) fn bind(work: &Path, socket: &Path) -> Result<UnixListener, PageError> {
    let fail = |e: std::io::Error| PageError::failed(Phase::Listen, socket.display(), e);
    if socket.as_os_str().len() < 100 {
        return UnixListener::bind(socket).map_err(fail);
    }
    let dir = File::open(work).map_err(fail)?;
    UnixListener::bind(format!("/proc/self/fd/{}/{SOCKET_NAME}", dir.as_raw_fd())).map_err(fail)
}

/// CRIU's connection as errors name it.
const CONN: &str = "CRIU's connection";

fn conn_error(detail: impl std::fmt::Display) -> PageError {
    PageError::failed(Phase::Connect, CONN, detail)
}

pub(super) fn accept(listener: &UnixListener, stop: &AtomicBool) -> Result<UnixStream, PageError> {
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false).map_err(conn_error)?;
                // Each message then says which process sent it: a task
                // sends its own descriptor (its host pid, for huge pages).
                nix::sys::socket::setsockopt(&conn, nix::sys::socket::sockopt::PassCred, &true)
                    .map_err(|e| conn_error(format!("SO_PASSCRED: {e}")))?;
                return Ok(conn);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::SeqCst) {
                    return Err(PageError::cancelled(Phase::Connect));
                }
                let mut p = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 50) };
            }
            Err(e) => return Err(conn_error(format!("accept: {e}"))),
        }
    }
}

pub(super) enum Message {
    /// CRIU's pid of a task, its userfaultfd, and the host pid of the
    /// process that sent them (the task itself), where the kernel said.
    Task(i32, OwnedFd, Option<i32>),
    Zombie,
    Finished,
}

/// One message of CRIU's lazy-pages protocol.
pub(super) fn receive(conn: &UnixStream) -> Result<Message, PageError> {
    let mut word = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let (n, _, _) = recv(conn, &mut word[got..])?;
        if n == 0 {
            return Err(conn_error("closed by CRIU before the restore finished"));
        }
        got += n;
    }
    let value = u32::from_ne_bytes(word);
    if value == RESTORE_FINISHED {
        return Ok(Message::Finished);
    }
    let pid = value as i32;
    if pid < 0 {
        return Ok(Message::Zombie);
    }
    let mut byte = [0u8; 1];
    match recv(conn, &mut byte)? {
        (1, Some(fd), sender) => Ok(Message::Task(pid, fd, sender)),
        _ => Err(PageError::failed(
            Phase::Connect,
            task(pid),
            "sent by CRIU without its userfaultfd",
        )),
    }
}

/// `recvmsg` of up to `buf.len()` bytes, at most one descriptor, and the
/// sender's pid.
fn recv(
    conn: &UnixStream,
    buf: &mut [u8],
) -> Result<(usize, Option<OwnedFd>, Option<i32>), PageError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!(RawFd, libc::ucred);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| conn_error(format!("recvmsg: {e}")))?;
    let (mut fd, mut sender) = (None, None);
    for c in msg
        .cmsgs()
        .map_err(|e| conn_error(format!("recvmsg: {e}")))?
    {
        match c {
            ControlMessageOwned::ScmRights(fds) => {
                for raw in fds {
                    // SAFETY: a descriptor just received, owned by nobody else.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
            ControlMessageOwned::ScmCredentials(c) if c.pid() > 0 => sender = Some(c.pid()),
            _ => {}
        }
    }
    Ok((msg.bytes, fd, sender))
}
