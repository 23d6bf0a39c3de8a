//! Running one runc invocation to completion: its command line, the exit
//! awaited through the shim's reaper (never `waitpid` on runc), its output
//! captured, and past a deadline or on a cancel runc and everything under
//! it killed.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::exits::{Exit, Exits};
use crate::inflight::InFlight;
use crate::pipes::read_all;

use super::failure::{failure, last_error_line};
use super::invocation::Invocation;
use super::kill_tree::kill_tree;
use super::tools::{runc_takes_criu_flag, CriuTools};

static INVOCATION: AtomicU64 = AtomicU64::new(0);

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
    pub(super) async fn run(&self, mut inv: Invocation<'_>) -> Result<Vec<u8>> {
        let uses_criu = matches!(inv.verb, "checkpoint" | "restore");
        let criu_flag = uses_criu && self.takes_criu_flag().await;
        let n = INVOCATION.fetch_add(1, Ordering::Relaxed);
        let log = self.log_dir.join(format!(
            ".runc-{}-{}-{}.log",
            inv.verb,
            std::process::id(),
            n
        ));
        let captured = inv.stdio.is_none();
        let mut cmd = self.command(&mut inv, &log, uses_criu, criu_flag);
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
        let finished = async {
            if captured {
                communicate(&mut child, input, &mut out, &mut err).await;
            }
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
            Err(deadline) => return Err(stop(&inv, deadline, runc_pid, &mut exit, &log).await),
        }
        .map_err(|_| Error::Other(format!("{}: runc {} exit lost", inv.phase, inv.verb)))?;
        let detail = last_error_line(&log);
        let _ = std::fs::remove_file(&log);
        if exit.code != 0 {
            return Err(failure(inv.phase, inv.verb, detail, &err, exit.code));
        }
        Ok(out)
    }

    /// `runc --root R --log LOG --log-format json [--systemd-cgroup]
    /// [--criu C] ARGS`, with the tools' folders first on PATH for a verb
    /// that runs CRIU, and the container's stdio (taken from `inv`) or
    /// pipes for its output.
    fn command(
        &self,
        inv: &mut Invocation<'_>,
        log: &Path,
        uses_criu: bool,
        criu_flag: bool,
    ) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(log)
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
        match inv.stdio.take() {
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
        cmd
    }
}

/// Feeds `input` to runc's stdin while its stdout and stderr are read to
/// their end into `out` and `err`.
async fn communicate(
    child: &mut Child,
    input: Option<Vec<u8>>,
    out: &mut Vec<u8>,
    err: &mut Vec<u8>,
) {
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
    let read_out = read_all(so, out);
    let read_err = read_all(se, err);
    tokio::join!(feed, read_out, read_err);
}

/// Past `deadline` or on its cancel: kills runc and the processes under it
/// (CRIU, a partly restored tree), waits for the reaper to collect runc so
/// it is gone before the caller cleans up after it, and says why.
async fn stop(
    inv: &Invocation<'_>,
    deadline: &Deadline,
    runc_pid: i32,
    exit: &mut oneshot::Receiver<Exit>,
    log: &Path,
) -> Error {
    let killed = kill_tree(runc_pid);
    // Reaped by the shim's reaper; wait so runc is gone
    // before the caller cleans up after it.
    let _ = tokio::time::timeout(Duration::from_secs(10), exit).await;
    let _ = std::fs::remove_file(log);
    let why = if deadline.cancel.is_cancelled() {
        "cancelled by a kill of the task".to_string()
    } else {
        format!("not done when {} passed", deadline.what)
    };
    let msg = format!(
        "{}: runc {} {why}; killed runc and the {killed} processes under it",
        inv.phase, inv.verb
    );
    if deadline.cancel.is_cancelled() {
        Error::Cancelled(msg)
    } else {
        Error::DeadlineExceeded(msg)
    }
}
