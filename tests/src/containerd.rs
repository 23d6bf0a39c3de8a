//! A private containerd instance for one test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cmd::{run, wait_deadline, CmdOutput};
use crate::lib_sh::{self, Plugins};

/// Where `scripts/setup.sh` installs containerd and ctr.
pub const CONTAINERD_BIN: &str = "/opt/vsnap/containerd/bin";
pub const NAMESPACE: &str = "default";
pub const SHIM_NAME: &str = "containerd-shim-vsnap-v1";

static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// The instances this process runs: folder and containerd's pid. A build
/// that aborts on panic (the release benchmarks: the workspace's release
/// profile has `panic = "abort"`) runs no `Drop`, so its panic hook tears
/// these down instead (`tear_down_on_abort`).
static RUNNING: Mutex<Vec<(PathBuf, u32)>> = Mutex::new(Vec::new());

fn running() -> std::sync::MutexGuard<'static, Vec<(PathBuf, u32)>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a panic aborts the process, a hook (installed once) that stops
/// every instance still running, as their `Drop` would: containerd by its
/// pid (when it is still the containerd of that folder), then the
/// containers through runc, the shims, the mounts and the folder.
fn tear_down_on_abort() {
    if !cfg!(panic = "abort") {
        return;
    }
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let instances = std::mem::take(&mut *running());
            for (dir, pid) in instances {
                stop_containerd(&dir, pid);
                drop(Containerd {
                    dir,
                    child: None,
                    clock_offset: None,
                });
            }
        }));
    });
}

/// SIGTERM to `pid` if it is the containerd of `dir` (its command line
/// names `dir`'s config), SIGKILL after 10 s; then reaped.
fn stop_containerd(dir: &Path, pid: u32) {
    let config = dir.join("config.toml").display().to_string();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains(&config) {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(pid, None);
                return;
            }
            _ => return,
        }
    }
}

pub struct Containerd {
    pub dir: PathBuf,
    child: Option<Child>,
    /// Seconds this instance's CLOCK_MONOTONIC and CLOCK_BOOTTIME run ahead
    /// of the host's: it runs in a time namespace of its own, which its
    /// shims, runc and CRIU inherit. None: the host's time namespace.
    clock_offset: Option<i64>,
}

/// The shim binary the tests run: `VSNAP_SHIM_BIN`, or the workspace build.
pub fn shim_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("VSNAP_SHIM_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let bin = target.join("debug").join(SHIM_NAME);
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// A fresh folder for a test, under /tmp so socket paths stay short.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(format!("/tmp/vsnap-test-{}-{n}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The instance number [`scratch_dir`] put in `dir`'s name.
pub fn instance_number(dir: &Path) -> u32 {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    name.split('-')
        .nth(3)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Containerd {
    /// An instance with the CRI plugin off.
    pub fn start(tag: &str) -> Self {
        Self::start_full(tag, Plugins::NoCri, |_| String::new(), None)
    }

    /// An instance with the CRI plugin on, whose config is the common part
    /// (root, state, socket, debug log) plus the tables `tables` writes for
    /// the instance's folder; `tables` runs before containerd starts, so it
    /// can also put files there.
    pub fn start_with_cri(tag: &str, tables: impl FnOnce(&Path) -> String) -> Self {
        Self::start_full(tag, Plugins::Cri, tables, None)
    }

    /// An instance with the CRI plugin off whose clocks (CLOCK_MONOTONIC,
    /// CLOCK_BOOTTIME) read `offset_s` more than the host's, as on a host
    /// that has been up that much longer. [`Containerd::restart_on_host_clocks`]
    /// starts it again in the host's time namespace.
    pub fn start_with_clock_offset(tag: &str, offset_s: i64) -> Self {
        Self::start_full(tag, Plugins::NoCri, |_| String::new(), Some(offset_s))
    }

    /// The common part of the config is `scripts/lib.sh`'s
    /// (`vsnap_containerd_config DIR debug [cri]`), the one the benchmarks,
    /// the demo and the tour run; `tables` follow it.
    fn start_full(
        tag: &str,
        plugins: Plugins,
        tables: impl FnOnce(&Path) -> String,
        clock_offset: Option<i64>,
    ) -> Self {
        let dir = scratch_dir(tag);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::os::unix::fs::symlink(shim_binary(), dir.join("bin").join(SHIM_NAME)).unwrap();
        let mut config = lib_sh::containerd_config(&dir, Some("debug"), plugins);
        config.push_str(&tables(&dir));
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let mut c = Containerd {
            dir,
            child: None,
            clock_offset,
        };
        c.spawn();
        assert!(
            c.dir.join("root").is_dir() && c.dir.join("state").is_dir(),
            "containerd must use the instance's own root and state: {}",
            c.dir.join("config.toml").display()
        );
        c
    }

    fn spawn(&mut self) {
        let path = format!(
            "{}:{CONTAINERD_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.dir.join("bin").display()
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .unwrap();
        let mut command = Command::new(format!("{CONTAINERD_BIN}/containerd"));
        if let Some(offset) = self.clock_offset {
            in_time_namespace(&mut command, offset);
        }
        let child = command
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .env_clear()
            .env("PATH", path)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd (run scripts/setup.sh)");
        tear_down_on_abort();
        {
            let mut running = running();
            running.retain(|(dir, _)| dir != &self.dir);
            running.push((self.dir.clone(), child.id()));
        }
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.ctr(&["version"]).ok() {
            assert!(
                Instant::now() < deadline,
                "containerd did not come up: {}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("state/containerd.sock")
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// Stops containerd abruptly (SIGKILL), leaving its shims running.
    pub fn crash(&mut self) {
        running().retain(|(dir, _)| dir != &self.dir);
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts containerd again on the same root and state.
    pub fn restart(&mut self) {
        self.crash();
        self.spawn();
    }

    /// Starts containerd again on the same root and state, in the host's
    /// time namespace: as the same artifacts seen from a host whose clocks
    /// are behind the ones they were captured under (one that booted later).
    pub fn restart_on_host_clocks(&mut self) {
        self.crash();
        self.clock_offset = None;
        self.spawn();
    }

    pub fn ctr_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(format!("{CONTAINERD_BIN}/ctr"));
        cmd.arg("--address").arg(self.socket()).args(args);
        cmd
    }

    pub fn ctr(&self, args: &[&str]) -> CmdOutput {
        self.ctr_in(args, None)
    }

    pub fn ctr_in(&self, args: &[&str], input: Option<&[u8]>) -> CmdOutput {
        run(self.ctr_command(args), input, Duration::from_secs(60))
    }

    /// `ctr`, which must succeed.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.ok(),
            "ctr {args:?} failed ({:?}): {}{}",
            out.code,
            out.stdout,
            out.stderr
        );
        out.stdout
    }

    /// The host pid of task `id`'s init in containerd's `namespace`.
    pub fn task_pid(&self, namespace: &str, id: &str) -> i32 {
        self.ctr_ok(&["-n", namespace, "task", "ls"])
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.first() == Some(&id)).then(|| f[1].parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no task {id} in namespace {namespace}"))
    }

    /// `ctr run -d` of `/bin/sleep 1000` in `rootfs` as `id`, under vsnap.
    pub fn start_sleeper(&self, rootfs: &str, id: &str) {
        crate::ids::claim(id);
        self.ctr_ok(&[
            "run",
            "-d",
            "--runtime",
            "io.vsnap.v1",
            "--rootfs",
            rootfs,
            id,
            "/bin/sleep",
            "1000",
        ]);
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// runc's state root for this instance (as the shim derives it).
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("state/vsnap-runc").join(NAMESPACE)
    }

    /// The cgroups (cgroupfs, v1 or v2) of container `id` that exist.
    pub fn cgroups(&self, id: &str) -> Vec<String> {
        let relative = format!("{NAMESPACE}/{id}");
        let base = Path::new("/sys/fs/cgroup");
        let mut dirs = vec![base.join(&relative)];
        for h in list(base) {
            dirs.push(base.join(h).join(&relative));
        }
        dirs.into_iter()
            .filter(|d| d.is_dir())
            .map(|d| d.display().to_string())
            .collect()
    }

    /// Pids of vsnap shims serving this containerd.
    pub fn shim_pids(&self) -> Vec<i32> {
        let socket = self.socket().display().to_string();
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.first().is_some_and(|a| a.ends_with(SHIM_NAME)) && args.contains(&socket) {
                pids.push(pid);
            }
        }
        pids
    }

    /// The socket of the shim serving `grouping` (a container id, or a
    /// pod's sandbox id) in this instance, as the shim names it:
    /// `/run/containerd/s/<sha256("<containerd socket>/<ns>/<grouping>")>`.
    pub fn shim_socket(&self, grouping: &str) -> PathBuf {
        use sha2::{Digest, Sha256};
        let key = format!("{}/{NAMESPACE}/{grouping}", self.socket().display());
        let hex: String = Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        PathBuf::from("/run/containerd/s").join(hex)
    }

    /// Containers runc still knows in this instance's root.
    pub fn runc_containers(&self) -> Vec<String> {
        runc_list(&self.runc_root())
    }

    /// Task bundles containerd still has.
    pub fn bundles(&self) -> Vec<String> {
        self.bundles_in(NAMESPACE)
    }

    /// Task bundles containerd still has in `namespace`.
    pub fn bundles_in(&self, namespace: &str) -> Vec<String> {
        list(&self.bundle_in(namespace, ""))
    }

    /// The bundle of task `id` of `namespace` in containerd's state folder.
    pub fn bundle_in(&self, namespace: &str, id: &str) -> PathBuf {
        self.dir
            .join("state/io.containerd.runtime.v2.task")
            .join(namespace)
            .join(id)
    }

    /// The bundles in `namespace` once containerd's removal of them ended,
    /// or at `timeout` what is still there. After a shim died containerd
    /// removes its bundle (renamed to `.<id>`, then deleted) only after the
    /// shim binary's `delete` exited, so an empty process list does not yet
    /// mean an empty bundle folder.
    pub fn bundles_left_in(&self, namespace: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = self.bundles_in(namespace);
            if left.is_empty() || Instant::now() >= deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Mount points under this instance's folder.
    pub fn mounts(&self) -> Vec<String> {
        let prefix = self.dir.display().to_string();
        mount_points()
            .into_iter()
            .filter(|m| m.starts_with(&prefix))
            .collect()
    }

    pub fn open_fds(&self) -> usize {
        vsnap_host::fds::open_fds(self.pid()).len()
    }

    /// Whether `ctr task ls` lists one of `ids` still running or paused.
    fn any_running(&self, ids: &[String]) -> bool {
        self.ctr(&["task", "ls"]).stdout.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first().is_some_and(|id| ids.iter().any(|i| i == id))
                && f.last()
                    .is_some_and(|s| ["RUNNING", "PAUSED", "PAUSING"].contains(s))
        })
    }

    /// Kills and deletes whatever a test left, through ctr and runc, by id.
    fn clean_up(&self) {
        if self.child.is_some() {
            let killed = self.runc_containers();
            for id in &killed {
                let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
            }
            // Until the kills have landed (at most 10 s: a teardown
            // does not panic), then whatever is left is deleted forcibly.
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.any_running(&killed) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let tasks = self.ctr(&["task", "ls", "-q"]).stdout;
            for id in tasks.lines() {
                let _ = self.ctr(&["task", "delete", "-f", id]);
            }
            let containers = self.ctr(&["c", "ls", "-q"]).stdout;
            for id in containers.lines() {
                let _ = self.ctr(&["c", "rm", id]);
            }
        }
        for id in self.runc_containers() {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(self.runc_root())
                .args(["delete", "--force", &id])
                .status();
        }
    }
}

/// Makes `command` run in a new time namespace whose CLOCK_MONOTONIC and
/// CLOCK_BOOTTIME are `offset_s` ahead of the caller's (as `unshare --time
/// --monotonic N --boottime N`, without a process in between): the child
/// unshares, sets the offsets before any process is in the namespace, and
/// enters it before it execs.
fn in_time_namespace(command: &mut Command, offset_s: i64) {
    use std::os::unix::process::CommandExt;
    let offsets = format!(
        "{} {offset_s} 0\n{} {offset_s} 0\n",
        libc::CLOCK_MONOTONIC,
        libc::CLOCK_BOOTTIME
    );
    let offsets_file = c"/proc/self/timens_offsets";
    let for_children = c"/proc/self/ns/time_for_children";
    // SAFETY: between fork and exec only system calls, on memory prepared
    // before the fork.
    unsafe {
        command.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWTIME) != 0 {
                return fail();
            }
            let fd = libc::open(offsets_file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return fail();
            }
            let written = libc::write(fd, offsets.as_ptr().cast(), offsets.len());
            libc::close(fd);
            if written != offsets.len() as isize {
                return fail();
            }
            let ns = libc::open(for_children.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if ns < 0 {
                return fail();
            }
            let entered = libc::setns(ns, libc::CLONE_NEWTIME);
            libc::close(ns);
            if entered != 0 {
                return fail();
            }
            Ok(())
        });
    }
}

/// Containers runc knows under the state root `root`.
pub fn runc_list(root: &Path) -> Vec<String> {
    let out = run(
        {
            let mut c = Command::new("runc");
            c.arg("--root").arg(root).args(["list", "-q"]);
            c
        },
        None,
        Duration::from_secs(10),
    );
    out.stdout.lines().map(str::to_string).collect()
}

/// Every mount point of this mount namespace (unescaped).
pub fn mount_points() -> Vec<String> {
    vsnap_host::mountinfo::own()
        .unwrap()
        .into_iter()
        .map(|r| r.mount_point.display().to_string())
        .collect()
}

/// Whether something is mounted at `path`.
pub fn is_mounted(path: &Path) -> bool {
    let p = path.display().to_string();
    mount_points().contains(&p)
}

pub fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Containerd {
    fn drop(&mut self) {
        running().retain(|(dir, _)| dir != &self.dir);
        self.clean_up();
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if wait_deadline(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
            }
        }
        for pid in self.shim_pids() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let mut mounts = self.mounts();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        if !std::thread::panicking() || std::env::var_os("VSNAP_KEEP_FAILED").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
