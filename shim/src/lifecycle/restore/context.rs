//! A restore's context: what its phases read and leave for the next (the
//! runc restore job, the verification, the restored init's pid, the
//! times), taken from the container when the restore begins, and what the
//! driver does at its ends.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use log::info;

use super::job::{MemoryWatch, RestoreJob};
use super::verify::Verify;
use crate::container::{ColdWay, Container, CopyExit};
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::exits::Mark;
use crate::init_start::{InitStart, RestoreSource};
use crate::lifecycle::driver::{Failed, Run, Timings};
use crate::lifecycle::phase::{PhaseName, Stop};
use crate::lifecycle::plain;
use crate::runc::CheckpointFlags;
use crate::shared::{ContainerRef, Shared};
use crate::snapshot::plan::fallback;
use crate::snapshot::plan::refusal::{start_cause, Cause};
use crate::snapshot::plan::{ReadLock, RestorePlan, WriteLock};
use crate::snapshot::store::records::{keep_criu_log, record_error, RestoreTimings};
use crate::snapshot::{criu as criu_flags, criu::memory, store::journal};
use vsnap_artifact::journal::Op;
use vsnap_pages::PagePlan;

/// How long a restore of a checkpoint given by containerd (no plan, so no
/// activation timeout) may take before it is given up.
const CHECKPOINT_RESTORE_LIMIT: Duration = Duration::from_secs(3600);

/// What decides a restore's phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// containerd's checkpoint: no plan, no activation.
    Checkpoint,
    Snapshot {
        gpu: bool,
    },
}

/// Where the phases spent their time (RestoreTimings is the record).
#[derive(Default)]
pub(super) struct Times {
    pub(super) verify: Duration,
    pub(super) criu_restore: Duration,
    pub(super) activation: Duration,
    pub(super) listener: Duration,
}

/// A restore under way: the start's context every phase works on.
pub struct RestoreRun {
    pub(super) shared: Shared,
    pub(super) handle: ContainerRef,
    pub(super) mark: Mark,
    pub(super) id: String,
    pub(super) bundle: PathBuf,
    pub(super) job: RestoreJob,
    /// The artifact's plan, for a snapshot restore (without the lock:
    /// that is `lock`); None for containerd's checkpoint.
    pub(super) plan: Option<RestorePlan>,
    /// The container's hold on the artifact lock, taken at begin.
    pub(super) lock: Option<ReadLock>,
    /// The verification not yet started (beside CRIU or first).
    pub(super) verify: Option<Verify>,
    pub(super) stop: Stop,
    pub(super) times: Times,
    /// `runc restore` was started, and (after a failure) its leftovers
    /// were undone already.
    pub(super) criu_started: bool,
    pub(super) criu_undone: bool,
    pub(super) pid: i32,
    /// Under `auto`, the pid of the cold start the failed restore became.
    pub(super) cold_pid: Option<i32>,
}

impl RestoreRun {
    /// The restore of `c` begins: its init becomes Restoring, its stdio is
    /// made ready, and everything the phases need is taken from it.
    pub fn begin(
        c: &mut Container,
        shared: Shared,
        handle: ContainerRef,
        mark: Mark,
    ) -> Result<Self> {
        let image = c.start.images().ok_or_else(|| {
            Error::FailedPrecondition(format!("start: container {} has no checkpoint", c.id))
        })?;
        let (mut plan, lock) = match &mut c.start {
            // The container's hold on the lock is the restore's from now.
            InitStart::Restore(RestoreSource::Artifact(r)) => {
                let lock = r.lock.take();
                (Some(r.as_ref().clone()), lock)
            }
            _ => (None, None),
        };
        let deadline = match &plan {
            Some(r) => r.common.activation_deadline(),
            None => Deadline::new(
                Instant::now() + CHECKPOINT_RESTORE_LIMIT,
                "the checkpoint restore limit of 3600s",
            ),
        };
        let verify = plan.as_ref().and_then(Verify::of);
        // The page plan goes to the job whole.
        let pages = plan.as_mut().and_then(|p| p.pages.take());
        let job = restore_job(c, image, plan.as_ref(), pages, &deadline)?;
        Ok(Self {
            shared,
            handle,
            mark,
            id: c.id.clone(),
            bundle: c.bundle.clone(),
            job,
            plan,
            lock,
            verify,
            stop: Stop::new(deadline),
            times: Times::default(),
            criu_started: false,
            criu_undone: false,
            pid: 0,
            cold_pid: None,
        })
    }

    /// What decides the phases: a checkpoint, or a snapshot with or without GPUs.
    pub(super) fn kind(&self) -> Kind {
        match &self.plan {
            Some(s) => Kind::Snapshot {
                gpu: !s.common.gpus.is_empty(),
            },
            None => Kind::Checkpoint,
        }
    }

    /// `vsnap-restore.json` in the bundle, and the restore's record in the
    /// metrics journal.
    pub(super) fn record_timings(&self, phases: &Timings) {
        let Some(s) = &self.plan else { return };
        let timings = RestoreTimings {
            create_began: s.create_began,
            preflight: s.preflight,
            verify: self.times.verify,
            criu_restore: self.times.criu_restore,
            activation: self.times.activation,
            listener: self.times.listener,
            rootfs: s.rootfs_unpack,
            pages: self.job.placed,
        };
        info!(
            "{}: restored copy validated and listening: {timings:?}",
            self.id
        );
        timings.record(&self.bundle);
        let total =
            s.preflight + s.rootfs_unpack + phases.entries().map(|(_, d)| d).sum::<Duration>();
        let secs = |d: Duration| d.as_secs_f64();
        let record = journal::outcome(Op::Restore, s.common.artifact.as_str(), total)
            .phase("preflight", secs(timings.preflight))
            .phase("rootfs", secs(timings.rootfs))
            .phase("verify", secs(timings.verify))
            .phase("criu", secs(timings.criu_restore))
            .phase("activation", secs(timings.activation))
            .phase("listener", secs(timings.listener));
        journal::record(&s.common.root, record);
    }

    /// A failed restore's record in the metrics journal: the phase that
    /// failed and the times of those that ran.
    pub(super) fn journal_failure(&self, failed: &Failed) {
        let Some(s) = &self.plan else { return };
        let ran = failed.timings.entries();
        let total = s.preflight + s.rootfs_unpack + ran.map(|(_, d)| d).sum::<Duration>();
        let mut record = journal::outcome(Op::Restore, s.common.artifact.as_str(), total)
            .failed_in(failed.phase.slug());
        for (phase, took) in failed.timings.entries() {
            record = record.phase(phase.slug(), took.as_secs_f64());
        }
        journal::record(&s.common.root, record);
    }
}

impl RestoreRun {
    /// Under `auto`, the cause of a failure that is the artifact's (it is
    /// set aside, plan/fallback.rs); None: the failure stands as it is.
    fn artifact_cause(&self, phase: PhaseName, e: &Error) -> Option<Cause> {
        self.plan.as_ref().filter(|p| p.auto)?;
        Some(start_cause(phase.slug(), e)).filter(|c| c.sets_aside())
    }

    /// The artifact set aside before Start answers, so that no later start
    /// runs into it again; the exclusive lock it was set aside under.
    async fn set_aside(&self, cause: Cause, e: &Error) -> Option<WriteLock> {
        let plan = self.plan.as_ref()?;
        let (root, name) = (plan.common.root.clone(), plan.common.artifact.to_string());
        let (id, bundle, message) = (self.id.clone(), self.bundle.clone(), e.to_string());
        tokio::task::spawn_blocking(move || {
            fallback::after_start(&root, &name, &id, &bundle, cause, &message)
        })
        .await
        .ok()
        .flatten()
    }

    /// The failed restore given up for a cold start in the same Start
    /// (`auto`, a failure of the artifact's, where the plan allows it;
    /// what the restore left, the copy too, is gone): the init created
    /// again and started as a create would have, capturing the artifact
    /// anew where `lock` (the one it was set aside under) allows. The pid,
    /// or why not (then Start fails as without it).
    async fn go_on_cold(
        &mut self,
        c: &mut Container,
        failed: &Error,
        lock: Option<WriteLock>,
    ) -> Result<i32> {
        let Some(mut cold) = self.plan.as_mut().and_then(|p| p.cold.take()) else {
            return Err(Error::FailedPrecondition("no cold start planned".into()));
        };
        let (way, how) = match (cold.capture.take(), lock) {
            (Some(capture), Some(lock)) => (ColdWay::Capture(capture, lock), "cold, capturing"),
            _ => (ColdWay::Plain, "cold, without a capture"),
        };
        let stdio = self.job.spare_stdio.take();
        if let Err(e) = c.create_cold(&cold, way, stdio).await {
            c.cold_start_failed().await;
            return Err(e);
        }
        self.shared.watch(&c.id, "", c.init.pid, self.mark);
        let pid = match plain::start(&self.shared, c).await {
            Ok(pid) => pid,
            Err(e) => {
                // Nothing of it runs: Start fails as the restore did.
                c.cold_start_failed().await;
                c.init.pid = 0;
                return Err(e);
            }
        };
        log::warn!(
            "{}: auto: the restore failed ({failed}); this start went on {how} (pid {pid})",
            self.id
        );
        fallback::record_start(&self.bundle, how);
        Ok(pid)
    }
}

#[async_trait]
impl Run for RestoreRun {
    fn release_lock(&mut self) {
        drop(self.lock.take());
    }

    fn record_error(&mut self, phase: PhaseName, e: &Error) {
        // CRIU's log is in the bundle, which goes with the task.
        let kept = match (&self.plan, self.criu_started) {
            (Some(s), true) => keep_criu_log(
                &s.common.root,
                s.common.artifact.as_str(),
                &self.id,
                "restore",
                &self.job.work.join("restore.log"),
            ),
            _ => None,
        };
        record_error(
            &self.bundle,
            &self.id,
            Some(phase.as_str()),
            e,
            kept.as_deref(),
        );
    }

    /// Nothing of a failed restore runs or is seen: runc's and CRIU's
    /// leftovers go when the CRIU phase did not undo them itself; the copy
    /// is killed (its exit comes through the reaper) or, with no process,
    /// the init is recorded as killed and its exit published here.
    async fn abort(&mut self, phase: PhaseName, e: &Error) {
        let cause = self.artifact_cause(phase, e);
        let cold = cause.is_some() && self.plan.as_ref().is_some_and(|p| p.may_go_cold());
        if cold {
            // The copy's exit is no longer the container's: a new init
            // takes its place (shared.watch compares the pid).
            let mut c = self.handle.lock().await;
            c.init.pid = 0;
            c.copy_exit = CopyExit::Publish;
        }
        if self.criu_started && !self.criu_undone && (cold || self.pid == 0) {
            self.job.undo().await;
            self.criu_undone = true;
        }
        let lock = match cause {
            Some(cause) => self.set_aside(cause, e).await,
            None => None,
        };
        let handle = self.handle.clone();
        let mut c = handle.lock().await;
        c.starting = None;
        if cold {
            match self.go_on_cold(&mut c, e, lock).await {
                Ok(pid) => {
                    self.cold_pid = Some(pid);
                    return;
                }
                Err(cold) => {
                    log::warn!("{}: auto: no cold start after the restore: {cold}", self.id)
                }
            }
        }
        drop(self.job.spare_stdio.take());
        if let Some(exit) = c.release_exit() {
            self.shared.publish_exit(&c.id, "", c.init.pid, exit).await;
        }
        if let Some(exit) = c.start_failed().await {
            self.shared.publish_exit(&c.id, "", 0, exit).await;
        }
    }
}

/// The `runc restore` job of `c`'s init, its stdio made ready (the init is
/// Restoring from here). Where vsnap's page server places the memory,
/// `pages` is its plan (it hashes the pages files it checks as it places
/// them: the verification leaves them to it).
fn restore_job(
    c: &mut Container,
    image: PathBuf,
    plan: Option<&RestorePlan>,
    pages: Option<PagePlan>,
    deadline: &Deadline,
) -> Result<RestoreJob> {
    let work = c.bundle.join("criu-work");
    std::fs::create_dir_all(&work)
        .map_err(|e| Error::io(format!("restore: mkdir {}", work.display()), e))?;
    let prepared = c.begin_restore(deadline.cancel.clone())?;
    let spec = &c.cgroup_spec;
    let cgroups_path = c.cgroups_path();
    Ok(RestoreJob {
        id: c.id.clone(),
        bundle: c.bundle.clone(),
        runc: c.runc.clone(),
        image,
        work,
        pid_file: c.pid_file(),
        // A snapshot restore takes the options its capture used.
        flags: match plan {
            Some(_) => criu_flags::snapshot_flags(c.init.stdio.terminal),
            None => CheckpointFlags {
                shell_job: c.init.stdio.terminal,
                ..Default::default()
            },
        },
        memory: MemoryWatch {
            cgroup: memory::cgroup_of(spec),
            may_make: cgroups_path.is_some() && !c.runc.systemd_cgroup(),
            limit: memory::limit_of(spec),
            need: plan.and_then(|r| r.memory),
        },
        cgroups_path,
        prepared: Some(prepared),
        keep_stdio: plan.is_some_and(|r| r.may_go_cold()),
        spare_stdio: None,
        pages,
        placed: None,
        // Its own token below the kill's: the verification stops CRIU
        // with it on damage, which is not a kill of the start.
        deadline: Deadline {
            cancel: deadline.cancel.child_token(),
            ..deadline.clone()
        },
    })
}
