//! How a container's init starts, resolved once at create: each variant
//! holds only what its start needs.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::snapshot::plan::Mode;
use crate::snapshot::Snapshot;

/// How a container's init starts, chosen at create from the request's
/// checkpoint and the snapshot plan (annotations, labels, config).
#[derive(Debug)]
pub enum InitStart {
    /// `runc start`, as containerd's runc shim.
    Plain,
    /// `runc start`, then, once the engine is capture-ready, the capture
    /// (in the background: a cold start can take minutes).
    Capture(Box<Snapshot>),
    /// `runc restore` of the checkpoint containerd gave at create
    /// (`ctr run --checkpoint`, `ctr task restore`): no activation.
    Checkpoint(PathBuf),
    /// `runc restore` of a vsnap artifact, then its activation: visible
    /// only once the copy reproduced its canary.
    Restore(Box<Snapshot>),
}

impl InitStart {
    /// The start of a task created with `checkpoint` (containerd's) and
    /// `snapshot` (the plan resolved at create). Both at once is refused:
    /// a checkpoint restore has no canary to hold the copy to.
    pub fn resolve(checkpoint: Option<PathBuf>, snapshot: Option<Snapshot>) -> Result<Self> {
        match (checkpoint, snapshot) {
            (Some(image), None) => Ok(InitStart::Checkpoint(image)),
            (Some(image), Some(s)) => {
                s.cleanup();
                Err(Error::InvalidArgument(format!(
                    "create: the task is created from checkpoint {} and has the snapshot plan of artifact {}: \
                     restore one or the other (drop the checkpoint, or the vsnap.io/snapshot annotation)",
                    image.display(),
                    s.artifact
                )))
            }
            (None, None) => Ok(InitStart::Plain),
            (None, Some(s)) if s.mode == Mode::Restore => Ok(InitStart::Restore(Box::new(s))),
            (None, Some(s)) => Ok(InitStart::Capture(Box::new(s))),
        }
    }

    /// The snapshot plan, for a capture or a snapshot restore.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        match self {
            InitStart::Capture(s) | InitStart::Restore(s) => Some(s),
            _ => None,
        }
    }

    pub fn snapshot_mut(&mut self) -> Option<&mut Snapshot> {
        match self {
            InitStart::Capture(s) | InitStart::Restore(s) => Some(s),
            _ => None,
        }
    }

    /// The images `runc restore` starts from, for the two restores.
    pub fn images(&self) -> Option<PathBuf> {
        match self {
            InitStart::Checkpoint(image) => Some(image.clone()),
            InitStart::Restore(s) => Some(s.artifact_dir().join("images")),
            _ => None,
        }
    }

    /// Whether Start runs `runc restore` (not `runc create` at create).
    pub fn restores(&self) -> bool {
        matches!(self, InitStart::Checkpoint(_) | InitStart::Restore(_))
    }

    /// Removes what the plan prepared at create (its control dir).
    pub fn cleanup(&self) {
        if let Some(s) = self.snapshot() {
            s.cleanup();
        }
    }

    /// Lets go of the container's hold on the artifact lock (idempotent).
    pub fn release_lock(&mut self) {
        if let Some(s) = self.snapshot_mut() {
            s.release_lock();
        }
    }
}
