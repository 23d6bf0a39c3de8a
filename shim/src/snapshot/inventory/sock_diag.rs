//! The listening TCP sockets of the calling thread's network namespace,
//! asked of the kernel over `NETLINK_SOCK_DIAG` (linux/inet_diag.h), as
//! `ss -lt` does. Reading `/proc/<pid>/net/tcp{,6}` walks every bucket of
//! the host's established-connection hash table to print a handful of
//! rows (10-13 ms per restore on a 24 GiB host, two tables); a dump of
//! the LISTEN state only walks the listening hash. The listener check
//! (listener.rs) asks this first and falls back to the tables.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::snapshot::inventory::tcp_table::{normalize, TcpEntry, TcpState};

// <linux/netlink.h>, <linux/sock_diag.h>, <linux/inet_diag.h>
const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const TCP_LISTEN: u32 = 10;
const NLMSG_HDR: usize = 16;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
/// `struct inet_diag_msg`: family, state, timer, retrans, sockid (48),
/// expires, rqueue, wqueue, uid, inode.
const MSG_LEN: usize = 72;

/// Every listening TCP socket (IPv4 and IPv6) of the calling thread's
/// network namespace.
pub fn listening() -> Result<Vec<TcpEntry>, String> {
    let sock = open()?;
    let mut out = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        dump(&sock, family as u8, &mut out)?;
    }
    Ok(out)
}

fn open() -> Result<OwnedFd, String> {
    // SAFETY: a plain socket(2); the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(format!(
            "netlink sock_diag socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The request: a dump of `family`'s TCP sockets in LISTEN.
fn request(family: u8) -> [u8; NLMSG_HDR + REQ_LEN] {
    let mut m = [0u8; NLMSG_HDR + REQ_LEN];
    m[0..4].copy_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    m[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m[8..12].copy_from_slice(&1u32.to_ne_bytes());
    m[NLMSG_HDR] = family;
    m[NLMSG_HDR + 1] = libc::IPPROTO_TCP as u8;
    m[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    m
}

fn dump(sock: &OwnedFd, family: u8, out: &mut Vec<TcpEntry>) -> Result<(), String> {
    let req = request(family);
    // SAFETY: a zeroed sockaddr_nl is the kernel's address (pid 0).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `kernel` are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != req.len() as isize {
        return Err(format!(
            "netlink sock_diag request: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut buf = vec![0u8; 32 << 10];
    loop {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("netlink sock_diag reply: {e}"));
        }
        if parse(&buf[..n as usize], out)? {
            return Ok(());
        }
    }
}

/// Reads the messages of one datagram into `out`; true at the dump's end.
fn parse(mut data: &[u8], out: &mut Vec<TcpEntry>) -> Result<bool, String> {
    if data.is_empty() {
        return Ok(true);
    }
    while data.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(data[4..6].try_into().expect("2 bytes"));
        if len < NLMSG_HDR || len > data.len() {
            return Err(format!("netlink sock_diag: a message of {len} bytes"));
        }
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = data
                    .get(NLMSG_HDR..NLMSG_HDR + 4)
                    .map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")));
                return Err(format!(
                    "netlink sock_diag: {}",
                    std::io::Error::from_raw_os_error(-errno)
                ));
            }
            SOCK_DIAG_BY_FAMILY => {
                if let Some(e) = entry(&data[NLMSG_HDR..len]) {
                    out.push(e);
                }
            }
            _ => {}
        }
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        data = data.get(len.div_ceil(4) * 4..).unwrap_or_default();
    }
    Ok(false)
}

/// One `struct inet_diag_msg` as a table row (the remote end of a
/// listening socket is the unspecified address).
fn entry(m: &[u8]) -> Option<TcpEntry> {
    if m.len() < MSG_LEN {
        return None;
    }
    let port = u16::from_be_bytes([m[4], m[5]]);
    let ip = match m[0] as i32 {
        libc::AF_INET => IpAddr::V4(Ipv4Addr::new(m[8], m[9], m[10], m[11])),
        libc::AF_INET6 => {
            let bytes: [u8; 16] = m[8..24].try_into().ok()?;
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    let unspecified = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    Some(TcpEntry {
        local: SocketAddr::new(normalize(ip), port),
        remote: SocketAddr::new(unspecified, 0),
        state: match u32::from(m[1]) {
            TCP_LISTEN => TcpState::Listen,
            n => TcpState::Other(n as u8),
        },
        inode: u64::from(u32::from_ne_bytes(m[68..72].try_into().ok()?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inode of the socket behind `fd` of this process.
    fn inode_of(fd: i32) -> u64 {
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        let s = link.to_string_lossy();
        s.strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn a_listener_of_this_process_is_found_with_its_address_and_inode() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::TcpListener::bind("[::1]:0").ok();
        let found = listening().unwrap();
        let addr = v4.local_addr().unwrap();
        let row = found
            .iter()
            .find(|e| e.local == addr)
            .expect("the v4 listener");
        assert_eq!(row.state, TcpState::Listen);
        assert_eq!(row.inode, inode_of(v4.as_raw_fd()));
        if let Some(v6) = v6 {
            let addr = v6.local_addr().unwrap();
            let row = found
                .iter()
                .find(|e| e.local == addr)
                .expect("the v6 listener");
            assert_eq!(row.inode, inode_of(v6.as_raw_fd()));
        }
        // A connected socket is not a listener.
        let client = std::net::TcpStream::connect(addr).unwrap();
        let local = client.local_addr().unwrap();
        assert!(!listening().unwrap().iter().any(|e| e.local == local));
    }

    #[test]
    fn a_dump_of_messages_ends_at_done_and_an_error_names_its_errno() {
        let mut done = vec![0u8; NLMSG_HDR + 4];
        done[0..4].copy_from_slice(&((NLMSG_HDR + 4) as u32).to_ne_bytes());
        done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        assert_eq!(parse(&done, &mut Vec::new()), Ok(true));
        let mut err = done.clone();
        err[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        err[NLMSG_HDR..NLMSG_HDR + 4].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        let e = parse(&err, &mut Vec::new()).unwrap_err();
        assert!(e.contains("No such file"), "{e}");
        let mut short = done;
        short[0..4].copy_from_slice(&4u32.to_ne_bytes());
        assert!(parse(&short, &mut Vec::new()).is_err());
    }
}
