//! Whose listener answered? A connect to the listen address proves that
//! something listens, not that it is the engine: another process of the
//! host (with host networking) or of a pod sibling may hold the port while
//! the copy failed to bind. The listening socket must belong to a process
//! of the engine's own container: its inode, from the network namespace's
//! `/proc/<pid>/net/tcp{,6}`, among the descriptors of a process in the
//! engine's cgroup.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

/// TCP state LISTEN in /proc/net/tcp.
const LISTEN: &str = "0A";

/// Ok when a socket listening on `addr` in the network namespace of `pid`
/// is held by a process of `pid`'s container; else what holds it.
pub fn check_owned(pid: i32, addr: SocketAddr) -> Result<(), String> {
    let mut inodes = HashSet::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        inodes.extend(listening_inodes(&text, addr));
    }
    if inodes.is_empty() {
        return Err(format!(
            "no socket listens on {addr} in the container's network namespace"
        ));
    }
    // The engine may have died already (failing to bind the same port):
    // then nothing of the container holds it, and the holder is named.
    let members = container_pids(pid).unwrap_or_default();
    if members.iter().any(|p| holds_any(*p, &inodes)) {
        return Ok(());
    }
    let holders: Vec<String> = all_pids()
        .into_iter()
        .filter(|p| holds_any(*p, &inodes))
        .map(|p| format!("pid {p} ({})", comm(p)))
        .collect();
    Err(format!(
        "{addr} is held by a process outside the container ({}), not by the engine",
        if holders.is_empty() {
            "not found".to_string()
        } else {
            holders.join(", ")
        }
    ))
}

/// The inodes of sockets in LISTEN state on `addr`'s port whose local
/// address is `addr`'s, the unspecified one, or (tcp6) its v4-mapped form.
fn listening_inodes(table: &str, addr: SocketAddr) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            if *state != LISTEN {
                return None;
            }
            let (ip, port) = parse_local(local)?;
            let covers = ip == addr.ip()
                || ip.is_unspecified()
                || matches!((ip, addr.ip()), (IpAddr::V6(v6), IpAddr::V4(v4)) if v6.to_ipv4_mapped() == Some(v4));
            (port == addr.port() && covers).then(|| inode.parse().ok())?
        })
        .collect()
}

/// `0100007F:1F40` (v4) or 32 hex digits (v6), in the kernel's byte order:
/// each 32-bit word little-endian.
fn parse_local(s: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).map(u32::from_be))
        .collect::<Result<_, _>>()
        .ok()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some((ip, port))
}

/// The processes of `pid`'s container: its cgroup's members.
pub fn container_pids(pid: i32) -> Result<Vec<i32>, String> {
    let cgroups =
        crate::metrics::cgroups_of(pid as u32, "the engine's cgroup").map_err(|e| e.to_string())?;
    let dir = match &cgroups {
        crate::metrics::Cgroups::V1(dirs) => dirs
            .get("pids")
            .or_else(|| dirs.get("memory"))
            .or_else(|| dirs.values().next())
            .cloned(),
        crate::metrics::Cgroups::V2(dir) => Some(dir.clone()),
    }
    .ok_or_else(|| format!("no cgroup of pid {pid}"))?;
    let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map_err(|e| format!("{}: {e}", dir.join("cgroup.procs").display()))?;
    Ok(procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

fn holds_any(pid: i32, inodes: &HashSet<u64>) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .ok()
            .and_then(|l| {
                l.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse::<u64>()
                    .ok()
            })
            .is_some_and(|i| inodes.contains(&i))
    })
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn local_addresses_parse_in_the_kernels_byte_order() {
        assert_eq!(
            parse_local("0100007F:1F40"),
            Some(("127.0.0.1".parse().unwrap(), 8000))
        );
        assert_eq!(
            parse_local("00000000000000000000000001000000:0050"),
            Some(("::1".parse().unwrap(), 80))
        );
        assert_eq!(
            parse_local("0000000000000000FFFF00000100007F:0050"),
            Some(("::ffff:127.0.0.1".parse().unwrap(), 80))
        );
    }

    #[test]
    fn listeners_of_this_process_are_found_and_owned() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let me = std::process::id() as i32;
        let text = std::fs::read_to_string(format!("/proc/{me}/net/tcp")).unwrap();
        let inodes: HashSet<u64> = listening_inodes(&text, addr).into_iter().collect();
        assert_eq!(inodes.len(), 1, "{text}");
        assert!(holds_any(me, &inodes));
        // This test process is in its own cgroup with its listener: owned.
        check_owned(me, addr).unwrap();
        drop(l);
        let e = check_owned(me, addr).unwrap_err();
        assert!(e.contains("no socket listens"), "{e}");
    }

    /// A "container" (a fresh cgroup holding one shell) whose port is held
    /// by this test process, outside it: refused, naming the holder.
    #[test]
    fn a_listener_outside_the_cgroup_is_refused_naming_its_holder() {
        use crate::metrics::test_support::{require_root, Shell, TestCgroup};
        require_root();
        let cg = TestCgroup::create(&["pids", "memory"], "listener");
        let shell = Shell::spawn("read x");
        cg.add(shell.pid());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let e = check_owned(shell.pid() as i32, addr).unwrap_err();
        let me = std::process::id();
        assert!(
            e.contains(&format!(
                "{addr} is held by a process outside the container (pid {me} "
            )),
            "{e}"
        );
    }
}
