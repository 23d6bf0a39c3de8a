//! A restore begins: what it restores from is taken from the container
//! (an artifact's plan moved, with the container's hold on its lock), its
//! init becomes Restoring and its `runc restore` job is made.

use std::time::{Duration, Instant};

use super::context::{restore_job, Checkpoint, RestoreRun};
use super::snapshot::Snapshot;
use crate::container::Container;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::exits::Mark;
use crate::init_start::Taken;
use crate::runc::CheckpointFlags;
use crate::shared::{ContainerRef, Shared};

/// How long a restore of a checkpoint given by containerd (no plan, so no
/// activation timeout) may take before it is given up.
const CHECKPOINT_RESTORE_LIMIT: Duration = Duration::from_secs(3600);

/// A restore begun, by its source.
pub enum Begun {
    Checkpoint(Box<RestoreRun<Checkpoint>>),
    Snapshot(Box<RestoreRun<Snapshot>>),
}

/// The restore of `c` begins: its init becomes Restoring, its stdio is
/// made ready, and everything the phases need is taken from it (an
/// artifact's plan moved, with the container's hold on its lock).
pub fn begin(c: &mut Container, shared: Shared, handle: ContainerRef, mark: Mark) -> Result<Begun> {
    let taken = c.start.take_restore().ok_or_else(|| {
        Error::FailedPrecondition(format!("start: container {} has no checkpoint", c.id))
    })?;
    match taken {
        Taken::Checkpoint(image) => {
            let deadline = Deadline::new(
                Instant::now() + CHECKPOINT_RESTORE_LIMIT,
                "the checkpoint restore limit of 3600s",
            );
            let flags = CheckpointFlags {
                shell_job: c.init.stdio.terminal,
                ..Default::default()
            };
            let job = restore_job(c, image, flags, &deadline)?;
            let run = RestoreRun::new(c, (shared, handle, mark), job, deadline, Checkpoint);
            Ok(Begun::Checkpoint(Box::new(run)))
        }
        Taken::Artifact(plan) => {
            let (mut snapshot, deadline) = Snapshot::take(*plan);
            let flags = snapshot.criu_flags(c.init.stdio.terminal);
            let mut job = match restore_job(c, snapshot.plan.images(), flags, &deadline) {
                Ok(job) => job,
                Err(e) => {
                    // Nothing began: the container keeps its plan (and lock).
                    c.start = snapshot.give_back();
                    return Err(e);
                }
            };
            snapshot.equip(&mut job);
            let run = RestoreRun::new(c, (shared, handle, mark), job, deadline, snapshot);
            Ok(Begun::Snapshot(Box::new(run)))
        }
    }
}
