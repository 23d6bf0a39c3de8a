//! The end of a failed artifact restore: under `auto`, a failure that is
//! the artifact's sets it aside (plan/fallback.rs) and, where the plan
//! allows, the same Start goes on as a cold start of the container's own
//! spec (capturing the artifact anew under the lock it was set aside
//! under); otherwise nothing of the restore runs or is seen and Start
//! fails once. What the restore left, the copy too, is gone either way.

use async_trait::async_trait;

use super::context::RestoreRun;
use super::snapshot::Snapshot;
use crate::container::{ColdWay, Container, CopyExit};
use crate::error::{Error, Result};
use crate::lifecycle::driver::Run;
use crate::lifecycle::phase::PhaseName;
use crate::lifecycle::plain;
use crate::snapshot::plan::fallback;
use crate::snapshot::plan::refusal::{start_cause, Cause};
use crate::snapshot::plan::WriteLock;
use crate::snapshot::records::reports::{keep_criu_log, record_error};

/// What becomes of a restore that failed in `phase` with `e`.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// The failure stands: Start fails once, the artifact stays.
    Fails,
    /// The artifact is set aside for `Cause`; Start fails once.
    SetAside(Cause),
    /// The artifact is set aside and the same Start goes on cold.
    GoesCold(Cause),
}

/// The decision, from the plan (`auto`, whether a cold start is planned)
/// and the failure alone.
pub fn after_failure(auto: bool, may_go_cold: bool, phase: PhaseName, e: &Error) -> AfterFailure {
    if !auto {
        return AfterFailure::Fails;
    }
    match start_cause(phase.slug(), e) {
        // Nothing of the artifact is here to set aside.
        Cause::Stream if may_go_cold => AfterFailure::GoesCold(Cause::Stream),
        c if !c.sets_aside() => AfterFailure::Fails,
        c if may_go_cold => AfterFailure::GoesCold(c),
        c => AfterFailure::SetAside(c),
    }
}

impl RestoreRun<Snapshot> {
    /// The artifact set aside before Start answers, so that no later start
    /// runs into it again; the exclusive lock it was set aside under.
    async fn set_aside(&self, cause: Cause, e: &Error) -> Option<WriteLock> {
        let common = &self.source.plan.common;
        let (root, name) = (common.root.clone(), common.artifact.to_string());
        let (id, bundle, message) = (self.id.clone(), self.bundle.clone(), e.to_string());
        tokio::task::spawn_blocking(move || {
            fallback::after_start(&root, &name, &id, &bundle, cause, &message)
        })
        .await
        .ok()
        .flatten()
    }

    /// The failed restore given up for a cold start in the same Start: the
    /// init created again and started as a create would have, capturing
    /// the artifact anew where `lock` allows. The pid, or why not (then
    /// Start fails as without it).
    async fn go_on_cold(
        &mut self,
        c: &mut Container,
        failed: &Error,
        lock: Option<WriteLock>,
    ) -> Result<i32> {
        let Some(mut cold) = self.source.plan.cold.take() else {
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
impl Run for RestoreRun<Snapshot> {
    fn release_lock(&mut self) {
        drop(self.source.lock.take());
    }

    /// A pull this restore streamed from publishes nothing when the
    /// failure sets the artifact aside (before it was even published):
    /// told before the lock, its gate, goes.
    fn give_up(&mut self, phase: PhaseName, e: &Error) {
        let plan = &self.source.plan;
        if let AfterFailure::SetAside(c) | AfterFailure::GoesCold(c) =
            after_failure(plan.auto, plan.may_go_cold(), phase, e)
        {
            if let (true, Some(lock)) = (c.sets_aside(), &self.source.lock) {
                lock.abandon();
            }
        }
    }

    fn record_error(&mut self, phase: PhaseName, e: &Error) {
        // CRIU's log is in the bundle, which goes with the task.
        let common = &self.source.plan.common;
        let kept = self.criu_started.then(|| {
            keep_criu_log(
                &common.root,
                common.artifact.as_str(),
                &self.id,
                "restore",
                &self.job.work.join("restore.log"),
            )
        });
        let kept = kept.flatten();
        record_error(
            &self.bundle,
            &self.id,
            Some(phase.as_str()),
            e,
            kept.as_deref(),
        );
    }

    /// Nothing of a failed restore runs or is seen (its leftovers go, the
    /// copy is killed or its exit published) unless the start goes on cold.
    async fn abort(&mut self, phase: PhaseName, e: &Error) {
        let plan = &self.source.plan;
        let after = after_failure(plan.auto, plan.may_go_cold(), phase, e);
        let cold = matches!(after, AfterFailure::GoesCold(_));
        if cold {
            // The copy's exit is no longer the container's: a new init
            // takes its place (shared.watch compares the pid).
            let mut c = self.handle.lock().await;
            c.init.pid = 0;
            c.copy_exit = CopyExit::Publish;
        }
        self.undo_criu(cold).await;
        let lock = match after {
            AfterFailure::SetAside(cause) | AfterFailure::GoesCold(cause) => {
                self.set_aside(cause, e).await
            }
            AfterFailure::Fails => None,
        };
        let handle = self.handle.clone();
        let mut c = handle.lock().await;
        c.starting = None;
        if cold {
            match self.go_on_cold(&mut c, e, lock).await {
                Ok(pid) => {
                    self.source.cold_pid = Some(pid);
                    return;
                }
                Err(cold) => {
                    log::warn!("{}: auto: no cold start after the restore: {cold}", self.id)
                }
            }
        }
        self.fail_start(&mut c).await;
    }
}
