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

/// Fails naming the process and peer of an established TCP connection whose
/// peer is not on loopback (a peer outside the captured tree).
pub fn check_no_outside_tcp(pids: &[i32]) -> Result<()> {
    for pid in pids {
        let inodes = socket_inodes(*pid);
        if inodes.is_empty() {
            continue;
        }
        for table in ["tcp", "tcp6"] {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 10 || f[3] != "01" {
                    continue; // not ESTABLISHED
                }
                let Ok(inode) = f[9].parse::<u64>() else {
                    continue;
                };
                if !inodes.contains(&inode) || is_loopback(f[2]) {
                    continue;
                }
                return Err(Error::FailedPrecondition(format!(
                    "capture: inventory: pid {pid} has an established TCP connection to {} outside the captured tree; close it before capture",
                    hex_addr(f[2])
                )));
            }
        }
    }
    Ok(())
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

/// `0100007F:1F90` (IPv4, little-endian words) or the 32-hex IPv6 form.
fn is_loopback(addr: &str) -> bool {
    let ip = addr.split(':').next().unwrap_or_default();
    match ip.len() {
        8 => ip.ends_with("7F"),
        32 => ip == "00000000000000000000000001000000" || ip.ends_with("0100007F"),
        _ => false,
    }
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
    fn loopback_peers_are_inside() {
        assert!(is_loopback("0100007F:1F90"));
        assert!(!is_loopback("0200000A:0050"));
        assert_eq!(hex_addr("0200000A:0050"), "10.0.0.2:80");
    }

    #[test]
    fn this_process_holds_no_io_uring() {
        check_no_io_uring(&[std::process::id() as i32]).unwrap();
    }
}
