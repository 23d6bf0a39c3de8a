//! A container: its bundle, its runc, its init process and its execs.
//! Operations here speak domain types; task.rs adapts the wire.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use containerd_shim::asynchronous::io::Stdio;
use containerd_shim::mount::mount_rootfs;
use containerd_shim_protos::api::Mount;
use log::warn;
use nix::mount::{umount2, MntFlags};

use crate::console::ConsoleSocket;
use crate::error::{Error, Result};
use crate::process::{Process, Status};
use crate::runc::{CheckpointFlags, ChildStdio, Deadline, Runc};
use crate::snapshot::Snapshot;
use crate::stdio;

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Runc,
    pub no_pivot: bool,
    pub init: Process,
    pub execs: HashMap<String, Process>,
    /// Set when the task is created from a checkpoint: start restores it.
    pub restore_from: Option<PathBuf>,
    /// The snapshot plan, when the container has one.
    pub snapshot: Option<Snapshot>,
    rootfs_mounted: bool,
}

/// What `create` needs, already unwrapped from the wire.
pub struct CreateConfig {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<Mount>,
    pub stdio: Stdio,
    pub checkpoint: Option<PathBuf>,
    pub runc: Runc,
    pub no_pivot: bool,
    pub snapshot: Option<Snapshot>,
}

impl Container {
    /// Mounts the rootfs, sets up stdio and runs `runc create` (or, for a
    /// checkpoint, prepares the restore that `start` will run). On failure
    /// nothing is left behind.
    pub async fn create(cfg: CreateConfig) -> Result<Self> {
        let spec_path = cfg.bundle.join("config.json");
        let spec = oci_spec::runtime::Spec::load(&spec_path).map_err(|e| {
            Error::InvalidArgument(format!("create: bundle {}: {e}", spec_path.display()))
        })?;
        let terminal = spec
            .process()
            .as_ref()
            .and_then(|p| p.terminal())
            .unwrap_or(false);
        if terminal != cfg.stdio.terminal {
            return Err(Error::InvalidArgument(format!(
                "create: spec says terminal={terminal} but the task asks terminal={}",
                cfg.stdio.terminal
            )));
        }
        let mut c = Container {
            id: cfg.id,
            bundle: cfg.bundle,
            runc: cfg.runc,
            no_pivot: cfg.no_pivot,
            init: Process::new("", cfg.stdio),
            execs: HashMap::new(),
            restore_from: cfg
                .checkpoint
                .or_else(|| cfg.snapshot.as_ref().and_then(Snapshot::images)),
            snapshot: cfg.snapshot,
            rootfs_mounted: false,
        };
        if let Err(e) = c.mount_rootfs(&cfg.rootfs) {
            c.unmount_rootfs();
            if let Some(s) = &c.snapshot {
                s.cleanup();
            }
            return Err(e);
        }
        if c.restore_from.is_some() {
            return Ok(c);
        }
        match c.runc_create().await {
            Ok(()) => Ok(c),
            Err(e) => {
                c.cleanup_failed_create().await;
                Err(e)
            }
        }
    }

    fn mount_rootfs(&mut self, mounts: &[Mount]) -> Result<()> {
        if mounts.is_empty() {
            return Ok(());
        }
        let rootfs = self.bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs)
            .map_err(|e| Error::io(format!("create: mkdir {}", rootfs.display()), e))?;
        for m in mounts {
            let fs_type = (!m.type_.is_empty()).then_some(m.type_.as_str());
            let source = (!m.source.is_empty()).then_some(m.source.as_str());
            mount_rootfs(fs_type, source, &m.options.to_vec(), &rootfs).map_err(|e| {
                Error::InvalidArgument(format!(
                    "create: mount rootfs {} ({}): {e}",
                    m.source, m.type_
                ))
            })?;
            self.rootfs_mounted = true;
        }
        Ok(())
    }

    fn unmount_rootfs(&mut self) {
        if !self.rootfs_mounted {
            return;
        }
        let rootfs = self.bundle.join("rootfs");
        // Layered mounts (overlay on bind, ...) come off one at a time.
        while umount2(&rootfs, MntFlags::empty()).is_ok() {}
        self.rootfs_mounted = false;
    }

    async fn runc_create(&mut self) -> Result<()> {
        let pid_file = self.bundle.join("init.pid");
        let prepared = Prepared::new(&mut self.init)?;
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
        self.unmount_rootfs();
        if let Some(s) = &self.snapshot {
            s.cleanup();
        }
    }

    /// Starts the init process (or restores the checkpoint given at create,
    /// within `deadline` when one is given).
    /// Returns true when the init pid is new (a restore).
    pub async fn start(&mut self, deadline: Option<&Deadline>) -> Result<bool> {
        if self.init.status != Status::Created {
            return Err(Error::FailedPrecondition(format!(
                "start: container {} is not in the created state",
                self.id
            )));
        }
        if let Some(image) = self.restore_from.clone() {
            self.restore(&image, deadline).await?;
            self.init.status = Status::Running;
            return Ok(true);
        }
        self.runc.start(&self.id).await?;
        self.init.status = Status::Running;
        Ok(false)
    }

    async fn restore(&mut self, image: &Path, deadline: Option<&Deadline>) -> Result<()> {
        let pid_file = self.bundle.join("init.pid");
        let work = self.bundle.join("criu-work");
        std::fs::create_dir_all(&work)
            .map_err(|e| Error::io(format!("restore: mkdir {}", work.display()), e))?;
        let prepared = Prepared::new(&mut self.init)?;
        let flags = CheckpointFlags {
            shell_job: self.init.stdio.terminal,
            ..Default::default()
        };
        let restored = self
            .runc
            .restore(
                &self.id,
                &self.bundle,
                image,
                &work,
                &pid_file,
                prepared.console_path.as_deref(),
                &flags,
                prepared.child_stdio,
                deadline,
            )
            .await;
        if restored.is_err() {
            // runc or CRIU killed mid-restore (a deadline) leave their mounts:
            // runc's criu-root, CRIU's cgroup yard in the work folder. They
            // would keep runc from removing its state and containerd the bundle.
            unmount_under(&self.runc.root.join(&self.id));
            unmount_under(&work);
            let _ = self.runc.delete(&self.id, true).await;
            // Killed before it recorded its state, runc cannot find the
            // container's cgroups to remove them: remove them here.
            if !self.runc.systemd_cgroup {
                if let Some(path) = self.cgroups_path() {
                    remove_cgroups(&path).await;
                }
            }
        }
        Prepared::finish(prepared.receive, restored, &mut self.init).await?;
        self.init.pid = read_pid(&pid_file, "restore")?;
        Ok(())
    }

    /// The spec's `linux.cgroupsPath` when it is a cgroupfs path.
    fn cgroups_path(&self) -> Option<PathBuf> {
        let spec = oci_spec::runtime::Spec::load(self.bundle.join("config.json")).ok()?;
        let path = spec.linux().as_ref()?.cgroups_path().clone()?;
        path.is_absolute().then_some(path)
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
        serde_json::from_slice::<oci_spec::runtime::Process>(process_json)
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
        if p.status != Status::Created || p.pid != 0 {
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
        p.status = Status::Running;
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
            if p.exit().is_some() && !all {
                return Err(Error::NotFound(format!(
                    "kill: container {} process already finished",
                    self.id
                )));
            }
            return self.runc.kill(&self.id, signal, all).await;
        }
        p.ensure_running("kill")?;
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| Error::InvalidArgument(format!("kill: invalid signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), sig)
            .map_err(|e| Error::io(format!("kill: exec {exec_id}"), e.into()))
    }

    /// Removes an exec that has exited or never started.
    pub fn delete_exec(&mut self, exec_id: &str) -> Result<Process> {
        let p = self.process(exec_id)?;
        if p.status == Status::Running || p.status == Status::Paused {
            return Err(Error::FailedPrecondition(format!(
                "delete: exec {exec_id} is still running"
            )));
        }
        let _ = std::fs::remove_file(self.exec_spec_path(exec_id));
        Ok(self.execs.remove(exec_id).expect("checked above"))
    }

    /// Tears the container down in runc; the caller drains stdio afterwards.
    pub async fn delete(&mut self) -> Result<()> {
        if matches!(self.init.status, Status::Running | Status::Paused) {
            return Err(Error::FailedPrecondition(format!(
                "delete: container {} is still running",
                self.id
            )));
        }
        // A never-started (or restore-pending) container may still have its
        // runc init waiting: force removes it too.
        if let Err(e) = self.runc.delete(&self.id, true).await {
            if self.restore_from.is_none() || self.init.pid != 0 {
                warn!("delete {}: {e}", self.id);
            }
        }
        for exec_id in self.execs.keys() {
            let _ = std::fs::remove_file(self.exec_spec_path(exec_id));
        }
        let _ = std::fs::remove_file(self.bundle.join("init.pid"));
        let _ = std::fs::remove_dir_all(self.bundle.join("criu-work"));
        self.unmount_rootfs();
        if let Some(s) = &self.snapshot {
            s.cleanup();
        }
        Ok(())
    }

    pub async fn checkpoint(
        &self,
        image: &Path,
        work: &Path,
        flags: &CheckpointFlags,
    ) -> Result<()> {
        self.init.ensure_running("checkpoint")?;
        self.runc.checkpoint(&self.id, image, work, flags).await
    }
}

/// Removes the (empty) cgroup `path` from every hierarchy that has it,
/// waiting a little for killed members to finish exiting. rmdir refuses a
/// cgroup that still has processes or children, so nothing in use goes.
async fn remove_cgroups(path: &Path) {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(relative)];
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        dirs.push(e.path().join(relative));
    }
    dirs.retain(|d| d.is_dir());
    for _ in 0..100 {
        dirs.retain(|d| match std::fs::remove_dir(d) {
            Ok(()) => false,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        });
        if dirs.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for d in dirs {
        warn!("cgroup {} is left: not empty", d.display());
    }
}

/// Unmounts whatever is mounted at or below `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in points {
        if let Err(e) = umount2(&p, MntFlags::MNT_DETACH) {
            warn!("unmount {}: {e}", p.display());
        }
    }
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` (octal).
fn unescape_mount_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut rest = p;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A process's stdio made ready for runc: the pipes it gets, or the console
/// socket through which runc will hand over its terminal.
struct Prepared {
    console_path: Option<PathBuf>,
    receive: Option<Receive>,
    child_stdio: Option<ChildStdio>,
}

struct Receive {
    path: PathBuf,
    task: tokio::task::JoinHandle<Result<std::fs::File>>,
}

impl Prepared {
    fn new(p: &mut Process) -> Result<Self> {
        if p.stdio.terminal {
            let console = ConsoleSocket::new()?;
            let path = console.path().to_path_buf();
            Ok(Self {
                console_path: Some(path.clone()),
                receive: Some(Receive {
                    path,
                    task: tokio::spawn(console.receive()),
                }),
                child_stdio: None,
            })
        } else {
            Ok(Self {
                console_path: None,
                receive: None,
                child_stdio: Some(stdio::pipes(&p.stdio, &p.io, &mut p.files)?),
            })
        }
    }

    /// After runc ran: take the terminal, or undo the stdio on failure.
    async fn finish(receive: Option<Receive>, ran: Result<()>, p: &mut Process) -> Result<()> {
        if let Err(e) = ran {
            if let Some(r) = receive {
                ConsoleSocket::cancel(&r.path);
                r.task.abort();
            }
            p.io.abort().await;
            return Err(e);
        }
        if let Some(r) = receive {
            let master = r
                .task
                .await
                .map_err(|e| Error::Other(format!("console: {e}")))??;
            p.pty = Some(stdio::terminal(&p.stdio, &p.io, master)?);
        }
        Ok(())
    }
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
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b/c\\134d"), "/a b/c\\d");
        assert_eq!(unescape_mount_path("/x\\y\\0"), "/x\\y\\0");
    }
}
