//! A capture's context: what its phases read and leave for the next
//! (the engine's ready message, the tree's pids, the staging dir, the
//! carried layer, the digests), and what the driver does at its ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use vsnap_artifact::rootfs::{OpenFile, RootfsLayer};
use vsnap_artifact::{Clocks, Contents, Staging, ZeroPages};
use vsnap_protocol::{files, CaptureReady, Oracle};

use crate::capture_task::Commit;
use crate::deadline::Deadline;
use crate::error::Error;
use crate::inflight::is_dead;
use crate::lifecycle::driver::{Failed, Run, Timings};
use crate::lifecycle::phase::{PhaseName, Stop};
use crate::runc::RuncVerbs;
use crate::snapshot::plan::{CapturePlan, WriteLock};
use crate::snapshot::records::journal;
use crate::snapshot::records::reports::{keep_criu_log, record_error};
use vsnap_artifact::journal::Op;

/// How long an engine that reported its failure has to exit on its own.
pub const ENGINE_EXIT_GRACE: Duration = Duration::from_secs(2);

/// How long the undo tries to remove a staging dir that a stopped phase
/// still writes into.
const STAGING_REMOVAL: Duration = Duration::from_secs(2);

/// What the engine said when it was capture-ready.
pub(super) struct Ready {
    pub(super) capture_id: String,
    /// The control-dir protocol's message (None for the barrier profile).
    pub(super) message: Option<CaptureReady>,
    pub(super) oracle: Oracle,
    pub(super) cold_start: Duration,
}

/// A capture under way: the context every phase works on.
pub struct CaptureRun {
    pub(super) id: String,
    pub(super) bundle: PathBuf,
    pub(super) runc: Arc<dyn RuncVerbs>,
    pub(super) pid: i32,
    pub(super) terminal: bool,
    /// The capture's plan (without the lock: that is `lock`).
    pub(super) plan: CapturePlan,
    pub(super) started: Instant,
    /// The capture's own hold on the artifact's exclusive lock.
    pub(super) lock: Option<WriteLock>,
    pub(super) ready: Option<Ready>,
    pub(super) pids: Vec<i32>,
    pub(super) volume_files: Vec<OpenFile>,
    pub(super) staging: Option<Staging>,
    pub(super) clocks: Option<Clocks>,
    pub(super) layer: Option<RootfsLayer>,
    pub(super) contents: Option<Contents>,
    /// What the digest phase left out of the page images.
    pub(super) zero_pages: Option<ZeroPages>,
    /// How the digest phase sealed the pages files at rest.
    pub(super) sealed: Option<vsnap_artifact::at_rest::Sealed>,
    pub(super) published: Option<PathBuf>,
    /// The phases that ran so far, as the driver timed them.
    pub(super) ran: Timings,
    /// Of the carry phase: packing the writable layer.
    pub(super) rootfs_packing: Duration,
    /// What a kill or a delete cancels it through, and what the publish
    /// asks before its rename (../../capture_task.rs).
    pub(super) commit: Arc<Commit>,
}

impl CaptureRun {
    /// The capture of the init `pid` of `id`, just started with `runc start`.
    pub fn new(
        id: &str,
        bundle: PathBuf,
        runc: Arc<dyn RuncVerbs>,
        pid: i32,
        terminal: bool,
        plan: &CapturePlan,
    ) -> Self {
        Self {
            id: id.to_string(),
            bundle,
            runc,
            pid,
            terminal,
            lock: plan.lock.clone(),
            plan: CapturePlan {
                lock: None,
                ..plan.clone()
            },
            started: Instant::now(),
            ready: None,
            pids: Vec::new(),
            volume_files: Vec::new(),
            staging: None,
            clocks: None,
            layer: None,
            contents: None,
            zero_pages: None,
            sealed: None,
            published: None,
            ran: Timings::default(),
            rootfs_packing: Duration::ZERO,
            commit: Arc::default(),
        }
    }

    /// The bound on the whole capture: each phase keeps its own (the
    /// capture timeout while waiting, the checkpoint timeout around runc,
    /// the activation timeout for the donor); this one only ends a capture
    /// wedged past all of them.
    pub fn outer_deadline(&self) -> Deadline {
        let s = &self.plan;
        let total = s.capture_timeout + s.checkpoint_timeout + s.common.activation_timeout;
        Deadline::new(
            Instant::now() + total * 2,
            format!("twice the capture's own timeouts ({}s)", total.as_secs()),
        )
    }

    /// The capture's stop: its outer deadline, or a cancel through its
    /// commit (a kill of the init, the container's delete).
    pub fn stop(&self) -> Stop {
        let mut deadline = self.outer_deadline();
        deadline.cancel = self.commit.token();
        Stop::new(deadline)
    }

    pub(super) fn ready(&self) -> &Ready {
        self.ready.as_ref().expect("the wait phase ran")
    }

    /// The capture's record in the metrics journal: its phases' times,
    /// the published artifact's size, or the phase that failed.
    pub(super) fn journal(&self, ran: &std::result::Result<Timings, Failed>) {
        let s = &self.plan;
        let timings = match ran {
            Ok(t) => t,
            Err(f) => &f.timings,
        };
        let mut record = journal::outcome(
            Op::Capture,
            s.common.artifact.as_str(),
            self.started.elapsed(),
        );
        for (phase, took) in timings.entries() {
            record = record.phase(phase.slug(), took.as_secs_f64());
        }
        if let Err(f) = ran {
            record = record.failed_in(f.phase.slug());
        }
        let (root, published) = (s.common.root.clone(), self.published.clone());
        tokio::task::spawn_blocking(move || {
            let mut record = record;
            if let Some(dir) = published {
                record.bytes = vsnap_artifact::layout::bytes_under(&dir);
            }
            journal::record_now(&root, &record);
        });
    }

    pub(super) fn staging(&self) -> &Staging {
        self.staging.as_ref().expect("the checkpoint phase ran")
    }
}

#[async_trait]
impl Run for CaptureRun {
    fn release_lock(&mut self) {
        drop(self.lock.take());
    }

    fn ran(&mut self, phase: PhaseName, took: Duration) {
        self.ran.add(phase, took);
    }

    fn record_error(&mut self, phase: PhaseName, e: &Error) {
        // CRIU's log is in the staging folder, which goes with the abort.
        let kept = self.staging.as_ref().and_then(|st| {
            keep_criu_log(
                &self.plan.common.root,
                self.plan.common.artifact.as_str(),
                &self.id,
                "dump",
                &st.work().join("dump.log"),
            )
        });
        record_error(
            &self.bundle,
            &self.id,
            Some(phase.as_str()),
            e,
            kept.as_deref(),
        );
    }

    /// The task is killed so that it exits non-zero; the staging dir goes
    /// with its Drop (nothing half published). An engine that reported its
    /// failure (`error.json`) is given [`ENGINE_EXIT_GRACE`] to exit with
    /// its own code first, as a real one tears its workers down; not one
    /// whose capture was cancelled (its container is being stopped).
    async fn abort(&mut self, _: PhaseName, e: &Error) {
        remove_staging(self.staging.take()).await;
        let reported = self.plan.common.control_dir.join(files::ERROR);
        if reported.exists() && !matches!(e, Error::Cancelled(_)) {
            let until = Instant::now() + ENGINE_EXIT_GRACE;
            while !is_dead(self.pid) && Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let _ = self.runc.kill(&self.id, libc::SIGKILL as u32, true).await;
    }
}

/// The staging dir removed, also while a stopped phase's blocking work
/// (carry, digest), no longer waited for, still writes into it: a file it
/// creates during the removal fails it (ENOTEMPTY), and once the folder is
/// gone nothing can be created under it again.
async fn remove_staging(staging: Option<Staging>) {
    let Some(staging) = staging else { return };
    let dir = staging.dir.clone();
    drop(staging);
    let until = Instant::now() + STAGING_REMOVAL;
    while dir.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
