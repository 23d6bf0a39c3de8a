//! Scratch cgroups and children for the tests that need a real cgroup (root).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Fails the test, rather than skipping it, when not run as root.
pub(crate) fn require_root() {
    assert!(
        // SAFETY: geteuid only returns a value.
        unsafe { libc::geteuid() } == 0,
        "this test creates cgroups and must run as root"
    );
}

/// A fresh cgroup `vsnap-test-<pid>-<tag>` in the hierarchies of some
/// controllers (v1), or in the unified hierarchy (v2 only host); removed
/// on drop.
pub(crate) struct TestCgroup {
    /// (controller, directory); a v2 directory is listed once per controller.
    dirs: Vec<(String, PathBuf)>,
    pub(crate) v2: bool,
}

impl TestCgroup {
    pub(crate) fn create(controllers: &[&str], tag: &str) -> TestCgroup {
        let name = format!("vsnap-test-{}-{tag}", std::process::id());
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounts = super::procfs::parse_mountinfo(&mountinfo);
        let v1: Vec<_> = controllers
            .iter()
            .filter_map(|c| {
                let m = mounts
                    .iter()
                    .find(|m| !m.v2 && m.options.iter().any(|o| o == c))?;
                Some((c.to_string(), m.mount_point.join(&name)))
            })
            .collect();
        let cgroup = if !v1.is_empty() {
            TestCgroup {
                dirs: v1,
                v2: false,
            }
        } else {
            let m = mounts
                .iter()
                .find(|m| m.v2)
                .expect("no cgroup mount at all");
            let enable: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
            // Best effort: the controllers are usually enabled already.
            let _ = std::fs::write(
                m.mount_point.join("cgroup.subtree_control"),
                enable.join(" "),
            );
            let dir = m.mount_point.join(&name);
            let dirs = controllers
                .iter()
                .map(|c| (c.to_string(), dir.clone()))
                .collect();
            TestCgroup { dirs, v2: true }
        };
        for (_, dir) in &cgroup.dirs {
            if !dir.is_dir() {
                std::fs::create_dir(dir)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
            }
        }
        cgroup
    }

    /// The directory of `controller`'s cgroup.
    pub(crate) fn dir(&self, controller: &str) -> &Path {
        let (_, dir) = self.dirs.iter().find(|(c, _)| c == controller).unwrap();
        dir
    }

    /// Moves process `pid` into the cgroup, in every hierarchy.
    pub(crate) fn add(&self, pid: u32) {
        for (_, dir) in &self.dirs {
            let procs = dir.join("cgroup.procs");
            std::fs::write(&procs, pid.to_string())
                .unwrap_or_else(|e| panic!("writing {}: {e}", procs.display()));
        }
    }
}

impl Drop for TestCgroup {
    /// Kills what the tests left in the cgroup (orphans of a killed shell
    /// included) and removes it, retrying while the processes exit.
    fn drop(&mut self) {
        for (_, dir) in &self.dirs {
            let start = Instant::now();
            while dir.is_dir() {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs"));
                for pid in procs.unwrap_or_default().lines() {
                    if let Ok(pid) = pid.parse() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                match std::fs::remove_dir(dir) {
                    Err(e) if start.elapsed() > Duration::from_secs(10) => {
                        eprintln!("removing {}: {e}", dir.display());
                        break;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    Ok(()) => {}
                }
            }
        }
    }
}

/// A `sh -c script` child with piped stdin, killed and reaped on drop.
pub(crate) struct Shell(pub(crate) Child);

impl Shell {
    pub(crate) fn spawn(script: &str) -> Shell {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawning sh");
        Shell(child)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Writes a line to the script's stdin (what `read x` waits for).
    pub(crate) fn go(&mut self) {
        use std::io::Write;
        writeln!(self.0.stdin.as_mut().unwrap(), "go").unwrap();
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `cond` until it holds, failing with `what` after `timeout`.
pub(crate) fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
