//! Whose listener answered? A connect to the listen address proves that
//! something listens, not that it is the engine: another process of the
//! host (with host networking) or of a pod sibling may hold the port while
//! the copy failed to bind. The listening socket must belong to a process
//! of the engine's own container: its inode, from the network namespace's
//! listening sockets (sock_diag.rs; `/proc/<pid>/net/tcp{,6}` where
//! netlink cannot answer), among the descriptors of a process in the
//! engine's cgroup.

use std::collections::HashSet;
use std::net::SocketAddr;

use crate::snapshot::inventory::tcp_table::{self, TcpEntry, TcpState};

/// Ok when a socket listening on `addr` in the network namespace of `pid`
/// is held by a process of `pid`'s container; else what holds it. Called
/// from a thread in that namespace (restore::in_netns): when `pid` is gone
/// already (an engine that failed to bind this very port), the thread's
/// own reading of the namespace still names who holds it.
pub fn check_owned(pid: i32, addr: SocketAddr) -> Result<(), String> {
    let entries = crate::snapshot::inventory::sock_diag::listening().unwrap_or_else(|e| {
        log::debug!("{e}: reading /proc's TCP tables instead");
        let entries = tcp_table::read(pid);
        match entries.is_empty() {
            true => tcp_table::read_own_thread(),
            false => entries,
        }
    });
    let inodes: HashSet<u64> = listening_inodes(&entries, addr).into_iter().collect();
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

/// The inodes of the sockets in LISTEN state that take connections to
/// `addr` (its own address, the wildcard, or its v4-mapped form: see
/// [`tcp_table::covers`]).
fn listening_inodes(entries: &[TcpEntry], addr: SocketAddr) -> Vec<u64> {
    entries
        .iter()
        .filter(|e| e.state == TcpState::Listen && tcp_table::covers(e.local, addr))
        .map(|e| e.inode)
        .collect()
}

/// The processes of `pid`'s container: its cgroup's members.
pub fn container_pids(pid: i32) -> Result<Vec<i32>, String> {
    // An exited engine (a zombie until the shim reaps it) reads as a member
    // of the root cgroup: its "container" would be every process of the
    // host, the very ones its port may be held by.
    if crate::inflight::is_dead(pid) {
        return Err(format!("pid {pid} has exited"));
    }
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("pid {pid}: {e}"))?;
    let controllers = container_controllers(&own)
        .ok_or_else(|| format!("pid {pid} is in the root cgroup, not in a container's"))?;
    let cgroups = crate::cgroup_stats::cgroups_of(pid as u32, "the engine's cgroup")
        .map_err(|e| e.to_string())?;
    let dir = match &cgroups {
        crate::cgroup_stats::Cgroups::V1(dirs) => {
            controllers.iter().find_map(|c| dirs.get(c)).cloned()
        }
        crate::cgroup_stats::Cgroups::V2(dir) => Some(dir.clone()),
    }
    .ok_or_else(|| format!("no cgroup of pid {pid}"))?;
    let procs = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map_err(|e| format!("{}: {e}", dir.join("cgroup.procs").display()))?;
    Ok(procs
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

/// The controllers (v1; empty for the v2 line) of the first hierarchy in
/// which the process of `/proc/<pid>/cgroup` text `own` is below the root,
/// `pids` and `memory` first: a restored tree can be in its container's
/// cgroup in some hierarchies and still in the root of others. None when
/// it is in the root everywhere.
fn container_controllers(own: &str) -> Option<Vec<String>> {
    let below_root: Vec<Vec<String>> = own
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, names, path) = (f.next()?, f.next()?, f.next()?);
            (path != "/").then(|| names.split(',').map(str::to_string).collect())
        })
        .collect();
    let rank = |c: &Vec<String>| {
        if c.iter().any(|n| n == "pids") {
            0
        } else if c.iter().any(|n| n == "memory") {
            1
        } else {
            2
        }
    };
    below_root.into_iter().min_by_key(rank)
}

fn holds_any(pid: i32, inodes: &HashSet<u64>) -> bool {
    tcp_table::socket_inodes(pid)
        .iter()
        .any(|i| inodes.contains(i))
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

    fn fixture_rows() -> Vec<TcpEntry> {
        use crate::snapshot::inventory::tcp_table::fixtures;
        let mut rows = tcp_table::parse(fixtures::TCP);
        rows.extend(tcp_table::parse(fixtures::TCP6));
        rows
    }

    fn listening_on(addr: &str) -> Vec<u64> {
        listening_inodes(&fixture_rows(), addr.parse().unwrap())
    }

    #[test]
    fn a_listener_on_the_address_itself_is_found() {
        assert_eq!(listening_on("127.0.0.1:8000"), [41003]);
        assert_eq!(listening_on("[::1]:8003"), [41007]);
    }

    #[test]
    fn wildcard_listeners_take_their_familys_connections() {
        assert_eq!(listening_on("10.1.2.3:8001"), [41004], "0.0.0.0");
        assert_eq!(listening_on("192.0.2.2:29500"), [41000], "[::], dual-stack");
        assert_eq!(listening_on("[2001:db8::5]:29500"), [41000]);
        assert!(
            listening_on("[::1]:8001").is_empty(),
            "0.0.0.0 takes no IPv6 connection"
        );
    }

    #[test]
    fn a_v4_mapped_listener_takes_its_ipv4_address() {
        assert_eq!(listening_on("127.0.0.1:8002"), [41006]);
        assert_eq!(listening_on("[::ffff:127.0.0.1]:8002"), [41006]);
        assert!(listening_on("127.0.0.2:8002").is_empty());
    }

    #[test]
    fn connected_sockets_and_other_ports_are_not_listeners() {
        assert!(listening_on("192.0.2.2:33029").is_empty());
        assert!(listening_on("127.0.0.1:9000").is_empty());
    }

    #[test]
    fn listeners_of_this_process_are_found_and_owned() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let me = std::process::id() as i32;
        let rows = tcp_table::read(me);
        let inodes: HashSet<u64> = listening_inodes(&rows, addr).into_iter().collect();
        assert_eq!(inodes.len(), 1, "{rows:?}");
        assert!(holds_any(me, &inodes));
        // This test process, in a cgroup of its own with its listener, is
        // owned (a process wholly in the root cgroup has no container).
        let in_root = std::fs::read_to_string("/proc/self/cgroup")
            .unwrap()
            .lines()
            .all(|l| l.ends_with(":/"));
        if !in_root {
            check_owned(me, addr).unwrap();
        }
        drop(l);
        // Its socket is gone from the table. Another test of this process
        // may bind the same port the moment it is free (seen under load):
        // only then does something still listen there.
        let after = tcp_table::read(me);
        let still: HashSet<u64> = listening_inodes(&after, addr).into_iter().collect();
        assert!(still.is_disjoint(&inodes), "{after:?}");
        if still.is_empty() {
            let e = check_owned(me, addr).unwrap_err();
            assert!(e.contains("no socket listens"), "{e}");
        }
    }

    /// An exited engine not yet reaped (a zombie) reads as a member of the
    /// root cgroup: it has no container, so no process of the host counts
    /// as its own.
    #[test]
    fn an_exited_engine_has_no_container() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // A zombie until waited for.
        poll_until(|| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        });
        let e = container_pids(pid).unwrap_err();
        assert!(e.contains("has exited"), "{e}");
        let mut child = child;
        child.wait().unwrap();
    }

    fn poll_until(mut done: impl FnMut() -> bool) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < until, "timed out");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_container_is_found_in_a_hierarchy_where_it_is_below_the_root() {
        // A restored tree in its container's memory cgroup, still in the
        // root of pids (seen on a cgroup v1 host): memory, not the root.
        let own = "8:pids:/\n4:memory:/default/flt-f1\n1:cpu,cpuacct:/default/flt-f1\n0::/\n";
        assert_eq!(container_controllers(own), Some(vec!["memory".to_string()]));
        let own = "8:pids:/default/x\n4:memory:/default/x\n";
        assert_eq!(container_controllers(own), Some(vec!["pids".to_string()]));
        assert_eq!(container_controllers("8:pids:/\n4:memory:/\n0::/\n"), None);
        assert_eq!(
            container_controllers("0::/k8s/pod1\n"),
            Some(vec![String::new()])
        );
    }

    /// The engine failed to bind its port (held by another process) and
    /// exited before the check read its tables: the holder is still named
    /// (from the checking thread's own view of the namespace), not "no
    /// socket listens".
    #[test]
    fn an_engine_gone_before_the_check_still_names_the_holder() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id() as i32;
        child.wait().unwrap();
        let e = check_owned(gone, addr).unwrap_err();
        assert!(
            e.contains(&format!(
                "is held by a process outside the container (pid {}",
                std::process::id()
            )),
            "{e}"
        );
    }

    /// A "container" (a fresh cgroup holding one shell) whose port is held
    /// by this test process, outside it: refused, naming the holder.
    #[test]
    fn a_listener_outside_the_cgroup_is_refused_naming_its_holder() {
        use crate::cgroup_stats::test_support::{require_root, Shell, TestCgroup};
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
