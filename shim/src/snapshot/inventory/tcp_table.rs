//! One reading of the kernel's TCP tables (`/proc/<pid>/net/tcp` and
//! `tcp6`) and of a process's socket descriptors, for the capture's
//! inventory (inventory.rs) and the listener check (listener.rs).
//!
//! Addresses come out as [`SocketAddr`]s with v4-mapped IPv6 addresses
//! (`::ffff:a.b.c.d`) turned into IPv4: a dual-stack socket that talks to an
//! IPv4 peer is a row of `tcp6`, its peer's end a row of `tcp`, and the two
//! must compare equal.
//!
//! Hand-written rather than procfs-core's (0.18): that one drops the whole
//! table for one row it cannot read (a state beyond the twelve it names),
//! and an empty table would let the inventory's check of outside
//! connections pass; here such a row is typed `Other` and the rest read.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The states vsnap looks at (include/net/tcp_states.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpState {
    Established,
    Listen,
    /// Any other state, by its number.
    Other(u8),
}

impl TcpState {
    fn from_code(code: u8) -> Self {
        match code {
            0x01 => TcpState::Established,
            0x0A => TcpState::Listen,
            n => TcpState::Other(n),
        }
    }
}

/// One row of a TCP table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpEntry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub state: TcpState,
    pub inode: u64,
}

/// The rows of one table's text (`tcp` or `tcp6`); the header and any row
/// that does not parse are skipped.
pub fn parse(table: &str) -> Vec<TcpEntry> {
    table.lines().skip(1).filter_map(parse_row).collect()
}

/// `sl local remote st tx:rx tr:when retrnsmt uid timeout inode ...`
fn parse_row(line: &str) -> Option<TcpEntry> {
    let f: Vec<&str> = line.split_whitespace().collect();
    Some(TcpEntry {
        local: parse_addr(f.get(1)?)?,
        remote: parse_addr(f.get(2)?)?,
        state: TcpState::from_code(u8::from_str_radix(f.get(3)?, 16).ok()?),
        inode: f.get(9)?.parse().ok()?,
    })
}

/// `0100007F:1F40` (IPv4) or 32 hex digits (IPv6), and a hex port. The
/// kernel prints an address as 32-bit words (one for IPv4, four for IPv6),
/// each the next four bytes of the address in network order read as a
/// host integer: on the little-endian hosts vsnap runs on, four
/// little-endian words, so `0100007F` is 127.0.0.1 and
/// `B80D0120000000000000000001000000` is 2001:db8::1. A v4-mapped IPv6
/// address comes out as IPv4.
pub fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let hex = |digits: &str| digits.bytes().all(|b| b.is_ascii_hexdigit());
    if port.is_empty() || !hex(port) {
        return None;
    }
    let port = u16::from_str_radix(port, 16).ok()?;
    // The bytes of word `i`, in address order.
    let word = |i: usize| -> Option<[u8; 4]> {
        let digits = ip.get(i * 8..i * 8 + 8).filter(|d| hex(d))?;
        u32::from_str_radix(digits, 16).ok().map(u32::to_ne_bytes)
    };
    let ip = match ip.len() {
        8 => IpAddr::from(word(0)?),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            IpAddr::from(bytes)
        }
        _ => return None,
    };
    Some(SocketAddr::new(normalize(ip), port))
}

/// A v4-mapped IPv6 address as the IPv4 address it stands for; any other
/// address as it is.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether a socket listening on `listen` accepts connections to `addr`:
/// same port, and the same address, or the unspecified address of its
/// family, or `::` (a dual-stack socket: the table does not say whether it
/// is IPv6-only, so it is taken to accept IPv4 too).
pub fn covers(listen: SocketAddr, addr: SocketAddr) -> bool {
    let (l, a) = (normalize(listen.ip()), normalize(addr.ip()));
    listen.port() == addr.port()
        && (l == a
            || (l == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && a.is_ipv4())
            || l == IpAddr::V6(Ipv6Addr::UNSPECIFIED))
}

/// Both tables of the network namespace `pid` is in (a table that cannot
/// be read, as without IPv6, counts as empty).
pub fn read(pid: i32) -> Vec<TcpEntry> {
    read_under(&format!("/proc/{pid}/net"))
}

/// The rows of the network namespace the calling thread is in (one that
/// joined a container's namespace outlives the container's processes).
pub fn read_own_thread() -> Vec<TcpEntry> {
    read_under("/proc/thread-self/net")
}

fn read_under(dir: &str) -> Vec<TcpEntry> {
    ["tcp", "tcp6"]
        .iter()
        .flat_map(|t| parse(&std::fs::read_to_string(format!("{dir}/{t}")).unwrap_or_default()))
        .collect()
}

/// The inodes of the sockets `pid` holds open (none when it is gone).
pub fn socket_inodes(pid: i32) -> Vec<u64> {
    vsnap_host::fds::open_fds(pid)
        .into_iter()
        .filter_map(|f| {
            f.target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Rows as the kernel writes them (from a dual-stack listener on `::`
    //! that accepted an IPv4 client), addresses changed to documentation ones.

    /// tcp: the client's end of 192.0.2.2:33029 -> 192.0.2.2:29500 (inode
    /// 41001), a listener on 127.0.0.1:8000 (41003) and one on 0.0.0.0:8001
    /// (41004), and a connection 192.0.2.2:33030 -> 198.51.100.7:443 (41005).
    pub const TCP: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode                                                     
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41003 1 00000000e2794ef6 100 0 0 10 0                     
   1: 00000000:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41004 1 00000000ff8a081f 100 0 0 10 0                     
   2: 020200C0:8105 020200C0:733C 01 00000000:00000000 00:00000000 00000000     0        0 41001 2 000000000106d1b0 20 0 0 10 -1                     
   3: 020200C0:8106 076433C6:01BB 01 00000000:00000000 00:00000000 00000000     0        0 41005 2 000000000106d1b1 20 0 0 10 -1                     
";

    /// tcp6: the dual-stack listener on [::]:29500 (41000) and its end of the
    /// connection above, v4-mapped (41002); a listener on [::ffff:127.0.0.1]:8002
    /// (41006) and one on [::1]:8003 (41007).
    pub const TCP6: &str = "\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:733C 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41000 1 00000000ed4c42bc 100 0 0 10 0
   1: 0000000000000000FFFF0000020200C0:733C 0000000000000000FFFF0000020200C0:8105 01 00000000:00000000 00:00000000 00000000     0        0 41002 1 00000000ece4334b 20 0 0 10 -1
   2: 0000000000000000FFFF00000100007F:1F42 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41006 1 00000000ece4334c 100 0 0 10 0
   3: 00000000000000000000000001000000:1F43 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41007 1 00000000ece4334d 100 0 0 10 0
";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_parse_in_the_kernels_byte_order() {
        assert_eq!(parse_addr("0100007F:1F40"), Some(addr("127.0.0.1:8000")));
        assert_eq!(parse_addr("0200000A:0050"), Some(addr("10.0.0.2:80")));
        assert_eq!(
            parse_addr("00000000000000000000000001000000:0050"),
            Some(addr("[::1]:80"))
        );
        assert_eq!(
            parse_addr("B80D0120000000000000000001000000:01BB"),
            Some(addr("[2001:db8::1]:443"))
        );
        assert_eq!(parse_addr("0100007F"), None);
        assert_eq!(parse_addr("0100007:1F40"), None);
        assert_eq!(parse_addr("+100007F:1F40"), None);
    }

    #[test]
    fn ipv6_addresses_are_four_words_each_in_host_order() {
        // 2001:db8:1234:5678:9abc:def0:ddee:ff00: every word differs, so a
        // reversal of the whole address, or of no word, shows.
        assert_eq!(
            parse_addr("B80D012078563412F0DEBC9A00FFEEDD:1F90"),
            Some(addr("[2001:db8:1234:5678:9abc:def0:ddee:ff00]:8080"))
        );
        assert_eq!(
            parse_addr("000080FE00000000FFAA1102FEAA33FE:0016"),
            Some(addr("[fe80::211:aaff:fe33:aafe]:22"))
        );
        assert_eq!(
            parse_addr("00000000000000000000000000000000:0000"),
            Some(addr("[::]:0"))
        );
        // Neither one word nor four; a port that is no hex number.
        assert_eq!(parse_addr("0100007F01000000:0050"), None);
        assert_eq!(parse_addr("B80D01200000000000000000010000001:0050"), None);
        assert_eq!(parse_addr("0100007F:+050"), None);
        assert_eq!(parse_addr("0100007F:"), None);
        assert_eq!(parse_addr("0100007F:10000"), None);
        assert_eq!(
            parse_addr("B80D012000000000000000000100000\u{e9}:0050"),
            None
        );
    }

    #[test]
    fn v4_mapped_addresses_come_out_as_ipv4() {
        assert_eq!(
            parse_addr("0000000000000000FFFF0000020200C0:733C"),
            Some(addr("192.0.2.2:29500"))
        );
    }

    #[test]
    fn rows_are_typed() {
        let tcp = parse(fixtures::TCP);
        assert_eq!(tcp.len(), 4);
        assert_eq!(
            tcp[2],
            TcpEntry {
                local: addr("192.0.2.2:33029"),
                remote: addr("192.0.2.2:29500"),
                state: TcpState::Established,
                inode: 41001,
            }
        );
        let tcp6 = parse(fixtures::TCP6);
        assert_eq!(tcp6[0].local, addr("[::]:29500"));
        assert_eq!(tcp6[0].state, TcpState::Listen);
        assert_eq!(
            (tcp6[1].local, tcp6[1].remote),
            (addr("192.0.2.2:29500"), addr("192.0.2.2:33029"))
        );
        assert!(parse("header\n   0: garbage\n").is_empty());
    }

    /// One row of each kind: IPv4 (tcp), IPv6 and v4-mapped IPv6 (tcp6),
    /// and a state vsnap has no name for, which keeps its row (and the
    /// table its other rows).
    #[test]
    fn rows_of_each_kind() {
        let tcp = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0200000A:0050 0300000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 51001 1 0 20 4 30 10 -1
   1: 0100007F:1F44 00000000:0000 0D 00000000:00000000 00:00000000 00000000     0        0 51002 1 0 100 0 0 10 0
";
        assert_eq!(
            parse(tcp),
            [
                TcpEntry {
                    local: addr("10.0.0.2:80"),
                    remote: addr("10.0.0.3:54321"),
                    state: TcpState::Established,
                    inode: 51001,
                },
                TcpEntry {
                    local: addr("127.0.0.1:8004"),
                    remote: addr("0.0.0.0:0"),
                    state: TcpState::Other(0x0D),
                    inode: 51002,
                },
            ]
        );
        let tcp6 = "\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: B80D012078563412F0DEBC9A00FFEEDD:1F90 B80D0120000000000000000002000000:C350 01 00000000:00000000 00:00000000 00000000  1000        0 51003 1 0 20 4 30 10 -1
   1: 0000000000000000FFFF00000200000A:0050 0000000000000000FFFF00000300000A:D432 06 00000000:00000000 03:00000F9F 00000000     0        0 0 3 0
   2: 0000000000000000FFFF00000200000A:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0
";
        assert_eq!(
            parse(tcp6),
            [
                TcpEntry {
                    local: addr("[2001:db8:1234:5678:9abc:def0:ddee:ff00]:8080"),
                    remote: addr("[2001:db8::2]:50000"),
                    state: TcpState::Established,
                    inode: 51003,
                },
                TcpEntry {
                    local: addr("10.0.0.2:80"),
                    remote: addr("10.0.0.3:54322"),
                    state: TcpState::Other(0x06),
                    inode: 0,
                },
            ],
            "the row without an inode is skipped"
        );
    }

    #[test]
    fn what_a_listener_covers() {
        let a = addr("127.0.0.1:8000");
        assert!(covers(addr("127.0.0.1:8000"), a));
        assert!(covers(addr("0.0.0.0:8000"), a));
        assert!(covers(addr("[::]:8000"), a), "dual-stack");
        assert!(covers(addr("[::ffff:127.0.0.1]:8000"), a));
        assert!(!covers(addr("127.0.0.1:8001"), a));
        assert!(!covers(addr("10.0.0.1:8000"), a));
        assert!(
            !covers(addr("0.0.0.0:8000"), addr("[::1]:8000")),
            "an IPv4 socket takes no IPv6 connection"
        );
        assert!(covers(addr("[::]:8000"), addr("[::1]:8000")));
    }

    #[test]
    fn this_process_reads_its_own_tables_and_sockets() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let me = std::process::id() as i32;
        let mine = socket_inodes(me);
        let found = read(me).into_iter().any(|e| {
            e.state == TcpState::Listen
                && e.local == l.local_addr().unwrap()
                && mine.contains(&e.inode)
        });
        assert!(found);
    }
}
