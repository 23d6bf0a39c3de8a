//! What must not be in a tree about to be captured: io_uring instances
//! (CRIU cannot dump them) and established TCP connections to peers outside
//! the tree. Checked before CRIU runs, so the error names the process.

use std::path::Path;

use crate::error::{Error, Result};

/// Fails naming the first process of `pids` that holds an io_uring fd.
pub fn check_no_io_uring(pids: &[i32]) -> Result<()> {
    for pid in pids {
        let fd_dir = format!("/proc/{pid}/fd");
        let Ok(entries) = std::fs::read_dir(&fd_dir) else {
            continue; // exited meanwhile
        };
        for e in entries.flatten() {
            if let Ok(target) = std::fs::read_link(e.path()) {
                if target == Path::new("anon_inode:[io_uring]") {
                    return Err(Error::FailedPrecondition(format!(
                        "capture: inventory: pid {pid} holds an io_uring instance (fd {}); CRIU cannot dump io_uring: disable it in the engine (kernel.io_uring_disabled)",
                        e.file_name().to_string_lossy()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Fails naming the process and peer of an established TCP connection
/// whose other end is not a socket of the tree. A connection between two
/// processes of the tree (vLLM's rendezvous store connects the engine to
/// itself, on the host's address) is restored whole and is fine, whatever
/// its addresses; one to anything else cannot be restored.
pub fn check_no_outside_tcp(pids: &[i32]) -> Result<()> {
    // Every socket of the tree, with the process that holds it.
    let ours: Vec<(u64, i32)> = pids
        .iter()
        .flat_map(|p| socket_inodes(*p).into_iter().map(move |i| (i, *p)))
        .collect();
    let holder = |inode: u64| ours.iter().find(|(i, _)| *i == inode).map(|(_, p)| *p);
    if ours.is_empty() {
        return Ok(());
    }
    // The tables are per network namespace: read each once.
    let mut seen_netns: Vec<std::path::PathBuf> = Vec::new();
    for pid in pids {
        if let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) {
            if seen_netns.contains(&ns) {
                continue;
            }
            seen_netns.push(ns);
        }
        let entries = tcp_entries(*pid);
        for e in &entries {
            let Some(owner) = holder(e.inode) else {
                continue;
            };
            let inside = entries.iter().any(|peer| {
                peer.local == e.remote && peer.remote == e.local && holder(peer.inode).is_some()
            });
            if inside {
                continue;
            }
            return Err(Error::FailedPrecondition(format!(
                "capture: inventory: pid {owner} has an established TCP connection to {} outside the captured tree; close it before capture",
                hex_addr(&e.remote)
            )));
        }
    }
    Ok(())
}

/// One ESTABLISHED row of `/proc/PID/net/tcp{,6}` (addresses in the
/// kernel's hex form).
struct TcpEntry {
    local: String,
    remote: String,
    inode: u64,
}

/// The ESTABLISHED connections of the network namespace `pid` is in.
fn tcp_entries(pid: i32) -> Vec<TcpEntry> {
    let mut out = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "01" {
                continue; // not ESTABLISHED
            }
            if let Ok(inode) = f[9].parse::<u64>() {
                out.push(TcpEntry {
                    local: f[1].to_string(),
                    remote: f[2].to_string(),
                    inode,
                });
            }
        }
    }
    out
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
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue; // exited meanwhile
        };
        let mut fds: Vec<(String, std::path::PathBuf, u64)> = entries
            .flatten()
            .filter_map(|e| {
                let target = std::fs::read_link(e.path()).ok()?;
                let meta = std::fs::metadata(e.path()).ok()?;
                meta.file_type().is_char_device().then(|| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        target,
                        std::os::unix::fs::MetadataExt::rdev(&meta),
                    )
                })
            })
            .collect();
        fds.sort_by_key(|(fd, _, _)| fd.parse::<u64>().unwrap_or(u64::MAX));
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

fn socket_inodes(pid: i32) -> Vec<u64> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in entries.flatten() {
            if let Ok(t) = std::fs::read_link(e.path()) {
                let t = t.to_string_lossy();
                if let Some(n) = t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    if let Ok(n) = n.parse() {
                        out.push(n);
                    }
                }
            }
        }
    }
    out
}

fn hex_addr(addr: &str) -> String {
    let mut parts = addr.split(':');
    let (ip, port) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let port = u16::from_str_radix(port, 16).unwrap_or(0);
    if ip.len() == 8 {
        if let Ok(v) = u32::from_str_radix(ip, 16) {
            let b = v.to_le_bytes();
            return format!("{}.{}.{}.{}:{port}", b[0], b[1], b[2], b[3]);
        }
    }
    format!("[{ip}]:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_shown_as_written() {
        assert_eq!(hex_addr("0200000A:0050"), "10.0.0.2:80");
    }

    #[test]
    fn a_connection_between_two_sockets_of_the_tree_is_inside() {
        use std::io::Read;
        // Both ends held by this process: inside, whatever the address.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        check_no_outside_tcp(&[std::process::id() as i32]).unwrap();
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
        let e = check_no_outside_tcp(&[std::process::id() as i32])
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
