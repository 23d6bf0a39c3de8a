//! `io-uring`: CRIU cannot checkpoint or restore io_uring instances, and
//! io_uring has been a steady source of kernel privilege escalations, so a
//! snapshot container must not be able to create one:
//! `kernel.io_uring_disabled` must be 2 (off for everyone) when the container
//! runs as root or holds CAP_SYS_ADMIN (which the kernel lets through at 1),
//! and at least 1 otherwise, unless one of its groups is
//! `kernel.io_uring_group` (allowed at 1). With `--pids-of-state` the
//! container's processes (the state's pid and its descendants) are also
//! searched for io_uring file descriptors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{read_spec, Failure, Flags, StateSource};

pub const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";
pub const GROUP_SYSCTL: &str = "/proc/sys/kernel/io_uring_group";
pub const VALUE_FLAGS: &[&str] = &["--sysctl", "--group-sysctl", "--uid", "--bundle", "--state"];
pub const BOOL_FLAGS: &[&str] = &["--root-user", "--pids-of-state"];

/// Who the container runs as, as far as io_uring is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    /// gid and additionalGids (empty when given by flag).
    pub gids: Vec<u32>,
    /// CAP_SYS_ADMIN in the effective, permitted or ambient set.
    pub sys_admin: bool,
    /// How the user was learnt, for the message.
    pub source: String,
}

impl User {
    fn privileged(&self) -> bool {
        self.uid == 0 || self.sys_admin
    }

    fn describe(&self) -> String {
        match (self.uid, self.sys_admin) {
            (0, _) => format!("runs as root (uid 0, {})", self.source),
            (uid, true) => format!("has CAP_SYS_ADMIN (uid {uid}, {})", self.source),
            (uid, false) => format!("runs as uid {uid} ({})", self.source),
        }
    }
}

/// The user from an OCI spec: `process.user` and `process.capabilities`
/// (an absent uid is root, as the runtime treats it).
pub fn spec_user(spec: &Value, origin: &str) -> User {
    let user = &spec["process"]["user"];
    let uid = user["uid"].as_u64().unwrap_or(0) as u32;
    let mut gids: Vec<u32> = user["gid"].as_u64().map(|g| g as u32).into_iter().collect();
    gids.extend(
        user["additionalGids"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_u64().map(|g| g as u32)),
    );
    let caps = &spec["process"]["capabilities"];
    let sys_admin = ["effective", "permitted", "ambient"].iter().any(|set| {
        caps[*set]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c.as_str() == Some("CAP_SYS_ADMIN"))
    });
    User {
        uid,
        gids,
        sys_admin,
        source: format!("process.user of {origin}"),
    }
}

/// Reads a sysctl holding one integer; `None` when the file does not exist.
pub fn read_sysctl(path: &Path) -> Result<Option<i64>, Failure> {
    match std::fs::read_to_string(path) {
        Ok(s) => s.trim().parse().map(Some).map_err(|_| {
            Failure::Input(format!(
                "{}: {:?} is not an integer",
                path.display(),
                s.trim()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Failure::Input(format!("read {}: {e}", path.display()))),
    }
}

/// The sysctl rule. `disabled`: the value of `kernel.io_uring_disabled`
/// (None: the kernel has no such sysctl); `group`: `kernel.io_uring_group`.
pub fn check_sysctl(
    disabled: Option<i64>,
    path: &Path,
    group: i64,
    group_path: &Path,
    user: &User,
) -> Result<(), Failure> {
    let Some(disabled) = disabled else {
        return Err(Failure::Check(format!(
            "{} does not exist: this kernel cannot disable io_uring (kernel.io_uring_disabled needs Linux 6.6 or newer)",
            path.display()
        )));
    };
    let needed = if user.privileged() { 2 } else { 1 };
    if disabled < needed {
        let at_least = if needed == 2 { "" } else { "at least " };
        return Err(Failure::Check(format!(
            "kernel.io_uring_disabled is {disabled} ({}); the container {}, which needs {at_least}{needed}",
            path.display(),
            user.describe()
        )));
    }
    if disabled == 1 && group >= 0 && user.gids.contains(&(group as u32)) {
        return Err(Failure::Check(format!(
            "kernel.io_uring_disabled is 1 ({}) and the container's group {group} is kernel.io_uring_group ({}), which may still use io_uring; set kernel.io_uring_disabled to 2",
            path.display(),
            group_path.display()
        )));
    }
    Ok(())
}

/// `pid` and its descendants (through `/proc/PID/task/*/children`).
pub fn process_tree(proc: &Path, pid: i32) -> Vec<i32> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![pid];
    let mut out = Vec::new();
    while let Some(p) = todo.pop() {
        if !seen.insert(p) {
            continue;
        }
        out.push(p);
        let Ok(tasks) = std::fs::read_dir(proc.join(p.to_string()).join("task")) else {
            continue; // exited meanwhile
        };
        for t in tasks.flatten() {
            if let Ok(children) = std::fs::read_to_string(t.path().join("children")) {
                todo.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
    out
}

/// Fails naming the first process of `pids` holding an io_uring fd.
pub fn check_no_io_uring_fds(proc: &Path, pids: &[i32]) -> Result<(), Failure> {
    for &pid in pids {
        let fds = vsnap_host::fds::open_fds_under(proc, pid);
        if let Some(fd) = fds
            .iter()
            .find(|f| f.target == Path::new("anon_inode:[io_uring]"))
        {
            let comm = proc.join(pid.to_string()).join("comm");
            let comm = std::fs::read_to_string(comm).unwrap_or_default();
            return Err(Failure::Check(format!(
                "pid {pid} ({}) holds an io_uring instance (fd {}); CRIU cannot checkpoint or restore io_uring",
                comm.trim(),
                fd.fd
            )));
        }
    }
    Ok(())
}

pub fn run(flags: &Flags, state: &mut StateSource) -> Result<(), Failure> {
    let sysctl = flags
        .path("--sysctl")
        .unwrap_or_else(|| PathBuf::from(SYSCTL));
    let group_sysctl = flags
        .path("--group-sysctl")
        .unwrap_or_else(|| PathBuf::from(GROUP_SYSCTL));
    let user = match (flags.has("--root-user"), flags.value("--uid")) {
        (true, Some(_)) => {
            return Err(Failure::Usage(
                "--root-user and --uid exclude each other".into(),
            ))
        }
        (true, None) => User {
            uid: 0,
            gids: Vec::new(),
            sys_admin: false,
            source: "--root-user".into(),
        },
        (false, Some(uid)) => User {
            uid: uid
                .parse()
                .map_err(|_| Failure::Usage(format!("--uid {uid:?}: not a uid")))?,
            gids: Vec::new(),
            sys_admin: false,
            source: "--uid".into(),
        },
        (false, None) => {
            let bundle = state.bundle(flags.path("--bundle").as_deref())?;
            let spec = read_spec(&bundle)?;
            spec_user(&spec, &bundle.join("config.json").display().to_string())
        }
    };
    let group = read_sysctl(&group_sysctl)?.unwrap_or(-1);
    check_sysctl(read_sysctl(&sysctl)?, &sysctl, group, &group_sysctl, &user)?;
    if flags.has("--pids-of-state") {
        let state = state.get()?;
        let pid = state.pid.filter(|p| *p > 0).ok_or_else(|| {
            Failure::Input(format!(
                "the state of container {} has no pid (--pids-of-state)",
                state.id
            ))
        })?;
        let proc = Path::new("/proc");
        check_no_io_uring_fds(proc, &process_tree(proc, pid))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(uid: u32, gids: &[u32], sys_admin: bool) -> User {
        User {
            uid,
            gids: gids.to_vec(),
            sys_admin,
            source: "test".into(),
        }
    }

    fn check(disabled: Option<i64>, group: i64, u: &User) -> Result<(), Failure> {
        check_sysctl(
            disabled,
            Path::new("/s/io_uring_disabled"),
            group,
            Path::new("/s/io_uring_group"),
            u,
        )
    }

    #[test]
    fn root_needs_2_and_everyone_else_at_least_1() {
        let root = user(0, &[0], false);
        let e = check(Some(1), -1, &root).unwrap_err();
        assert_eq!(
            e.message(),
            "kernel.io_uring_disabled is 1 (/s/io_uring_disabled); the container runs as root (uid 0, test), which needs 2"
        );
        check(Some(2), -1, &root).unwrap();
        let admin = user(1000, &[], true);
        assert!(check(Some(1), -1, &admin)
            .unwrap_err()
            .message()
            .contains("has CAP_SYS_ADMIN (uid 1000"));
        let plain = user(1000, &[1000], false);
        let e = check(Some(0), -1, &plain).unwrap_err();
        assert!(
            e.message()
                .contains("runs as uid 1000 (test), which needs at least 1"),
            "{e:?}"
        );
        check(Some(1), -1, &plain).unwrap();
        check(Some(2), -1, &plain).unwrap();
    }

    #[test]
    fn the_io_uring_group_at_1_and_a_kernel_without_the_sysctl_fail() {
        let e = check(Some(1), 44, &user(1000, &[1000, 44], false)).unwrap_err();
        assert!(
            e.message().contains("group 44 is kernel.io_uring_group"),
            "{e:?}"
        );
        check(Some(2), 44, &user(1000, &[44], false)).unwrap();
        let e = check(None, -1, &user(1000, &[], false)).unwrap_err();
        assert!(e.message().contains("does not exist"), "{e:?}");
    }

    #[test]
    fn the_user_comes_from_the_spec() {
        let spec = json!({"process": {"user": {"uid": 1000, "gid": 100, "additionalGids": [44]},
            "capabilities": {"bounding": ["CAP_SYS_ADMIN"], "effective": ["CAP_NET_RAW"]}}});
        let u = spec_user(&spec, "b/config.json");
        assert_eq!(
            (u.uid, u.gids.clone(), u.sys_admin),
            (1000, vec![100, 44], false)
        );
        let spec = json!({"process": {"user": {"uid": 5}, "capabilities": {"ambient": ["CAP_SYS_ADMIN"]}}});
        assert!(spec_user(&spec, "x").sys_admin);
        assert_eq!(
            spec_user(&json!({"process": {}}), "x").uid,
            0,
            "no user is root"
        );
    }

    #[test]
    fn sysctl_values_are_read_strictly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        assert_eq!(read_sysctl(&p).unwrap(), None);
        std::fs::write(&p, "2\n").unwrap();
        assert_eq!(read_sysctl(&p).unwrap(), Some(2));
        std::fs::write(&p, "two\n").unwrap();
        assert_eq!(read_sysctl(&p).unwrap_err().code(), crate::EXIT_INPUT);
    }

    #[test]
    fn an_io_uring_fd_in_the_tree_is_found_naming_the_pid() {
        // A child that sleeps; the test process itself holds the ring, and
        // is the tree's root.
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let tree = process_tree(Path::new("/proc"), me);
        assert!(tree.contains(&(child.id() as i32)), "{tree:?}");
        let proc = Path::new("/proc");
        // Only this process (and its threads' children) is searched, so
        // rings elsewhere on the host do not matter.
        let before = check_no_io_uring_fds(proc, &[child.id() as i32]);
        assert!(before.is_ok(), "{before:?}");
        let mut params = [0u8; 120]; // struct io_uring_params
                                     // SAFETY: io_uring_setup(2) with a zeroed params struct of its size.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
        if fd >= 0 {
            let e = check_no_io_uring_fds(proc, &[me]).unwrap_err();
            assert!(e.message().starts_with(&format!("pid {me} (")), "{e:?}");
            assert!(e.message().contains(&format!("(fd {fd})")), "{e:?}");
            // SAFETY: closing the fd this test just opened.
            unsafe { libc::close(fd as i32) };
        } else {
            eprintln!("io_uring_setup is refused on this host: only the tree walk was tested");
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
