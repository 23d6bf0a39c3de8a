//! The descriptors a process holds, read from `/proc/<pid>/fd`: the one
//! reader of the shim's capture checks (io_uring, devices, sockets,
//! watches, GPU holders, volume files), the OCI hook's io_uring check and
//! the tests.

use std::path::{Path, PathBuf};

/// One open descriptor: its number, what its link names and the link's
/// path (`/proc/<pid>/fd/<n>`, to stat what it points at).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFd {
    pub fd: u64,
    pub target: PathBuf,
    pub path: PathBuf,
}

/// The descriptors `pid` holds, in fd order; none when it is gone (it
/// exited meanwhile) or a link vanished while read.
pub fn open_fds(pid: i32) -> Vec<OpenFd> {
    open_fds_under(Path::new("/proc"), pid)
}

/// [`open_fds`] under another mount of proc (or a fake one, in tests).
pub fn open_fds_under(proc_root: &Path, pid: i32) -> Vec<OpenFd> {
    let Ok(entries) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<OpenFd> = entries
        .flatten()
        .filter_map(|e| {
            Some(OpenFd {
                fd: e.file_name().to_str()?.parse().ok()?,
                target: std::fs::read_link(e.path()).ok()?,
                path: e.path(),
            })
        })
        .collect();
    fds.sort_by_key(|f| f.fd);
    fds
}

#[cfg(test)]
mod tests {
    #[test]
    fn our_own_descriptors_are_listed_in_order() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f) as u64;
        let fds = super::open_fds(std::process::id() as i32);
        assert!(fds.windows(2).all(|w| w[0].fd < w[1].fd));
        let ours = fds.iter().find(|o| o.fd == fd).expect("the file's fd");
        assert!(ours.target.ends_with("stat"), "{:?}", ours.target);
        assert!(super::open_fds(i32::MAX).is_empty(), "no such process");
    }

    #[test]
    fn a_fake_proc_is_read_in_fd_order_and_odd_names_skipped() {
        let proc = tempfile::tempdir().unwrap();
        let dir = proc.path().join("7/fd");
        std::fs::create_dir_all(&dir).unwrap();
        for (fd, target) in [("10", "/b"), ("2", "/a"), ("x", "/c")] {
            std::os::unix::fs::symlink(target, dir.join(fd)).unwrap();
        }
        let fds = super::open_fds_under(proc.path(), 7);
        let got: Vec<_> = fds.iter().map(|f| (f.fd, f.target.clone())).collect();
        assert_eq!(got, [(2, "/a".into()), (10, "/b".into())]);
        assert_eq!(fds[0].path, dir.join("2"));
    }
}
