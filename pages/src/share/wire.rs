//! The share's messages, one per `SOCK_SEQPACKET` packet (so a message is
//! never split or merged): a kind, the chunk, its length and the pages
//! file it belongs to (`images/pages-<id>.img`); a `Chunk` carries its
//! sealed memfd as `SCM_RIGHTS`.
//!
//! Leader to follower: `Chunk` (verified, here are its bytes), `Skip` (not
//! shared: read it yourself), `Damaged` (it does not match its digest).
//! Follower to leader: `Done` (a chunk received is placed or dropped: the
//! leader counts the chunks still held, its bound on memory).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};

use crate::error::{PageError, Phase};

/// The share's connection as errors name it.
const SOCKET: &str = "the share's socket";

fn socket_error(detail: impl std::fmt::Display) -> PageError {
    PageError::failed(Phase::Share, SOCKET, detail)
}

/// The longest packet: the header and a pages file's name.
const MAX: usize = 512;
const HEADER: usize = 1 + 4 + 8 + 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chunk = 1,
    Skip = 2,
    Damaged = 3,
    Done = 4,
}

/// One message; `fd` only with a `Chunk`.
#[derive(Debug)]
pub(super) struct Message {
    pub(super) kind: Kind,
    pub(super) file: String,
    pub(super) chunk: usize,
    /// The chunk's bytes (a `Chunk`'s memfd holds exactly these).
    pub(super) len: u64,
    pub(super) fd: Option<OwnedFd>,
}

impl Message {
    pub(super) fn new(kind: Kind, file: &str, chunk: usize, len: u64) -> Self {
        Message {
            kind,
            file: file.to_string(),
            chunk,
            len,
            fd: None,
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + self.file.len());
        b.push(self.kind as u8);
        b.extend((self.chunk as u32).to_le_bytes());
        b.extend(self.len.to_le_bytes());
        b.extend((self.file.len() as u16).to_le_bytes());
        b.extend(self.file.as_bytes());
        b
    }

    fn decode(b: &[u8], fd: Option<OwnedFd>) -> Result<Self, String> {
        if b.len() < HEADER {
            return Err(format!("a {}-byte message", b.len()));
        }
        let kind = match b[0] {
            1 => Kind::Chunk,
            2 => Kind::Skip,
            3 => Kind::Damaged,
            4 => Kind::Done,
            k => return Err(format!("a message of kind {k}")),
        };
        let chunk = u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")) as usize;
        let len = u64::from_le_bytes(b[5..13].try_into().expect("8 bytes"));
        let n = u16::from_le_bytes(b[13..15].try_into().expect("2 bytes")) as usize;
        let file = std::str::from_utf8(b.get(HEADER..HEADER + n).ok_or("a cut message")?)
            .map_err(|_| "a file name that is not UTF-8")?
            .to_string();
        if (kind == Kind::Chunk) != fd.is_some() {
            return Err(format!(
                "a {kind:?} message with {} descriptor",
                fd.map_or("no", |_| "a")
            ));
        }
        Ok(Message {
            kind,
            file,
            chunk,
            len,
            fd,
        })
    }
}

/// Sends `m` on `sock` without waiting (a full socket is an error: the
/// peer is not reading).
pub(super) fn send(sock: RawFd, m: &Message) -> Result<(), PageError> {
    let bytes = m.encode();
    let fds: Vec<RawFd> = m.fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs: Vec<ControlMessage> = match fds.is_empty() {
        true => Vec::new(),
        false => vec![ControlMessage::ScmRights(&fds)],
    };
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    socket::sendmsg::<()>(sock, &[IoSlice::new(&bytes)], &cmsgs, flags, None).map_err(|e| {
        let chunk = format!("{} chunk {}", m.file, m.chunk);
        PageError::failed(Phase::Share, chunk, format!("send {:?}: {e}", m.kind))
    })?;
    Ok(())
}

/// Receives one message (blocking); `None` once the peer is gone.
pub(super) fn receive(sock: RawFd) -> Result<Option<Message>, PageError> {
    let mut buf = [0u8; MAX];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let (n, fd, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let m = match socket::recvmsg::<()>(
            sock,
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            Err(Errno::ECONNRESET) => return Ok(None),
            Err(e) => return Err(socket_error(format!("receive: {e}"))),
            Ok(m) => m,
        };
        let mut fd = None;
        for c in m
            .cmsgs()
            .map_err(|e| socket_error(format!("receive: {e}")))?
        {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just gave this process `raw`.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    fd.get_or_insert(owned);
                }
            }
        }
        let truncated = m
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
        break (m.bytes, fd, truncated);
    };
    if n == 0 && fd.is_none() {
        return Ok(None);
    }
    if truncated {
        return Err(socket_error(
            "receive: a message or its descriptors were cut",
        ));
    }
    Message::decode(&buf[..n], fd)
        .map(Some)
        .map_err(|e| socket_error(format!("receive: {e}")))
}

fn seqpacket() -> Result<OwnedFd, PageError> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| socket_error(format!("socket: {e}")))
}

/// Listens on `path` (made 0600: its folder is root's only already).
pub(super) fn listen(path: &Path) -> Result<OwnedFd, PageError> {
    let at = |detail: String| PageError::failed(Phase::Share, path.display(), detail);
    let fail = |e: Errno| at(format!("listen: {e}"));
    let addr = UnixAddr::new(path).map_err(fail)?;
    let sock = seqpacket()?;
    let _ = std::fs::remove_file(path);
    socket::bind(sock.as_raw_fd(), &addr).map_err(fail)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| at(format!("chmod: {e}")))?;
    socket::listen(&sock, Backlog::new(64).map_err(fail)?).map_err(fail)?;
    Ok(sock)
}

/// A connection taken from `listener`, if one waits.
pub(super) fn accept(listener: &OwnedFd) -> Result<Option<OwnedFd>, PageError> {
    let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
    match socket::accept4(listener.as_raw_fd(), flags) {
        // SAFETY: a descriptor the kernel just gave this process.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(Errno::EAGAIN | Errno::EINTR | Errno::ECONNABORTED) => Ok(None),
        Err(e) => Err(socket_error(format!("accept: {e}"))),
    }
}

/// Connects to the leader listening on `path`.
pub(super) fn connect(path: &Path) -> Result<OwnedFd, PageError> {
    let fail = |e: Errno| PageError::failed(Phase::Share, path.display(), format!("connect: {e}"));
    let addr = UnixAddr::new(path).map_err(fail)?;
    let sock = seqpacket()?;
    socket::connect(sock.as_raw_fd(), &addr).map_err(fail)?;
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_travels_with_its_descriptor_and_a_skip_without() {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let mut m = Message::new(Kind::Chunk, "images/pages-1.img", 3, 1 << 26);
        m.fd = Some(file.into());
        send(a.as_raw_fd(), &m).unwrap();
        send(
            a.as_raw_fd(),
            &Message::new(Kind::Skip, "images/pages-2.img", 0, 9),
        )
        .unwrap();
        let got = receive(b.as_raw_fd()).unwrap().unwrap();
        assert_eq!(
            (got.kind, got.file.as_str(), got.chunk),
            (Kind::Chunk, "images/pages-1.img", 3)
        );
        assert_eq!(got.len, 1 << 26);
        assert!(got.fd.is_some());
        let got = receive(b.as_raw_fd()).unwrap().unwrap();
        assert_eq!((got.kind, got.chunk, got.len), (Kind::Skip, 0, 9));
        assert!(got.fd.is_none());
        drop(a);
        assert!(
            receive(b.as_raw_fd()).unwrap().is_none(),
            "the peer went away"
        );
    }
}
