//! A restore's context: what its phases read and leave for the next (the
//! runc restore job, the restored init's pid, the times), over its source
//! ([`Checkpoint`], or an artifact's [`Snapshot`](super::snapshot::Snapshot),
//! its plan moved out of the container when the restore begins), and what
//! the driver does at the ends of a checkpoint's restore.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

use super::job::{MemoryWatch, RestoreJob};
use super::verify::Verify;
use crate::container::Container;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::exits::Mark;
use crate::lifecycle::driver::Run;
use crate::lifecycle::phase::{PhaseName, Stop};
use crate::runc::CheckpointFlags;
use crate::shared::{ContainerRef, Shared};
use crate::snapshot::criu::memory;
use crate::snapshot::records::reports::record_error;

/// What the phases every restore runs (CRIU, the restored init) ask of
/// its source; a checkpoint's answers are the defaults.
pub trait Source: Send + 'static {
    /// The verification that runs beside CRIU, taken (none: nothing to
    /// verify, or it runs first).
    fn verify_beside_criu(&mut self) -> Option<Verify> {
        None
    }
    /// The host /dev/shm folder whose link remaps CRIU opened.
    fn host_shm(&self) -> Option<&std::path::Path> {
        None
    }
    /// Should the copy fail, the start may go on cold (`auto`).
    fn may_go_cold(&self) -> bool {
        false
    }
    /// The hostname the copy's own UTS namespace gets before it runs.
    fn hostname(&self) -> Option<&str> {
        None
    }
    /// CRIU left the restored tree stopped: it is let run once taken.
    fn left_stopped(&self) -> bool {
        false
    }
    /// The verification took `took` (beside CRIU or first).
    fn verified(&mut self, _took: Duration) {}
}

/// containerd's checkpoint (`ctr run --checkpoint`): no plan, no activation.
pub struct Checkpoint;

impl Source for Checkpoint {}

/// A restore under way: the start's context every phase works on.
pub struct RestoreRun<S> {
    pub(super) shared: Shared,
    pub(super) handle: ContainerRef,
    pub(super) mark: Mark,
    pub(super) id: String,
    pub(super) bundle: PathBuf,
    pub(super) job: RestoreJob,
    pub(super) stop: Stop,
    /// `runc restore` was started, and (after a failure) its leftovers
    /// were undone already.
    pub(super) criu_started: bool,
    pub(super) criu_undone: bool,
    pub(super) pid: i32,
    /// What it restores from.
    pub(super) source: S,
}

impl<S: Source> RestoreRun<S> {
    pub(super) fn new(
        c: &Container,
        (shared, handle, mark): (Shared, ContainerRef, Mark),
        job: RestoreJob,
        deadline: Deadline,
        source: S,
    ) -> Self {
        Self {
            shared,
            handle,
            mark,
            id: c.id.clone(),
            bundle: c.bundle.clone(),
            job,
            stop: Stop::new(deadline),
            criu_started: false,
            criu_undone: false,
            pid: 0,
            source,
        }
    }

    /// runc's and CRIU's leftovers undone, once, where the CRIU phase did
    /// not undo them itself and either nothing of the copy runs or it
    /// must go (`must_go`: the start goes on cold).
    pub(super) async fn undo_criu(&mut self, must_go: bool) {
        if self.criu_started && !self.criu_undone && (must_go || self.pid == 0) {
            self.job.undo().await;
            self.criu_undone = true;
        }
    }

    /// The failed start's exit published: the copy's, held until now, or,
    /// with no process, the init recorded as killed.
    pub(super) async fn fail_start(&mut self, c: &mut Container) {
        drop(self.job.spare_stdio.take());
        if let Some(exit) = c.release_exit() {
            self.shared.publish_exit(&c.id, "", c.init.pid, exit).await;
        }
        if let Some(exit) = c.start_failed().await {
            self.shared.publish_exit(&c.id, "", 0, exit).await;
        }
    }
}

#[async_trait]
impl Run for RestoreRun<Checkpoint> {
    fn release_lock(&mut self) {}

    fn record_error(&mut self, phase: PhaseName, e: &Error) {
        record_error(&self.bundle, &self.id, Some(phase.as_str()), e, None);
    }

    /// Nothing of a failed restore runs or is seen: runc's and CRIU's
    /// leftovers go when the CRIU phase did not undo them itself; the copy
    /// is killed (its exit comes through the reaper) or, with no process,
    /// the init is recorded as killed and its exit published here.
    async fn abort(&mut self, _: PhaseName, _: &Error) {
        self.undo_criu(false).await;
        let handle = self.handle.clone();
        let mut c = handle.lock().await;
        c.starting = None;
        self.fail_start(&mut c).await;
    }
}

/// The `runc restore` job of `c`'s init, its stdio made ready (the init is
/// Restoring from here).
pub(super) fn restore_job(
    c: &mut Container,
    image: PathBuf,
    flags: CheckpointFlags,
    deadline: &Deadline,
) -> Result<RestoreJob> {
    let work = c.bundle.join("criu-work");
    std::fs::create_dir_all(&work)
        .map_err(|e| Error::io(format!("restore: mkdir {}", work.display()), e))?;
    let prepared = c.begin_restore(deadline.cancel.clone())?;
    let spec = c.spec.value();
    let cgroups_path = c.cgroups_path();
    Ok(RestoreJob {
        id: c.id.clone(),
        bundle: c.bundle.clone(),
        runc: c.runc.clone(),
        image,
        work,
        pid_file: c.pid_file(),
        flags,
        memory: MemoryWatch {
            cgroup: memory::cgroup_of(spec),
            may_make: cgroups_path.is_some() && !c.runc.systemd_cgroup(),
            limit: memory::limit_of(spec),
            need: None,
        },
        cgroups_path,
        prepared: Some(prepared),
        keep_stdio: false,
        spare_stdio: None,
        pages: None,
        sealed: None,
        placed: None,
        criu_began: None,
        // Its own token below the kill's: the verification stops CRIU
        // with it on damage, which is not a kill of the start.
        deadline: Deadline {
            cancel: deadline.cancel.child_token(),
            ..deadline.clone()
        },
    })
}
