//! A container: its bundle, its runc, its init process and its execs.
//! Operations here speak domain types; task.rs adapts the wire.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::asynchronous::io::Stdio;
use log::warn;
use tokio_util::sync::CancellationToken;

use crate::bundle_spec::BundleSpec;
use crate::capture_task::CaptureTask;
use crate::error::{Error, Result};
use crate::init_start::InitStart;
use crate::prepared::Prepared;
use crate::process::{Process, Status, Transition};
use crate::runc::{CheckpointFlags, RuncVerbs};
use crate::snapshot::rootfs::RootMount;

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Arc<dyn RuncVerbs>,
    pub no_pivot: bool,
    pub init: Process,
    pub execs: HashMap<String, Process>,
    /// How the init starts (lifecycle/init_start.rs).
    pub start: InitStart,
    /// While the init is restoring or activating: what a kill cancels.
    pub starting: Option<CancellationToken>,
    /// A capture plan's capture while it runs: what a kill of the init
    /// cancels and a delete waits for (capture_task.rs).
    pub capture: Option<CaptureTask>,
    /// What the shim asks of the spec read once at create (its
    /// annotations, cgroup and memory settings: `BundleSpec::kept`).
    pub spec: BundleSpec,
    /// The rootfs mounts of the Create request, and whether they are mounted.
    rootfs: Vec<RootMount>,
    rootfs_mounted: bool,
    /// Whether a restored copy's exit is held back (container_cold.rs).
    pub copy_exit: CopyExit,
    /// A snapshot plan's own network namespace (container_netns.rs).
    netns: Option<crate::netns_holder::NetnsHold>,
}

/// A CheckpointTask request, unwrapped from the wire.
pub struct CheckpointRequest {
    pub image: PathBuf,
    /// CRIU's work dir; by default the bundle's `criu-work`.
    pub work: Option<PathBuf>,
    pub flags: CheckpointFlags,
}

/// What `create` needs, already unwrapped from the wire.
pub struct CreateConfig {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<RootMount>,
    pub stdio: Stdio,
    pub runc: Arc<dyn RuncVerbs>,
    pub no_pivot: bool,
    pub start: InitStart,
    /// What the container keeps of the bundle's spec as create read it
    /// (once; the terminal checked against the request's stdio there).
    pub spec: BundleSpec,
}

impl Container {
    /// Mounts the rootfs, sets up stdio and runs `runc create` (or, for a
    /// checkpoint, prepares the restore that `start` will run). On failure
    /// nothing is left behind.
    pub async fn create(cfg: CreateConfig) -> Result<Self> {
        let mut c = Container {
            id: cfg.id,
            bundle: cfg.bundle,
            runc: cfg.runc,
            no_pivot: cfg.no_pivot,
            init: Process::new("", cfg.stdio),
            execs: HashMap::new(),
            start: cfg.start,
            starting: None,
            capture: None,
            spec: cfg.spec,
            rootfs: cfg.rootfs,
            rootfs_mounted: false,
            copy_exit: CopyExit::Publish,
            netns: None,
        };
        if let Err(e) = c.mount_rootfs().and_then(|()| c.hold_netns()) {
            c.remove_netns();
            c.unmount_rootfs();
            c.start.cleanup();
            return Err(e);
        }
        if c.start.restores() {
            return Ok(c);
        }
        match c.runc_create().await {
            Ok(()) => {
                // The init is in the namespace now: it holds it.
                c.release_netns_holder();
                Ok(c)
            }
            Err(e) => {
                c.cleanup_failed_create().await;
                Err(e)
            }
        }
    }

    async fn runc_create(&mut self) -> Result<()> {
        let prepared = Prepared::new(&mut self.init)?;
        self.runc_create_with(prepared).await
    }

    /// `runc create` of the init with its stdio `prepared`.
    async fn runc_create_with(&mut self, prepared: Prepared) -> Result<()> {
        let pid_file = self.bundle.join("init.pid");
        let created = self
            .runc
            .create(
                &self.id,
                &self.bundle,
                &pid_file,
                prepared.console_path.as_deref(),
                self.no_pivot,
                prepared.child_stdio,
            )
            .await;
        Prepared::finish(prepared.receive, created, &mut self.init).await?;
        self.init.pid = read_pid(&pid_file, "create")?;
        Ok(())
    }

    async fn cleanup_failed_create(&mut self) {
        if let Err(e) = self.runc.delete(&self.id, true).await {
            log::debug!("cleanup after failed create: {e}");
        }
        self.init.io.abort().await;
        self.remove_netns();
        self.unmount_rootfs();
        self.start.cleanup();
    }

    /// Starts the init process with `runc start` (a plain container; a
    /// restore goes through [`Container::begin_restore`]).
    pub async fn run_start(&mut self) -> Result<()> {
        self.ensure_created()?;
        self.runc.start(&self.id).await?;
        self.init.transition("start", Transition::Start)
    }

    fn ensure_created(&self) -> Result<()> {
        if self.init.status() != Status::Created {
            return Err(Error::FailedPrecondition(format!(
                "start: container {} is {}, not created",
                self.id,
                self.init.status()
            )));
        }
        Ok(())
    }

    /// A restore begins: the init becomes Restoring, its stdio is made
    /// ready for `runc restore` (run by lifecycle/restore/ without any hold
    /// on the container, so every other call answers meanwhile), and a kill
    /// cancels `cancel` from now until the copy is visible or failed.
    pub fn begin_restore(&mut self, cancel: CancellationToken) -> Result<Prepared> {
        self.ensure_created()?;
        let prepared = Prepared::new(&mut self.init)?;
        self.init.transition("start", Transition::BeginRestore)?;
        // Whoever configured the namespace through the holder (dockerd) did
        // so between Create and Start; the copy is restored into it.
        self.release_netns_holder();
        self.starting = Some(cancel);
        Ok(prepared)
    }

    /// Takes the result of `runc restore`: the terminal, the pid. The init
    /// is Activating until [`Container::visible`].
    pub async fn finish_restore(&mut self, prepared: Prepared, ran: Result<()>) -> Result<i32> {
        Prepared::finish(prepared.receive, ran, &mut self.init).await?;
        self.init.pid = read_pid(&self.pid_file(), "restore")?;
        self.init.transition("restore", Transition::Restored)?;
        Ok(self.init.pid)
    }

    /// The restored copy proved itself: it counts as running.
    pub fn visible(&mut self) -> Result<()> {
        self.starting = None;
        self.init.transition("restore", Transition::Visible)
    }

    /// Where runc writes the init's pid.
    pub fn pid_file(&self) -> PathBuf {
        self.bundle.join("init.pid")
    }

    /// A start that failed: nothing of it may run or be seen. A process
    /// that exists is killed (its exit arrives through the reaper); without
    /// one, the init is recorded as killed here. Returns that synthetic exit
    /// when there was one, for the caller to publish.
    pub async fn start_failed(&mut self) -> Option<crate::exits::Exit> {
        self.starting = None;
        if self.init.pid != 0 {
            let _ = self.runc.kill(&self.id, libc::SIGKILL as u32, true).await;
            return None;
        }
        let exit = crate::exits::Exit {
            code: 128 + libc::SIGKILL,
            at: time::OffsetDateTime::now_utc(),
        };
        self.init.set_exited(exit).then_some(exit)
    }

    /// The spec's `linux.cgroupsPath` when it is a cgroupfs path.
    pub fn cgroups_path(&self) -> Option<PathBuf> {
        self.spec.cgroups_path()
    }

    /// Registers an exec process (not started yet).
    pub fn add_exec(&mut self, exec_id: &str, stdio: Stdio, process_json: &[u8]) -> Result<()> {
        if self.execs.contains_key(exec_id) {
            return Err(Error::AlreadyExists(format!(
                "exec: process {exec_id} already exists in {}",
                self.id
            )));
        }
        if self.init.exit().is_some() {
            return Err(Error::FailedPrecondition(format!(
                "exec: container {} has stopped",
                self.id
            )));
        }
        // As containerd's runc shim: the request's terminal flag wins, or
        // runc refuses a console socket for a spec without a terminal.
        let process_json = exec_spec_with_terminal(process_json, stdio.terminal)
            .map_err(|e| Error::InvalidArgument(format!("exec: process spec of {exec_id}: {e}")))?;
        let path = self.exec_spec_path(exec_id);
        std::fs::write(&path, process_json)
            .map_err(|e| Error::io(format!("exec: write {}", path.display()), e))?;
        self.execs
            .insert(exec_id.to_string(), Process::new(exec_id, stdio));
        Ok(())
    }

    fn exec_spec_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!(".exec-{exec_id}.json"))
    }

    /// Starts a registered exec with `runc exec --detach`.
    pub async fn start_exec(&mut self, exec_id: &str) -> Result<i32> {
        let p = self.process(exec_id)?;
        if p.status() != Status::Created || p.pid != 0 {
            return Err(Error::FailedPrecondition(format!(
                "start: exec {exec_id} was already started"
            )));
        }
        let mut p = self.execs.remove(exec_id).expect("checked above");
        let result = self.run_exec(&mut p).await;
        self.execs.insert(exec_id.to_string(), p);
        result
    }

    async fn run_exec(&self, p: &mut Process) -> Result<i32> {
        let pid_file = self.bundle.join(format!(".exec-{}.pid", p.exec_id));
        let prepared = Prepared::new(p)?;
        let ran = self
            .runc
            .exec(
                &self.id,
                &self.exec_spec_path(&p.exec_id),
                &pid_file,
                prepared.console_path.as_deref(),
                prepared.child_stdio,
            )
            .await;
        Prepared::finish(prepared.receive, ran, p).await?;
        p.pid = read_pid(&pid_file, "exec")?;
        p.transition("start", Transition::Start)?;
        let _ = std::fs::remove_file(&pid_file);
        Ok(p.pid)
    }

    pub fn process(&self, exec_id: &str) -> Result<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs
            .get(exec_id)
            .ok_or_else(|| Error::NotFound(format!("exec {exec_id} not found in {}", self.id)))
    }

    pub fn process_mut(&mut self, exec_id: &str) -> Result<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        let id = self.id.clone();
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| Error::NotFound(format!("exec {exec_id} not found in {id}")))
    }

    pub async fn kill(&self, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let p = self.process(exec_id)?;
        if exec_id.is_empty() {
            if let Some(cancel) = self.starting.as_ref().filter(|_| signal != 0) {
                // A kill during a restore ends it: runc and CRIU are killed
                // with what they restored so far, and Start fails.
                cancel.cancel();
                if p.pid == 0 {
                    return Ok(());
                }
            }
            if let Some(capture) = self.capture.as_ref().filter(|_| signal != 0) {
                // The capture of a tree being stopped would dump the signal
                // with it: it ends, publishing nothing (capture_task.rs).
                capture.cancel();
            }
            if p.exit().is_some() && !all {
                return Err(Error::NotFound(format!(
                    "kill: container {} process already finished",
                    self.id
                )));
            }
            return self
                .runc
                .kill(&self.id, signal, all)
                .await
                .map_err(gone_is_not_found);
        }
        p.ensure_running("kill")?;
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| Error::InvalidArgument(format!("kill: invalid signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), sig).map_err(|e| match e {
            nix::errno::Errno::ESRCH => Error::NotFound(format!(
                "kill: exec {exec_id} of {}: process already finished",
                self.id
            )),
            e => Error::io(format!("kill: exec {exec_id}"), e.into()),
        })
    }

    /// Removes an exec that has exited or never started.
    pub fn delete_exec(&mut self, exec_id: &str) -> Result<Process> {
        let p = self.process(exec_id)?;
        if matches!(p.status(), Status::Running | Status::Paused) {
            return Err(Error::FailedPrecondition(format!(
                "delete: exec {exec_id} is still running"
            )));
        }
        let _ = std::fs::remove_file(self.exec_spec_path(exec_id));
        Ok(self.execs.remove(exec_id).expect("checked above"))
    }

    /// Tears the container down in runc; the caller drains stdio afterwards.
    pub async fn delete(&mut self) -> Result<()> {
        if self.init.status().is_live() {
            return Err(Error::FailedPrecondition(format!(
                "delete: container {} is still running",
                self.id
            )));
        }
        // Its capture undone first: nothing of it may outlive the container.
        if let Some(capture) = self.capture.take() {
            if !capture.cancel_and_wait().await {
                warn!("delete {}: its capture is still winding down", self.id);
            }
        }
        // A never-started (or restore-pending) container may still have its
        // runc init waiting: force removes it too. Mounts left under runc's
        // state keep it, and the container (Runc::delete).
        match self.runc.delete(&self.id, true).await {
            Err(e @ Error::FailedPrecondition(_)) => return Err(e),
            Err(e) if !self.start.restores() || self.init.pid != 0 => {
                warn!("delete {}: {e}", self.id);
            }
            _ => {}
        }
        for exec_id in self.execs.keys() {
            let _ = std::fs::remove_file(self.exec_spec_path(exec_id));
        }
        let _ = std::fs::remove_file(self.bundle.join("init.pid"));
        let _ = std::fs::remove_dir_all(self.bundle.join("criu-work"));
        self.remove_netns();
        self.unmount_rootfs();
        self.start.cleanup();
        Ok(())
    }

    /// The container's processes, each with its exec id when it is an
    /// exec's; the container is locked only to read what runc needs.
    pub async fn pids(handle: &tokio::sync::Mutex<Self>) -> Result<Vec<(i32, Option<String>)>> {
        let c = handle.lock().await;
        if c.init.status() == Status::Restoring {
            // CRIU is restoring: what works on the container is runc (and
            // CRIU under it). containerd, reconnecting after a restart,
            // takes a shim with no pids for a leaked one and deletes it.
            // Between runc's exit and the end of the page placement and the
            // verification, the restored init (stopped) is what is there.
            let mut pids = crate::inflight::in_flight_pids(&c.bundle);
            if pids.is_empty() {
                pids.extend(crate::cleanup::restored_init_pid(&c.bundle));
            }
            return Ok(pids.into_iter().map(|p| (p, None)).collect());
        }
        let (runc, id) = (c.runc.clone(), c.id.clone());
        let execs: HashMap<i32, String> = c
            .execs
            .values()
            .map(|p| (p.pid, p.exec_id.clone()))
            .collect();
        drop(c);
        let pids = runc.ps(&id).await?;
        Ok(pids
            .into_iter()
            .map(|pid| (pid, execs.get(&pid).cloned()))
            .collect())
    }

    /// Freezes (`pause`) or thaws the container's processes.
    pub async fn pause(&mut self, pause: bool) -> Result<()> {
        let what = if pause { "pause" } else { "resume" };
        self.init.ensure_running(what)?;
        let via = if pause {
            Transition::Pause
        } else {
            Transition::Resume
        };
        // Refused before runc runs: a paused container is not paused twice.
        self.init.status().next(via).map_err(|e| {
            Error::FailedPrecondition(format!("{what}: container {}: {e}", self.id))
        })?;
        if pause {
            self.runc.pause(&self.id).await?;
        } else {
            self.runc.resume(&self.id).await?;
        }
        self.init.transition(what, via)
    }

    /// `runc checkpoint` of the running container (containerd's
    /// CheckpointTask): a terminal's container is always a shell job.
    pub async fn checkpoint(&self, req: CheckpointRequest) -> Result<()> {
        self.init.ensure_running("checkpoint")?;
        let work = req.work.unwrap_or_else(|| self.bundle.join("criu-work"));
        std::fs::create_dir_all(&work)
            .map_err(|e| Error::io(format!("checkpoint: mkdir {}", work.display()), e))?;
        let flags = CheckpointFlags {
            shell_job: req.flags.shell_job || self.init.stdio.terminal,
            ..req.flags
        };
        self.runc
            .checkpoint(&self.id, &req.image, &work, &flags, None)
            .await
    }
}

/// A kill that failed because the process is gone (it exited, or runc no
/// longer knows the container) is NotFound, as containerd's runc shim says:
/// containerd and CRI treat that as "already stopped".
fn gone_is_not_found(e: Error) -> Error {
    match e {
        Error::Runc { detail, .. } if is_gone(&detail) => {
            Error::NotFound(format!("kill: {detail}"))
        }
        e => e,
    }
}

fn is_gone(detail: &str) -> bool {
    let d = detail.to_ascii_lowercase();
    [
        "container not running",
        "no such process",
        "process already finished",
        "does not exist",
    ]
    .iter()
    .any(|m| d.contains(m))
}

/// The exec's process spec with `terminal` set to the request's flag.
fn exec_spec_with_terminal(process_json: &[u8], terminal: bool) -> serde_json::Result<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(process_json)?;
    match v.as_object_mut() {
        Some(o) => {
            o.insert("terminal".into(), terminal.into());
        }
        None => {
            return Err(serde::de::Error::custom(
                "the process spec is not an object",
            ));
        }
    }
    serde_json::to_vec(&v)
}

fn read_pid(path: &Path, phase: &str) -> Result<i32> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("{phase}: read pid file {}", path.display()), e))?;
    text.trim().parse::<i32>().map_err(|_| {
        Error::Other(format!(
            "{phase}: pid file {} holds {:?}, not a pid",
            path.display(),
            text.trim()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_of_gone_processes_are_not_found() {
        for detail in [
            "container not running",
            "os: process already finished",
            "no such process",
            "container \"x\" does not exist",
        ] {
            let e = gone_is_not_found(Error::Runc {
                phase: "kill".into(),
                verb: "kill",
                detail: detail.into(),
            });
            assert!(matches!(e, Error::NotFound(_)), "{detail}: {e:?}");
        }
        let other = gone_is_not_found(Error::Runc {
            phase: "kill".into(),
            verb: "kill",
            detail: "permission denied".into(),
        });
        assert!(matches!(other, Error::Runc { .. }), "{other:?}");
    }

    #[test]
    fn exec_specs_take_the_requests_terminal_flag() {
        let spec = br#"{"args":["sh"],"cwd":"/","terminal":false,"user":{"uid":0,"gid":0}}"#;
        let v: serde_json::Value =
            serde_json::from_slice(&exec_spec_with_terminal(spec, true).unwrap()).unwrap();
        assert_eq!(v["terminal"], true);
        assert_eq!(v["args"][0], "sh");
        let v: serde_json::Value =
            serde_json::from_slice(&exec_spec_with_terminal(spec, false).unwrap()).unwrap();
        assert_eq!(v["terminal"], false);
        assert!(exec_spec_with_terminal(b"[1]", true).is_err());
    }
}

#[path = "container_cold.rs"]
mod cold;
#[path = "container_netns.rs"]
mod netns;
#[path = "container_rootfs.rs"]
mod rootfs;
pub use cold::{ColdWay, CopyExit};
#[cfg(test)]
#[path = "container_kill_tests.rs"]
mod kill_tests;
