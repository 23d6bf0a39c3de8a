//! Whether the OOM killer ended a restore: read from the container's memory
//! cgroup as the shim reads OOMs of running tasks (oom.rs), counted from
//! before `runc restore` ran.
//!
//! A restore runs out of memory at one of two moments. While vsnap's page
//! server places the memory, `runc restore` has returned and the cgroup is
//! there: its `oom_kill` count says it (v1 `memory.oom_control`, v2
//! `memory.events`). While CRIU restores (with its own placement, or what
//! it restores itself), runc removes the cgroup, and its counts with it,
//! before it returns its error. So:
//!
//! - cgroup v1: the memory cgroup is made here before runc runs (runc
//!   takes an existing one as it is) and an eventfd registered on its
//!   `memory.oom_control` (`cgroup.event_control`). The kernel signals it
//!   once per OOM and once more, last, when the cgroup is removed (every
//!   OOM comes before: a cgroup is removed only once no process is left to
//!   charge it). Found removed, the cgroup ran out of memory when the
//!   eventfd counted two signals or more. The removal's signal comes a
//!   little after the rmdir; it is waited for (bounded) only when the
//!   host's `oom_kill` count (/proc/vmstat) rose since the restore began.
//! - cgroup v2: counts go up the hierarchy, so the parent's `memory.events`
//!   still holds a removed child's `oom_kill`. The parent is shared with
//!   the container's siblings: a sibling's OOM kill during a restore that
//!   failed for another reason would be taken for the restore's.
//! - systemd's cgroup driver on v1: the cgroup is not made ahead (systemd
//!   makes its scope), so only an OOM while it is there is seen.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use crate::oom::{eventfd, parse_oom_kills, readable};
use crate::snapshot::criu::memory::{is_v2, memory_dir, OomSeen};

/// How long a restore whose cgroup was removed waits for the removal's
/// signal, when the host counted an OOM kill meanwhile.
const REMOVAL_SIGNAL: Duration = Duration::from_secs(2);

/// The container's memory cgroup watched from before `runc restore`.
pub struct RestoreOom {
    dir: PathBuf,
    /// The file with the cgroup's `oom_kill`.
    events: &'static str,
    kills_before: u64,
    host_kills_before: u64,
    /// v1: the eventfd on `memory.oom_control`.
    notifications: Option<AsyncFd<File>>,
    /// v2: the parent cgroup and its `oom_kill` before.
    parent: Option<(PathBuf, u64)>,
}

impl RestoreOom {
    /// Before `runc restore` of the container whose cgroup is `cgroup`
    /// (relative to a hierarchy's root). `may_make`: the cgroup may be made
    /// here ahead of runc (cgroupfs, not systemd's driver); the restore's
    /// undo removes it with runc's. Call it inside the runtime.
    pub fn before(id: &str, cgroup: &Path, may_make: bool) -> Self {
        let dir = memory_dir(cgroup);
        let v2 = is_v2();
        let events = if v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let notifications = match !v2 && may_make {
            true => register(&dir)
                .map_err(|e| {
                    log::warn!(
                        "{id}: restore: no OOM notifications from {}: {e}",
                        dir.display()
                    )
                })
                .ok(),
            false => None,
        };
        let parent = match v2 {
            true => dir
                .parent()
                .and_then(|p| Some((p.to_path_buf(), kills_in(&p.join(events))?))),
            false => None,
        };
        Self {
            kills_before: kills_in(&dir.join(events)).unwrap_or(0),
            host_kills_before: host_oom_kills(),
            dir,
            events,
            notifications,
            parent,
        }
    }

    /// After the restore failed, before its undo: whether the OOM killer
    /// ran in the container's memory cgroup meanwhile.
    pub async fn seen(self) -> Option<OomSeen> {
        // The eventfd first: a cgroup still there afterwards was not removed
        // yet, so nothing counted was its removal.
        let mut signals = self.notifications.as_ref().map_or(0, drain);
        let file = self.dir.join(self.events);
        if let Some(kills) = kills_in(&file) {
            return self.while_there(kills, signals, &file);
        }
        if host_oom_kills() <= self.host_kills_before {
            return None;
        }
        if let Some(fd) = &self.notifications {
            let deadline = Instant::now() + REMOVAL_SIGNAL;
            while signals < 2 && Instant::now() < deadline {
                signals += more_signals(fd, deadline).await;
            }
            return (signals >= 2).then(|| OomSeen {
                count: signals - 1,
                how: format!(
                    "the OOM killer ran {} in its memory cgroup {} (memory.oom_control's notifications, before runc removed the cgroup)",
                    times(signals - 1),
                    self.dir.display()
                ),
            });
        }
        let (parent, before) = self.parent.as_ref()?;
        let file = parent.join(self.events);
        let now = kills_in(&file)?;
        (now > *before).then(|| OomSeen {
            count: now - before,
            how: format!(
                "the OOM killer killed {} under {} (oom_kill {before} -> {now} in {}; the container's own cgroup, below it, was removed by runc)",
                processes(now - before),
                parent.display(),
                file.display()
            ),
        })
    }

    /// The cgroup is still there: its own count.
    fn while_there(&self, kills: u64, signals: u64, file: &Path) -> Option<OomSeen> {
        let before = self.kills_before;
        if kills > before {
            return Some(OomSeen {
                count: kills - before,
                how: format!(
                    "the OOM killer killed {} in its memory cgroup (oom_kill {before} -> {kills} in {})",
                    processes(kills - before),
                    file.display()
                ),
            });
        }
        (signals > 0).then(|| OomSeen {
            count: signals,
            how: format!(
                "its memory cgroup {} ran out of memory {} (memory.oom_control's notifications)",
                self.dir.display(),
                times(signals)
            ),
        })
    }
}

/// Makes the v1 memory cgroup `dir` if it is not there and registers an
/// eventfd for its OOMs.
fn register(dir: &Path) -> std::io::Result<AsyncFd<File>> {
    std::fs::create_dir_all(dir)?;
    let oom_control = File::open(dir.join("memory.oom_control"))?;
    let efd = eventfd()?;
    let registration = format!("{} {}", efd.as_raw_fd(), oom_control.as_raw_fd());
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))?
        .write_all(registration.as_bytes())?;
    readable(efd)
}

/// The `oom_kill` count in `file`; None when the cgroup is gone.
fn kills_in(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file)
        .ok()
        .map(|t| parse_oom_kills(&t))
}

/// The host's count of OOM kills (`oom_kill` in /proc/vmstat).
fn host_oom_kills() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .map(|t| parse_vmstat_oom_kills(&t))
        .unwrap_or(0)
}

fn parse_vmstat_oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
        .unwrap_or(0)
}

/// The eventfd's count, read without waiting (0 when nothing came).
fn drain(fd: &AsyncFd<File>) -> u64 {
    let mut buf = [0u8; 8];
    match fd.get_ref().read(&mut buf) {
        Ok(8) => u64::from_ne_bytes(buf),
        _ => 0,
    }
}

/// The count of signals that come before `deadline` (0 at the deadline,
/// or on a stale wakeup).
async fn more_signals(fd: &AsyncFd<File>, deadline: Instant) -> u64 {
    let Ok(Ok(mut guard)) = tokio::time::timeout_at(deadline.into(), fd.readable()).await else {
        return 0;
    };
    let mut buf = [0u8; 8];
    match guard.try_io(|f| f.get_ref().read(&mut buf)) {
        Ok(Ok(8)) => u64::from_ne_bytes(buf),
        _ => 0,
    }
}

fn processes(n: u64) -> String {
    match n {
        1 => "1 process".into(),
        n => format!("{n} processes"),
    }
}

fn times(n: u64) -> String {
    match n {
        1 => "once".into(),
        n => format!("{n} times"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup_stats::test_support::{require_root, Shell};

    #[test]
    fn the_host_s_oom_kills_are_read_from_vmstat() {
        let text = "nr_free_pages 10\noom_kill 6\npgfault 1\n";
        assert_eq!(parse_vmstat_oom_kills(text), 6);
        assert_eq!(parse_vmstat_oom_kills("oom_kill_x 3\n"), 0);
        assert_eq!(parse_vmstat_oom_kills(""), 0);
    }

    #[test]
    fn counts_are_worded_for_people() {
        assert_eq!(processes(1), "1 process");
        assert_eq!(processes(3), "3 processes");
        assert_eq!(times(1), "once");
        assert_eq!(times(2), "2 times");
    }

    /// A container's cgroup as runc would make it, relative to the
    /// hierarchy (on a v2 host below a parent of its own, whose counts the
    /// watch reads once the child is gone); removed on drop.
    struct Scratch {
        cgroup: PathBuf,
        dirs: Vec<PathBuf>,
    }

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let name = format!("/vsnap-test-{}-{tag}", std::process::id());
            if !is_v2() {
                let cgroup = PathBuf::from(name);
                return Scratch {
                    dirs: vec![memory_dir(&cgroup)],
                    cgroup,
                };
            }
            let parent = memory_dir(Path::new(&name));
            std::fs::create_dir_all(&parent).unwrap();
            // Best effort at the root: memory is usually enabled there.
            let _ = std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
            std::fs::write(parent.join("cgroup.subtree_control"), "+memory").unwrap();
            let cgroup = PathBuf::from(format!("{name}/restore"));
            Scratch {
                dirs: vec![memory_dir(&cgroup), parent],
                cgroup,
            }
        }

        /// The container's memory cgroup, made where the watch did not.
        fn dir(&self) -> PathBuf {
            std::fs::create_dir_all(&self.dirs[0]).unwrap();
            self.dirs[0].clone()
        }

        /// Removes the container's cgroup as runc does after a failed
        /// restore: its processes gone first.
        fn remove_container(&self) {
            let start = Instant::now();
            while let Err(e) = std::fs::remove_dir(&self.dirs[0]) {
                assert!(start.elapsed() < Duration::from_secs(30), "rmdir: {e}");
                let procs = std::fs::read_to_string(self.dirs[0].join("cgroup.procs"));
                for pid in procs.unwrap_or_default().lines() {
                    if let Ok(pid) = pid.parse() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            for dir in &self.dirs {
                if dir.is_dir() {
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
    }

    /// Limits `dir` to 16 MiB without swap and runs a shell in it that
    /// allocates 64 MB; returns once the OOM killer ended it.
    fn oom_in(dir: &Path) {
        let limits: &[(&str, &str)] = if is_v2() {
            &[("memory.max", "16777216"), ("memory.swap.max", "0")]
        } else {
            &[
                ("memory.limit_in_bytes", "16777216"),
                ("memory.memsw.limit_in_bytes", "16777216"),
            ]
        };
        for (file, value) in limits {
            if dir.join(file).exists() {
                std::fs::write(dir.join(file), value).unwrap();
            }
        }
        let mut shell =
            Shell::spawn("read x; x=$(head -c 64000000 /dev/zero | tr '\\0' a); echo ${#x}");
        std::fs::write(dir.join("cgroup.procs"), shell.pid().to_string()).unwrap();
        shell.go();
        let status = shell.0.wait().unwrap();
        assert!(
            !status.success(),
            "the allocating shell was not killed: {status}"
        );
    }

    #[tokio::test]
    async fn an_oom_is_seen_after_the_cgroup_was_removed() {
        require_root();
        let scratch = Scratch::new("room-gone");
        let watch = RestoreOom::before("t", &scratch.cgroup, true);
        oom_in(&scratch.dir());
        scratch.remove_container();
        let seen = watch.seen().await.expect("the OOM is seen");
        assert!(seen.count >= 1, "{seen:?}");
        assert!(seen.how.contains("OOM killer"), "{seen:?}");
    }

    #[tokio::test]
    async fn an_oom_is_counted_in_a_cgroup_still_there() {
        require_root();
        let scratch = Scratch::new("room-there");
        let watch = RestoreOom::before("t", &scratch.cgroup, true);
        let dir = scratch.dir();
        oom_in(&dir);
        let seen = watch.seen().await.expect("the OOM is seen");
        assert!(seen.count >= 1, "{seen:?}");
        assert!(seen.how.contains("oom_kill 0 -> "), "{seen:?}");
        scratch.remove_container();
    }

    #[tokio::test]
    async fn a_cgroup_removed_without_an_oom_is_no_oom() {
        require_root();
        let scratch = Scratch::new("room-none");
        let watch = RestoreOom::before("t", &scratch.cgroup, true);
        let mut shell = Shell::spawn("read x");
        std::fs::write(scratch.dir().join("cgroup.procs"), shell.pid().to_string()).unwrap();
        shell.go();
        shell.0.wait().unwrap();
        scratch.remove_container();
        assert_eq!(watch.seen().await, None);
    }
}
