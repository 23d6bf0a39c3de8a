//! runc's verbs as the shim calls them: create, start, exec, kill, delete,
//! pause, resume, ps, update, checkpoint, restore. The container and the
//! lifecycle's phases see them through [`RuncVerbs`]: the runc CLI here,
//! a recording fake in unit tests (fakes.rs).

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::mounts;

use super::invocation::{CheckpointFlags, ChildStdio, Invocation};
use super::native;
use super::run::Runc;

/// The files a `runc restore` reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct RestoreFiles<'a> {
    pub bundle: &'a Path,
    /// CRIU's images.
    pub image: &'a Path,
    /// CRIU's work dir (its logs).
    pub work: &'a Path,
    pub pid_file: &'a Path,
    pub console_socket: Option<&'a Path>,
}

/// The runc verbs the container and the lifecycle use, and the two facts
/// of its configuration they read. One call is one runc process (or the
/// shim's native start or delete): a trait object's call costs nothing
/// beside it.
#[async_trait]
pub trait RuncVerbs: Send + Sync {
    /// runc's state folder of container `id` (under its root).
    fn state_dir(&self, id: &str) -> PathBuf;
    /// Whether runc drives cgroups through systemd (not cgroupfs).
    fn systemd_cgroup(&self) -> bool;
    async fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        no_pivot: bool,
        stdio: Option<ChildStdio>,
    ) -> Result<()>;
    async fn start(&self, id: &str) -> Result<()>;
    async fn exec(
        &self,
        id: &str,
        process_json: &Path,
        pid_file: &Path,
        console_socket: Option<&Path>,
        stdio: Option<ChildStdio>,
    ) -> Result<()>;
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()>;
    async fn delete(&self, id: &str, force: bool) -> Result<()>;
    async fn pause(&self, id: &str) -> Result<()>;
    async fn resume(&self, id: &str) -> Result<()>;
    async fn ps(&self, id: &str) -> Result<Vec<i32>>;
    async fn update(&self, id: &str, resources_json: Vec<u8>) -> Result<()>;
    async fn checkpoint(
        &self,
        id: &str,
        image: &Path,
        work: &Path,
        flags: &CheckpointFlags,
        deadline: Option<&Deadline>,
    ) -> Result<()>;
    async fn restore(
        &self,
        id: &str,
        files: &RestoreFiles<'_>,
        flags: &CheckpointFlags,
        stdio: Option<ChildStdio>,
        deadline: Option<&Deadline>,
    ) -> Result<()>;
}

#[async_trait]
impl RuncVerbs for Runc {
    fn state_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn systemd_cgroup(&self) -> bool {
        self.systemd_cgroup
    }

    async fn create(
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

    /// Starts the created container: the shim lets its init exec itself
    /// where it can (native.rs), else `runc start`.
    async fn start(&self, id: &str) -> Result<()> {
        let dir = self.root.join(id);
        let native = tokio::task::spawn_blocking(move || {
            native::start(&dir, std::time::Duration::from_secs(10))
        })
        .await;
        match native {
            Ok(Ok(native::Outcome::Done)) => return Ok(()),
            Ok(Err(e)) => log::debug!("start {id}: {e}: runc start instead"),
            _ => {}
        }
        self.run(Invocation::new("start", "start").arg(id))
            .await
            .map(drop)
    }

    async fn exec(
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

    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
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
    async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let state = self.root.join(id);
        mounts::unmount_under(&state);
        if mounts::has_mounts_under(&state) {
            return Err(Error::FailedPrecondition(format!(
                "delete: mounts remain under {}: runc's state is kept so nothing under them is removed",
                state.display()
            )));
        }
        // A container whose init exited: its cgroups and state folder
        // removed by the shim where it can (native.rs), else by runc.
        if force {
            let dir = state.clone();
            let native = tokio::task::spawn_blocking(move || native::delete(&dir)).await;
            if matches!(native, Ok(native::Outcome::Done)) {
                return Ok(());
            }
        }
        let inv = Invocation::new("delete", "delete")
            .arg_if(force, "--force")
            .arg(id);
        self.run(inv).await.map(drop)
    }

    async fn pause(&self, id: &str) -> Result<()> {
        self.run(Invocation::new("pause", "pause").arg(id))
            .await
            .map(drop)
    }

    async fn resume(&self, id: &str) -> Result<()> {
        self.run(Invocation::new("resume", "resume").arg(id))
            .await
            .map(drop)
    }

    /// The pids of every process in the container.
    async fn ps(&self, id: &str) -> Result<Vec<i32>> {
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
    async fn update(&self, id: &str, resources_json: Vec<u8>) -> Result<()> {
        let mut inv = Invocation::new("update", "update")
            .arg("--resources")
            .arg("-")
            .arg(id);
        inv.input = Some(resources_json);
        self.run(inv).await.map(drop)
    }

    async fn checkpoint(
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

    async fn restore(
        &self,
        id: &str,
        files: &RestoreFiles<'_>,
        flags: &CheckpointFlags,
        stdio: Option<ChildStdio>,
        deadline: Option<&Deadline>,
    ) -> Result<()> {
        let mut inv = Invocation::new("restore", "restore")
            .arg("--detach")
            .arg("--bundle")
            .arg(files.bundle)
            .arg("--image-path")
            .arg(files.image)
            .arg("--work-path")
            .arg(files.work)
            .arg("--pid-file")
            .arg(files.pid_file)
            .opt("--console-socket", files.console_socket)
            .criu_flags(flags)
            .arg(id);
        inv.stdio = stdio;
        inv.deadline = deadline;
        self.run(inv).await.map(drop)
    }
}
