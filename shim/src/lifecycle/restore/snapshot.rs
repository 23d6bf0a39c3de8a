//! An artifact's restore: its plan, moved out of the container when the
//! restore begins (with the container's hold on the artifact lock), the
//! verification not yet started, and what it leaves when it ends: its
//! timings in the bundle and its record in the metrics journal, in the
//! driver's phase names whether it succeeded or failed.

use std::path::Path;
use std::time::Duration;

use log::info;

use super::context::{RestoreRun, Source};
use super::job::RestoreJob;
use super::verify::Verify;
use crate::deadline::Deadline;
use crate::init_start::{InitStart, RestoreSource};
use crate::lifecycle::driver::{Failed, Timings};
use crate::lifecycle::phase::PhaseName;
use crate::runc::CheckpointFlags;
use crate::snapshot::criu;
use crate::snapshot::plan::{ReadLock, RestorePlan};
use crate::snapshot::records::journal;
use crate::snapshot::records::reports::RestoreTimings;
use vsnap_artifact::journal::Op;

/// An artifact's restore under way.
pub struct Snapshot {
    /// The artifact's plan (without the lock: that is `lock`).
    pub(super) plan: RestorePlan,
    /// The container's hold on the artifact lock, taken at begin.
    pub(super) lock: Option<ReadLock>,
    /// The verification not yet started (beside CRIU or first).
    pub(super) verify: Option<Verify>,
    /// How long the verification took (inside the CRIU phase or first).
    pub(super) verify_took: Duration,
    /// Of the activation: from the canary's match to the port listening.
    pub(super) listener: Duration,
    /// Under `auto`, the pid of the cold start the failed restore became.
    pub(super) cold_pid: Option<i32>,
}

impl Snapshot {
    /// The restore of `plan` and its deadline (the activation timeout, from now).
    pub fn take(mut plan: RestorePlan) -> (Self, Deadline) {
        let lock = plan.lock.take();
        let deadline = plan.common.activation_deadline();
        let verify = Verify::of(&plan);
        let snapshot = Self {
            plan,
            lock,
            verify,
            verify_took: Duration::ZERO,
            listener: Duration::ZERO,
            cold_pid: None,
        };
        (snapshot, deadline)
    }

    /// The plan back as the container's start, its lock with it: for a
    /// restore that could not begin.
    pub fn give_back(self) -> InitStart {
        let mut plan = self.plan;
        plan.lock = self.lock;
        InitStart::Restore(RestoreSource::Artifact(Box::new(plan)))
    }

    /// The options its capture used, which a restore must repeat.
    pub fn criu_flags(&self, terminal: bool) -> CheckpointFlags {
        criu::options::flags(self.plan.criu.as_ref(), terminal)
    }

    /// What the job needs of the plan: vsnap's page server's plan, moved
    /// whole, where it places the memory (it hashes the pages files it
    /// checks as it places them: the verification left them to it), the
    /// memory the tree held, and the stdio kept where the start may go on
    /// cold.
    pub fn equip(&mut self, job: &mut RestoreJob) {
        job.memory.need = self.plan.memory;
        job.keep_stdio = self.plan.may_go_cold();
        job.pages = self.plan.pages.take();
        job.sealed = self.plan.sealed.clone();
    }

    /// Whether the artifact holds GPU state (its restore verifies first
    /// and checks the GPUs resumed).
    pub fn gpu(&self) -> bool {
        !self.plan.common.gpus.is_empty()
    }
}

impl Source for Snapshot {
    fn verify_beside_criu(&mut self) -> Option<Verify> {
        self.verify.take()
    }

    fn host_shm(&self) -> Option<&Path> {
        self.plan.common.host_shm.as_deref()
    }

    fn may_go_cold(&self) -> bool {
        self.plan.may_go_cold()
    }

    fn hostname(&self) -> Option<&str> {
        self.plan.hostname.as_deref()
    }

    fn left_stopped(&self) -> bool {
        true
    }

    fn verified(&mut self, took: Duration) {
        self.verify_took += took;
    }
}

impl RestoreRun<Snapshot> {
    /// `vsnap-restore.json` in the bundle, and the restore's record in the
    /// metrics journal: the create's phases, then the driver's.
    pub(super) fn record_timings(&self, phases: &Timings) {
        let s = &self.source;
        let timings = RestoreTimings {
            create_began: s.plan.create_began,
            preflight: s.plan.preflight,
            verify: s.verify_took,
            criu_restore: phases.of(PhaseName::CriuRestore),
            activation: phases.of(PhaseName::Activation).saturating_sub(s.listener),
            listener: s.listener,
            rootfs: s.plan.rootfs_unpack,
            pages: self.job.placed,
            criu_began: self.job.criu_began,
        };
        info!(
            "{}: restored copy validated and listening: {timings:?}",
            self.id
        );
        timings.record(&self.bundle);
        self.journal(phases, None);
    }

    /// A failed restore's record in the metrics journal: the phase that
    /// failed and the times of those that ran.
    pub(super) fn journal_failure(&self, failed: &Failed) {
        self.journal(&failed.timings, Some(failed.phase));
    }

    /// The journal's record: the create's two phases (`preflight`,
    /// `rootfs`), then each phase the driver ran, by its slug.
    fn journal(&self, phases: &Timings, failed: Option<PhaseName>) {
        let p = &self.source.plan;
        let ran: Duration = phases.entries().map(|(_, d)| d).sum();
        let total = p.preflight + p.rootfs_unpack + ran;
        let mut record = journal::outcome(Op::Restore, p.common.artifact.as_str(), total)
            .phase("preflight", p.preflight.as_secs_f64())
            .phase("rootfs", p.rootfs_unpack.as_secs_f64());
        for (phase, took) in phases.entries() {
            record = record.phase(phase.slug(), took.as_secs_f64());
        }
        if let Some(phase) = failed {
            record = record.failed_in(phase.slug());
        }
        journal::record(&p.common.root, record);
    }
}
