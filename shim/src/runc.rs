//! The runc CLI, driven the way containerd's runc shim drives it.
//!
//! Every invocation is spawned under an exit [`Mark`] and awaited through
//! [`Exits`], never with `waitpid` on the child, because the shim's reaper owns
//! all exit statuses. Failures carry runc's own last error line from its JSON
//! log, which says far more than an exit code.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::exits::Exits;
use crate::inflight::InFlight;
use crate::mounts;

static INVOCATION: AtomicU64 = AtomicU64::new(0);

/// The descriptors a container process gets as its stdio when runc passes
/// its own through (no terminal).
pub struct ChildStdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

#[derive(Clone)]
pub struct Runc {
    pub binary: PathBuf,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
    /// Where runc's per-invocation JSON logs go (the bundle).
    pub log_dir: PathBuf,
    pub exits: Exits,
    /// The configured CRIU tools, given to `runc checkpoint` and `restore`.
    pub criu: CriuTools,
}

/// The tools runc and CRIU run during a checkpoint or restore, as the
/// runtime config names them. runc 1.1 takes CRIU as `--criu`; runc 1.2 and
/// later run `criu` from PATH (1.2-1.3 ignore `--criu`, later ones refuse
/// it); CRIU's CUDA plugin runs `cuda-checkpoint` from CRIU's PATH, which it
/// inherits from runc. So: `--criu` where runc takes it, and the folders of
/// an absolute CRIU and cuda-checkpoint first on the PATH of both.
#[derive(Clone, Debug, Default)]
pub struct CriuTools {
    pub criu: PathBuf,
    pub path_first: Vec<PathBuf>,
    /// Whether this runc takes `--criu` (probed once, on first use).
    takes_flag: Arc<tokio::sync::OnceCell<bool>>,
}

impl CriuTools {
    pub fn new(criu: &Path, cuda_checkpoint: &Path) -> Self {
        let mut path_first: Vec<PathBuf> = Vec::new();
        for tool in [cuda_checkpoint, criu] {
            if let Some(dir) = tool.is_absolute().then(|| tool.parent()).flatten() {
                if !path_first.iter().any(|d| d == dir) {
                    path_first.push(dir.to_path_buf());
                }
            }
        }
        Self {
            criu: criu.to_path_buf(),
            path_first,
            takes_flag: Arc::default(),
        }
    }

    /// `PATH` for runc and CRIU: the tools' folders, then `inherited`.
    pub fn path_env(&self, inherited: Option<OsString>) -> Option<OsString> {
        if self.path_first.is_empty() {
            return inherited;
        }
        let inherited = inherited.unwrap_or_else(|| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        });
        let dirs = self
            .path_first
            .iter()
            .map(|d| d.as_os_str().to_owned())
            .chain(std::env::split_paths(&inherited).map(PathBuf::into_os_string));
        std::env::join_paths(dirs).ok()
    }
}

/// Whether a runc whose `--version` starts with `first_line` takes `--criu`
/// (runc 1.0 and 1.1 do).
pub fn runc_takes_criu_flag(first_line: &str) -> bool {
    let version = first_line
        .trim()
        .strip_prefix("runc version ")
        .unwrap_or_default();
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    matches!((major, minor), (Some(1), Some(0 | 1)))
}

/// Flags of `runc checkpoint` that a caller chooses.
#[derive(Default, Debug, Clone)]
pub struct CheckpointFlags {
    pub leave_running: bool,
    pub tcp_established: bool,
    pub ext_unix_sk: bool,
    pub file_locks: bool,
    pub shell_job: bool,
    pub manage_cgroups_mode: Option<String>,
}

pub struct Invocation<'a> {
    phase: &'a str,
    verb: &'static str,
    args: Vec<OsString>,
    input: Option<Vec<u8>>,
    stdio: Option<ChildStdio>,
    /// Past it, runc and everything under it (CRIU, a partly restored
    /// tree) are killed and the invocation fails.
    deadline: Option<&'a Deadline>,
}

impl<'a> Invocation<'a> {
    fn new(phase: &'a str, verb: &'static str) -> Self {
        Self {
            phase,
            verb,
            args: vec![verb.into()],
            input: None,
            stdio: None,
            deadline: None,
        }
    }

    fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    fn arg_if(self, cond: bool, a: &str) -> Self {
        if cond {
            self.arg(a)
        } else {
            self
        }
    }

    /// The CRIU options checkpoint and restore share.
    fn criu_flags(self, flags: &CheckpointFlags) -> Self {
        let inv = self
            .arg_if(flags.tcp_established, "--tcp-established")
            .arg_if(flags.ext_unix_sk, "--ext-unix-sk")
            .arg_if(flags.file_locks, "--file-locks")
            .arg_if(flags.shell_job, "--shell-job");
        match &flags.manage_cgroups_mode {
            Some(mode) => inv.arg("--manage-cgroups-mode").arg(mode),
            None => inv,
        }
    }

    fn opt(self, flag: &str, value: Option<&Path>) -> Self {
        match value {
            Some(v) => self.arg(flag).arg(v),
            None => self,
        }
    }
}

impl Runc {
    /// Whether this runc takes `--criu` (asked once per shim). Never asked
    /// for the default, `criu`: runc finds that name on PATH by itself.
    async fn takes_criu_flag(&self) -> bool {
        if self.criu.criu == Path::new("criu") {
            return false;
        }
        *self
            .criu
            .takes_flag
            .get_or_init(|| async {
                match Box::pin(self.run(Invocation::new("version", "--version"))).await {
                    Ok(out) => runc_takes_criu_flag(
                        String::from_utf8_lossy(&out).lines().next().unwrap_or(""),
                    ),
                    Err(e) => {
                        log::warn!("runc --version: {e}: --criu not passed");
                        false
                    }
                }
            })
            .await
    }

    /// Runs one runc command to completion and returns its stdout.
    async fn run(&self, mut inv: Invocation<'_>) -> Result<Vec<u8>> {
        let uses_criu = matches!(inv.verb, "checkpoint" | "restore");
        let criu_flag = uses_criu && self.takes_criu_flag().await;
        let n = INVOCATION.fetch_add(1, Ordering::Relaxed);
        let log = self.log_dir.join(format!(
            ".runc-{}-{}-{}.log",
            inv.verb,
            std::process::id(),
            n
        ));
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&log)
            .arg("--log-format")
            .arg("json");
        if self.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        if criu_flag {
            cmd.arg("--criu").arg(&self.criu.criu);
        }
        if uses_criu {
            if let Some(path) = self.criu.path_env(std::env::var_os("PATH")) {
                cmd.env("PATH", path);
            }
        }
        cmd.args(&inv.args);
        let captured = inv.stdio.is_none();
        match inv.stdio {
            Some(stdio) => {
                cmd.stdin(Stdio::from(stdio.stdin))
                    .stdout(Stdio::from(stdio.stdout))
                    .stderr(Stdio::from(stdio.stderr));
            }
            None => {
                cmd.stdin(if inv.input.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            }
        }
        let mark = self.exits.mark();
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("{}: spawn {}", inv.phase, self.binary.display()), e))?;
        // The Command holds copies of the container's stdio ends: let them go
        // now, so the container alone keeps them open.
        drop(cmd);
        let runc_pid = child.id() as i32;
        let mut exit = self.exits.watch(runc_pid, mark);
        // A dead shim's delete stops what is recorded here (cleanup.rs).
        let _in_flight = matches!(inv.verb, "restore" | "checkpoint")
            .then(|| InFlight::record(&self.log_dir, inv.verb, runc_pid))
            .flatten();

        let mut out = Vec::new();
        let mut err = Vec::new();
        let input = inv.input.take();
        let io = async {
            if !captured {
                return;
            }
            let stdin = child.stdin.take();
            let feed = async move {
                if let (Some(stdin), Some(input)) = (stdin, input) {
                    if let Ok(mut w) = pipe::Sender::from_owned_fd(OwnedFd::from(stdin)) {
                        let _ = w.write_all(&input).await;
                    }
                }
            };
            let so = child.stdout.take().map(OwnedFd::from);
            let se = child.stderr.take().map(OwnedFd::from);
            let read_out = read_all(so, &mut out);
            let read_err = read_all(se, &mut err);
            tokio::join!(feed, read_out, read_err);
        };
        let finished = async {
            io.await;
            (&mut exit).await
        };
        let waited = match inv.deadline {
            None => Ok(finished.await),
            Some(deadline) => tokio::select! {
                exit = finished => Ok(exit),
                () = tokio::time::sleep_until(deadline.at.into()) => Err(deadline),
                () = deadline.cancel.cancelled() => Err(deadline),
            },
        };
        let exit = match waited {
            Ok(exit) => exit,
            Err(deadline) => {
                let killed = kill_tree(runc_pid);
                // Reaped by the shim's reaper; wait so runc is gone
                // before the caller cleans up after it.
                let _ = tokio::time::timeout(Duration::from_secs(10), &mut exit).await;
                let _ = std::fs::remove_file(&log);
                let why = if deadline.cancel.is_cancelled() {
                    "cancelled by a kill of the task".to_string()
                } else {
                    format!("not done when {} passed", deadline.what)
                };
                let msg = format!(
                    "{}: runc {} {why}; killed runc and the {killed} processes under it",
                    inv.phase, inv.verb
                );
                return Err(if deadline.cancel.is_cancelled() {
                    Error::Cancelled(msg)
                } else {
                    Error::DeadlineExceeded(msg)
                });
            }
        }
        .map_err(|_| Error::Other(format!("{}: runc {} exit lost", inv.phase, inv.verb)))?;
        let detail = last_error_line(&log);
        let _ = std::fs::remove_file(&log);
        if exit.code != 0 {
            let prefix = format!("runc {} failed: ", inv.verb);
            let detail = detail
                .map(|d| d.strip_prefix(&prefix).map(str::to_string).unwrap_or(d))
                // One line: runc's messages can span several.
                .map(|d| d.trim().replace('\n', "; "))
                .or_else(|| {
                    let s = String::from_utf8_lossy(&err).trim().to_string();
                    (!s.is_empty()).then_some(s)
                })
                .unwrap_or_else(|| format!("exit status {}", exit.code));
            return Err(Error::Runc {
                phase: inv.phase.to_string(),
                verb: inv.verb,
                detail,
            });
        }
        Ok(out)
    }

    pub async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        no_pivot: bool,
        stdio: Option<ChildStdio>,
    ) -> Result<()> {
        let mut inv = Invocation::new("create", "create")
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(pid_file)
            .opt("--console-socket", console_socket)
            .arg_if(no_pivot, "--no-pivot")
            .arg(id);
        inv.stdio = stdio;
        self.run(inv).await.map(drop)
    }

    pub async fn start(&self, id: &str) -> Result<()> {
        self.run(Invocation::new("start", "start").arg(id))
            .await
            .map(drop)
    }

    pub async fn exec(
        &self,
        id: &str,
        process_json: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: Option<ChildStdio>,
    ) -> Result<()> {
        let mut inv = Invocation::new("exec", "exec")
            .arg("--detach")
            .arg("--process")
            .arg(process_json)
            .arg("--pid-file")
            .arg(pid_file)
            .opt("--console-socket", console_socket)
            .arg(id);
        inv.stdio = stdio;
        self.run(inv).await.map(drop)
    }

    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let inv = Invocation::new("kill", "kill")
            .arg_if(all, "--all")
            .arg(id)
            .arg(signal.to_string());
        self.run(inv).await.map(drop)
    }

    /// `runc delete`, never through a mount: runc removes its state folder
    /// recursively, and a restore bind-mounts the rootfs under it
    /// (`criu-root`). What is mounted there comes off first; if anything
    /// stays, runc's state is kept and the error says why.
    pub async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let state = self.root.join(id);
        mounts::unmount_under(&state);
        if mounts::has_mounts_under(&state) {
            return Err(Error::FailedPrecondition(format!(
                "delete: mounts remain under {}: runc's state is kept so nothing under them is removed",
                state.display()
            )));
        }
        let inv = Invocation::new("delete", "delete")
            .arg_if(force, "--force")
            .arg(id);
        self.run(inv).await.map(drop)
    }

    pub async fn pause(&self, id: &str) -> Result<()> {
        self.run(Invocation::new("pause", "pause").arg(id))
            .await
            .map(drop)
    }

    pub async fn resume(&self, id: &str) -> Result<()> {
        self.run(Invocation::new("resume", "resume").arg(id))
            .await
            .map(drop)
    }

    /// The pids of every process in the container.
    pub async fn ps(&self, id: &str) -> Result<Vec<i32>> {
        let out = self
            .run(
                Invocation::new("pids", "ps")
                    .arg("--format")
                    .arg("json")
                    .arg(id),
            )
            .await?;
        let pids: Option<Vec<i32>> = serde_json::from_slice(&out).map_err(|e| {
            Error::Other(format!(
                "pids: runc ps printed something other than JSON: {e}"
            ))
        })?;
        Ok(pids.unwrap_or_default())
    }

    /// `runc update --resources -`, with the OCI LinuxResources JSON on stdin.
    pub async fn update(&self, id: &str, resources_json: Vec<u8>) -> Result<()> {
        let mut inv = Invocation::new("update", "update")
            .arg("--resources")
            .arg("-")
            .arg(id);
        inv.input = Some(resources_json);
        self.run(inv).await.map(drop)
    }

    pub async fn checkpoint(
        &self,
        id: &str,
        image: &Path,
        work: &Path,
        flags: &CheckpointFlags,
        deadline: Option<&Deadline>,
    ) -> Result<()> {
        let mut inv = Invocation::new("checkpoint", "checkpoint")
            .arg("--image-path")
            .arg(image)
            .arg("--work-path")
            .arg(work)
            .arg_if(flags.leave_running, "--leave-running")
            .criu_flags(flags)
            .arg(id);
        inv.deadline = deadline;
        self.run(inv).await.map(drop)
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn restore(
        &self,
        id: &str,
        bundle: &Path,
        image: &Path,
        work: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        flags: &CheckpointFlags,
        stdio: Option<ChildStdio>,
        deadline: Option<&Deadline>,
    ) -> Result<()> {
        let mut inv = Invocation::new("restore", "restore")
            .arg("--detach")
            .arg("--bundle")
            .arg(bundle)
            .arg("--image-path")
            .arg(image)
            .arg("--work-path")
            .arg(work)
            .arg("--pid-file")
            .arg(pid_file)
            .opt("--console-socket", console_socket)
            .criu_flags(flags)
            .arg(id);
        inv.stdio = stdio;
        inv.deadline = deadline;
        self.run(inv).await.map(drop)
    }
}

/// SIGKILLs every process under `root`, then `root`. They are all stopped
/// first, so none can fork, and none dies and leaves its children to the
/// shim (a subreaper) before they are found. Returns how many were under it.
pub fn kill_tree(root: i32) -> usize {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(root), Signal::SIGSTOP);
    let mut stopped: Vec<i32> = Vec::new();
    // Until a pass finds nobody new: a process may fork until it is stopped.
    for _ in 0..100 {
        let found: Vec<i32> = descendants(root)
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        if found.is_empty() {
            break;
        }
        for p in found {
            let _ = kill(Pid::from_raw(p), Signal::SIGSTOP);
            stopped.push(p);
        }
    }
    for p in &stopped {
        let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
    stopped.len()
}

/// Every live process below `root`, from /proc.
fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        if let Some(Ok(ppid)) = fields.next().map(str::parse::<i32>) {
            if state != "Z" && state != "X" {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut tree = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, _) in parent_of.iter().filter(|(_, pp)| *pp == parent) {
            if !tree.contains(pid) {
                tree.push(*pid);
                frontier.push(*pid);
            }
        }
    }
    tree
}

async fn read_all(fd: Option<OwnedFd>, buf: &mut Vec<u8>) {
    if let Some(fd) = fd {
        if let Ok(mut r) = pipe::Receiver::from_owned_fd(fd) {
            let _ = r.read_to_end(buf).await;
        }
    }
}

/// The message of the last error-level entry of runc's JSON log.
fn last_error_line(log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        (v.get("level")?.as_str()? == "error")
            .then(|| v.get("msg")?.as_str().map(str::to_string))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn last_error_line_picks_the_last_error_entry() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.json");
        std::fs::write(
            &log,
            concat!(
                "{\"level\":\"error\",\"msg\":\"first\"}\n",
                "{\"level\":\"warning\",\"msg\":\"noise\"}\n",
                "{\"level\":\"error\",\"msg\":\"container with id exists\"}\n",
                "not json\n"
            ),
        )
        .unwrap();
        assert_eq!(
            last_error_line(&log).as_deref(),
            Some("container with id exists")
        );
    }

    #[test]
    fn only_runc_1_0_and_1_1_take_the_criu_flag() {
        assert!(runc_takes_criu_flag("runc version 1.1.5+ds1"));
        assert!(runc_takes_criu_flag("runc version 1.0.0-rc93"));
        assert!(!runc_takes_criu_flag("runc version 1.2.0"));
        assert!(!runc_takes_criu_flag("runc version 1.3.3"));
        assert!(!runc_takes_criu_flag("runc version 2.0.0"));
        assert!(!runc_takes_criu_flag("something else"));
    }

    #[test]
    fn the_tools_folders_come_first_on_path() {
        let t = CriuTools::new(
            Path::new("/opt/criu/sbin/criu"),
            Path::new("/opt/nvidia/bin/cuda-checkpoint"),
        );
        assert_eq!(
            t.path_env(Some("/usr/bin:/bin".into())).unwrap(),
            "/opt/nvidia/bin:/opt/criu/sbin:/usr/bin:/bin"
        );
        let bare = CriuTools::new(Path::new("criu"), Path::new("cuda-checkpoint"));
        assert_eq!(bare.path_env(Some("/usr/bin".into())).unwrap(), "/usr/bin");
        let same = CriuTools::new(
            Path::new("/opt/x/criu"),
            Path::new("/opt/x/cuda-checkpoint"),
        );
        assert_eq!(
            same.path_env(None)
                .unwrap()
                .to_str()
                .unwrap()
                .split(':')
                .next(),
            Some("/opt/x")
        );
    }

    #[test]
    fn last_error_line_of_a_missing_log_is_none() {
        assert_eq!(last_error_line(Path::new("/nonexistent/log.json")), None);
    }

    /// Gone, or a zombie nobody reaped yet.
    fn dead(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    }

    #[test]
    fn kill_tree_kills_every_descendant() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 60 & sleep 60 & wait"])
            .spawn()
            .unwrap();
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tree = descendants(root);
        while tree.len() < 2 {
            assert!(Instant::now() < deadline, "the sleeps never started");
            std::thread::sleep(Duration::from_millis(10));
            tree = descendants(root);
        }
        assert_eq!(kill_tree(root), 2);
        child.wait().unwrap();
        for pid in tree {
            while !dead(pid) {
                assert!(Instant::now() < deadline, "{pid} survived");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
