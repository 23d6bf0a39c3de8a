//! A phase of a start: its name (what errors, the error record and the
//! timings call it), the unit that runs it, and the stop it must honour.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;

use crate::deadline::Deadline;
use crate::error::{Error, Result};

/// Every phase a start can run, in the words errors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PhaseName {
    /// Hashing every byte of the artifact against its manifest.
    Verify,
    /// `runc restore` (CRIU), with the page placement and, where CRIU
    /// holds the tree stopped, the verification beside it.
    CriuRestore,
    /// Taking the restored init's pid and terminal.
    Restored,
    /// CRIU's CUDA plugin resumed every GPU process.
    GpuResume,
    /// The copy woken, its canary reproduced, its port listening.
    Activation,
    /// The last checks before the copy counts as running.
    Visible,
    /// A capture waiting until the cold-started engine is capture-ready.
    WaitReady,
    /// What CRIU could not restore faithfully, refused before the dump.
    Inventory,
    /// `runc checkpoint` (CRIU) of the running tree.
    Checkpoint,
    /// /dev/shm and the writable layer carried beside the images.
    Carry,
    /// Every file of the artifact digested.
    Digest,
    /// The manifest sealed and the artifact published.
    Publish,
    /// The donor woken (serve) or stopped (exit).
    Donor,
}

impl PhaseName {
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseName::Verify => "restore: verify",
            PhaseName::CriuRestore => "restore: CRIU",
            PhaseName::Restored => "restore: restored init",
            PhaseName::GpuResume => "restore: GPU resume",
            PhaseName::Activation => "restore: activation",
            PhaseName::Visible => "restore: visible",
            PhaseName::WaitReady => "capture: waiting",
            PhaseName::Inventory => "capture: inventory",
            PhaseName::Checkpoint => "capture: checkpoint",
            PhaseName::Carry => "capture: carry",
            PhaseName::Digest => "capture: content digests",
            PhaseName::Publish => "capture: publish",
            PhaseName::Donor => "capture: donor",
        }
    }
}

impl PhaseName {
    /// The phase's label in the metrics journal and `vsnap metrics`
    /// (`phase="criu"`): short, stable, without the operation.
    pub fn slug(self) -> &'static str {
        match self {
            PhaseName::Verify => "verify",
            PhaseName::CriuRestore => "criu",
            PhaseName::Restored => "restored",
            PhaseName::GpuResume => "gpu_resume",
            PhaseName::Activation => "activation",
            PhaseName::Visible => "visible",
            PhaseName::WaitReady => "waiting",
            PhaseName::Inventory => "inventory",
            PhaseName::Checkpoint => "checkpoint",
            PhaseName::Carry => "carry",
            PhaseName::Digest => "digest",
            PhaseName::Publish => "publish",
            PhaseName::Donor => "donor",
        }
    }
}

impl fmt::Display for PhaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One phase of a start over the start's context `Cx`.
#[async_trait]
pub trait Phase<Cx: Send>: Send + Sync {
    fn name(&self) -> PhaseName;
    /// Runs the phase. It should end soon after `stop` fires (blocking
    /// work polls [`Stop::flag`]); the driver gives it a grace and then
    /// stops waiting for it.
    async fn run(&self, cx: &mut Cx, stop: &Stop) -> Result<()>;
}

/// When a start must stop: its deadline passed or a kill cancelled it.
#[derive(Clone, Debug)]
pub struct Stop {
    deadline: Deadline,
    /// Set once stopped, for blocking code that cannot await.
    flag: Arc<AtomicBool>,
}

impl Stop {
    pub fn new(deadline: Deadline) -> Self {
        Self {
            deadline,
            flag: Arc::default(),
        }
    }

    pub fn deadline(&self) -> &Deadline {
        &self.deadline
    }

    /// Set (between chunks of blocking work, read it) once stopped.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// Resolves when the deadline passes or a kill cancels; sets the flag.
    pub async fn stopped(&self) {
        tokio::select! {
            () = self.deadline.cancel.cancelled() => {}
            () = tokio::time::sleep_until(self.deadline.at.into()) => {}
        }
        self.flag.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.deadline.cancel.is_cancelled() || std::time::Instant::now() >= self.deadline.at
    }

    /// The error of a phase stopped before it ended: CANCELLED for a kill,
    /// DEADLINE_EXCEEDED for the deadline, naming the phase.
    pub fn error(&self, phase: PhaseName) -> Error {
        match self.deadline.fail(format!("{phase}: stopped")) {
            e @ (Error::Cancelled(_) | Error::DeadlineExceeded(_)) => e,
            _ => Error::Cancelled(format!("{phase}: stopped")),
        }
    }
}

/// `f` off the runtime thread, its panic an error of `what`.
pub async fn blocking<T: Send + 'static>(
    what: PhaseName,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Other(format!("{what}: {e}")))?
}
