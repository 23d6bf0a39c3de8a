//! How a container's init starts, resolved once at create: each variant
//! holds only what its start needs.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::snapshot::plan::{CapturePlan, Common, PreparedPlan, RestorePlan};

/// How a container's init starts, chosen at create from the request's
/// checkpoint and the snapshot plan (annotations, labels, config).
#[derive(Debug)]
pub enum InitStart {
    /// `runc start`, as containerd's runc shim.
    Plain,
    /// `runc start`, then, once the engine is capture-ready, the capture
    /// (in the background: a cold start can take minutes).
    Capture(Box<CapturePlan>),
    /// `runc restore` at Start.
    Restore(RestoreSource),
}

/// What a restore starts from.
#[derive(Debug)]
pub enum RestoreSource {
    /// The checkpoint containerd gave at create (`ctr run --checkpoint`,
    /// `ctr task restore`): no activation.
    Checkpoint(PathBuf),
    /// A vsnap artifact, then its activation: visible only once the copy
    /// reproduced its canary.
    Artifact(Box<RestorePlan>),
    /// An artifact's restore begun: its run took the plan (moved, with the
    /// lock); the container keeps the control dir it removes at delete.
    Begun { control_dir: PathBuf },
}

/// What a restore's run takes from the container at Start.
pub enum Taken {
    Checkpoint(PathBuf),
    Artifact(Box<RestorePlan>),
}

impl InitStart {
    /// The start of a task created with `checkpoint` (containerd's) and
    /// `prepared` (the plan prepared at create). Both at once is refused:
    /// a checkpoint restore has no canary to hold the copy to.
    pub fn resolve(checkpoint: Option<PathBuf>, prepared: Option<PreparedPlan>) -> Result<Self> {
        match (checkpoint, prepared) {
            (Some(image), None) => Ok(InitStart::Restore(RestoreSource::Checkpoint(image))),
            (Some(image), Some(p)) => {
                p.cleanup();
                Err(Error::InvalidArgument(format!(
                    "create: the task is created from checkpoint {} and has the snapshot plan of artifact {}: \
                     restore one or the other (drop the checkpoint, or the vsnap.io/plan annotation)",
                    image.display(),
                    p.common().artifact
                )))
            }
            (None, None) => Ok(InitStart::Plain),
            (None, Some(PreparedPlan::Restore(r))) => {
                Ok(InitStart::Restore(RestoreSource::Artifact(r)))
            }
            (None, Some(PreparedPlan::Capture(c))) => Ok(InitStart::Capture(c)),
        }
    }

    /// The snapshot plan's shared part, for a capture or a snapshot restore.
    pub fn common(&self) -> Option<&Common> {
        match self {
            InitStart::Capture(c) => Some(&c.common),
            InitStart::Restore(RestoreSource::Artifact(r)) => Some(&r.common),
            _ => None,
        }
    }

    /// What a restore starts from, taken for its run: the artifact's plan
    /// moves out (the container keeps its control dir); a checkpoint's
    /// images are named. None: nothing to restore (not a restore, or one
    /// begun already).
    pub fn take_restore(&mut self) -> Option<Taken> {
        let InitStart::Restore(source) = self else {
            return None;
        };
        match source {
            RestoreSource::Checkpoint(image) => Some(Taken::Checkpoint(image.clone())),
            RestoreSource::Begun { .. } => None,
            RestoreSource::Artifact(r) => {
                let control_dir = r.common.control_dir.clone();
                let begun = RestoreSource::Begun { control_dir };
                match std::mem::replace(source, begun) {
                    RestoreSource::Artifact(plan) => Some(Taken::Artifact(plan)),
                    _ => None,
                }
            }
        }
    }

    /// The shared root folder an artifact's restore runs on a private bind
    /// of (`RestorePlan::shared_root`).
    pub fn shared_root(&self) -> Option<&std::path::Path> {
        match self {
            InitStart::Restore(RestoreSource::Artifact(r)) => r.shared_root.as_deref(),
            _ => None,
        }
    }

    /// Whether Start runs `runc restore` (not `runc create` at create).
    pub fn restores(&self) -> bool {
        matches!(self, InitStart::Restore(_))
    }

    /// Removes what the plan prepared at create (its control dir).
    pub fn cleanup(&self) {
        match self {
            InitStart::Restore(RestoreSource::Begun { control_dir }) => {
                crate::snapshot::remove_control_dir(control_dir)
            }
            _ => {
                if let Some(c) = self.common() {
                    c.cleanup();
                }
            }
        }
    }

    /// Lets go of the container's hold on the artifact lock (idempotent).
    pub fn release_lock(&mut self) {
        match self {
            InitStart::Capture(c) => drop(c.lock.take()),
            InitStart::Restore(RestoreSource::Artifact(r)) => drop(r.lock.take()),
            _ => {}
        }
    }
}
