//! What must not be in a tree about to be captured: io_uring instances
//! (CRIU cannot dump them) and established TCP connections to peers outside
//! the tree. Checked before CRIU runs, so the error names the process.

pub(crate) mod fsnotify;
pub(crate) mod pod_address;
pub(crate) mod sock_diag;
pub(crate) mod tcp_table;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;

use crate::error::{Error, Result};
use tcp_table::{TcpEntry, TcpState};

/// Fails naming the first process of `pids` that holds an io_uring fd.
pub fn check_no_io_uring(pids: &[i32]) -> Result<()> {
    for pid in pids {
        for f in vsnap_host::fds::open_fds(*pid) {
            if f.target == Path::new("anon_inode:[io_uring]") {
                return Err(Error::FailedPrecondition(format!(
                    "capture: inventory: pid {pid} holds an io_uring instance (fd {}); CRIU cannot dump io_uring: disable it in the engine (kernel.io_uring_disabled)",
                    f.fd
                )));
            }
        }
    }
    Ok(())
}

/// Every socket of the tree (`pids`) by inode, with the process that holds
/// it: read once, for both socket checks.
pub fn socket_holders(pids: &[i32]) -> HashMap<u64, i32> {
    pids.iter()
        .flat_map(|p| {
            tcp_table::socket_inodes(*p)
                .into_iter()
                .map(move |i| (i, *p))
        })
        .collect()
}

/// Fails naming the process and peer of an established TCP connection
/// whose other end is not a socket of the tree. A connection between two
/// processes of the tree (vLLM's rendezvous store connects the engine to
/// itself, on the host's address) is restored whole and is fine, whatever
/// its addresses and whichever table each end is in; one to anything else
/// cannot be restored.
pub fn check_no_outside_tcp(pids: &[i32], ours: &HashMap<u64, i32>) -> Result<()> {
    if ours.is_empty() {
        return Ok(());
    }
    // The tables are per network namespace: read each once.
    let mut seen_netns: Vec<std::path::PathBuf> = Vec::new();
    let mut entries = Vec::new();
    for pid in pids {
        if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            if seen_netns.contains(&ns) {
                continue;
            }
            seen_netns.push(ns);
        }
        entries.extend(tcp_table::read(*pid));
    }
    match outside_connection(&entries, &|inode| ours.get(&inode).copied()) {
        None => Ok(()),
        Some((owner, peer)) => Err(Error::FailedPrecondition(format!(
            "capture: inventory: pid {owner} has an established TCP connection to {peer} outside the captured tree; close it before capture"
        ))),
    }
}

/// Fails naming the process, the socket and the address of a socket of
/// the tree bound to its own network namespace's address, for a container
/// with a network of its own (pod_address.rs).
pub fn check_no_pod_address(
    pids: &[i32],
    ours: &HashMap<u64, i32>,
    spec: &serde_json::Value,
) -> Result<()> {
    if !pod_address::has_own_network(spec) || pids.is_empty() || ours.is_empty() {
        return Ok(());
    }
    let rows = pod_address::rows_of(pids[0]);
    match pod_address::first_tied(&rows, &|inode| ours.get(&inode).copied()) {
        None => Ok(()),
        Some(t) => Err(Error::FailedPrecondition(pod_address::message(
            &t,
            &comm(t.pid),
        ))),
    }
}

/// The first ESTABLISHED row held by the tree (`holder` names the process
/// holding a socket inode, `None` outside the tree) whose reverse tuple is
/// not also a row held by the tree: its holder and its peer.
fn outside_connection(
    entries: &[TcpEntry],
    holder: &dyn Fn(u64) -> Option<i32>,
) -> Option<(i32, SocketAddr)> {
    let established = || entries.iter().filter(|e| e.state == TcpState::Established);
    let held: HashSet<(SocketAddr, SocketAddr)> = established()
        .filter(|e| holder(e.inode).is_some())
        .map(|e| (e.local, e.remote))
        .collect();
    established().find_map(|e| {
        let owner = holder(e.inode)?;
        (!held.contains(&(e.remote, e.local))).then_some((owner, e.remote))
    })
}

/// Character devices CRIU 4.2 dumps (criu/files.c `dump_chrdev`, tty.c
/// `get_tty_driver`): the mem devices (major 1), tun and autofs (10:200,
/// 10:235), /dev/tty, /dev/console and /dev/ptmx (5:0-2), virtual consoles
/// (4:1-63), serial ports (188, 204), pty masters (128-135) and slaves (136).
pub fn crius_char_device(major: u64, minor: u64) -> bool {
    match major {
        1 | 188 | 204 | 128..=136 => true,
        10 => minor == 200 || minor == 235,
        5 => minor <= 2,
        4 => (1..=63).contains(&minor),
        _ => false,
    }
}

/// Fails naming the process, the device and the fd of a character device
/// CRIU cannot dump. NVIDIA device files are dumpable only in a CUDA process
/// (the CUDA plugin checkpoints its GPU state and releases them), which
/// `cuda_process` tells (`None`: a container without GPUs, where they are
/// never dumpable); a process that merely opened them (NVML does) is refused.
pub fn check_dumpable_devices(
    pids: &[i32],
    cuda_process: Option<&dyn Fn(i32) -> std::result::Result<(), String>>,
) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    for pid in pids {
        let fds: Vec<(String, std::path::PathBuf, u64)> = vsnap_host::fds::open_fds(*pid)
            .into_iter()
            .filter_map(|f| {
                let meta = std::fs::metadata(&f.path).ok()?;
                meta.file_type().is_char_device().then(|| {
                    (
                        f.fd.to_string(),
                        f.target,
                        std::os::unix::fs::MetadataExt::rdev(&meta),
                    )
                })
            })
            .collect();
        for (fd, target, rdev) in fds {
            let (major, minor) = (libc::major(rdev) as u64, libc::minor(rdev) as u64);
            if crius_char_device(major, minor) {
                continue;
            }
            let device = target.display();
            let nvidia = target.to_string_lossy().starts_with("/dev/nvidia");
            let refuse = |why: String| {
                Err(Error::FailedPrecondition(format!(
                    "capture: inventory: pid {pid} ({}) holds {device} ({major}:{minor}, fd {fd}), {why}",
                    comm(*pid)
                )))
            };
            match (nvidia, cuda_process) {
                (true, Some(is_cuda)) => {
                    if let Err(e) = is_cuda(*pid) {
                        return refuse(format!(
                            "but is not a CUDA process (cuda-checkpoint --get-restore-tid: {e}): \
                             CRIU's CUDA plugin checkpoints CUDA processes only, and CRIU cannot dump an \
                             NVIDIA device file another process opened (NVML does); close it before capture"
                        ));
                    }
                }
                _ => {
                    return refuse(
                        "a character device CRIU cannot dump; close it before capture".to_string(),
                    )
                }
            }
        }
    }
    Ok(())
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::snapshot::inventory::tcp_table::fixtures;

    /// The fixtures' rows in one table, as one network namespace shows them.
    fn rows() -> Vec<TcpEntry> {
        let mut rows = tcp_table::parse(fixtures::TCP);
        rows.extend(tcp_table::parse(fixtures::TCP6));
        rows
    }

    #[test]
    fn a_connection_between_an_ipv4_client_and_a_dual_stack_listener_of_the_tree_is_inside() {
        // The client's end (tcp, 41001) and the accepted end (tcp6,
        // v4-mapped, 41002) both held by the tree; 41005 is not in the tree.
        let tree = |inode: u64| matches!(inode, 41000..=41004).then_some(7);
        assert_eq!(outside_connection(&rows(), &tree), None);
    }

    #[test]
    fn a_connection_to_a_peer_outside_the_tree_is_named() {
        let tree = |inode: u64| (41000..=41005).contains(&inode).then_some(7);
        assert_eq!(
            outside_connection(&rows(), &tree),
            Some((7, "198.51.100.7:443".parse().unwrap()))
        );
    }

    #[test]
    fn an_end_whose_peer_is_held_outside_the_tree_is_outside() {
        // Only the client's end is the tree's: the listener's process is not.
        let tree = |inode: u64| (inode == 41001).then_some(9);
        assert_eq!(
            outside_connection(&rows(), &tree),
            Some((9, "192.0.2.2:29500".parse().unwrap()))
        );
        // Rows the tree does not hold are none of its business.
        assert_eq!(outside_connection(&rows(), &|_| None), None);
    }

    /// The live tests below look at every connection of this process: one
    /// holds a connection to a child while the other checks.
    static LIVE_TCP: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_dual_stack_listener_that_accepted_an_ipv4_client_of_this_process_is_inside() {
        let _one_at_a_time = LIVE_TCP.lock().unwrap_or_else(|e| e.into_inner());
        // Needs IPv6; a host without it has no dual-stack sockets either.
        let Ok(l) = std::net::TcpListener::bind("[::]:0") else {
            eprintln!("skipped: no IPv6 here");
            return;
        };
        let port = l.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_accepted, peer) = l.accept().unwrap();
        assert!(peer.ip().to_canonical().is_ipv4(), "{peer}");
        {
            let me = [std::process::id() as i32];
            check_no_outside_tcp(&me, &socket_holders(&me))
        }
        .unwrap();
    }

    #[test]
    fn a_connection_between_two_sockets_of_the_tree_is_inside() {
        use std::io::Read;
        let _one_at_a_time = LIVE_TCP.lock().unwrap_or_else(|e| e.into_inner());
        // Both ends held by this process: inside, whatever the address.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        {
            let me = [std::process::id() as i32];
            check_no_outside_tcp(&me, &socket_holders(&me))
        }
        .unwrap();
        // One end in another process: outside, even on loopback.
        drop(b);
        let l2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l2.local_addr().unwrap().port();
        let mut peer = std::process::Command::new("python3")
            .args(["-c", &format!("import socket,sys,time; s=socket.create_connection(('127.0.0.1',{port})); sys.stdout.write('c\\n'); sys.stdout.flush(); time.sleep(60)")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (_held, _) = l2.accept().unwrap();
        let mut ready = [0u8; 2];
        peer.stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut ready)
            .unwrap();
        let e = {
            let me = [std::process::id() as i32];
            check_no_outside_tcp(&me, &socket_holders(&me))
        }
        .unwrap_err()
        .to_string();
        let _ = peer.kill();
        let _ = peer.wait();
        assert!(e.contains("outside the captured tree"), "{e}");
        drop(a);
    }

    #[test]
    fn crius_char_devices() {
        assert!(crius_char_device(1, 3), "/dev/null");
        assert!(crius_char_device(136, 0), "a pts");
        assert!(crius_char_device(5, 2), "/dev/ptmx");
        assert!(crius_char_device(10, 200), "tun");
        assert!(!crius_char_device(10, 229), "fuse");
        assert!(!crius_char_device(195, 255), "nvidiactl");
        assert!(!crius_char_device(4, 64), "a serial port");
    }

    #[test]
    fn this_process_holds_only_dumpable_devices() {
        let _null = std::fs::File::open("/dev/null").unwrap();
        check_dumpable_devices(&[std::process::id() as i32], None).unwrap();
    }

    #[test]
    fn this_process_holds_no_io_uring() {
        check_no_io_uring(&[std::process::id() as i32]).unwrap();
    }
}
