//! A bound on a piece of work the shim runs for a container (one runc
//! invocation, a restore's CRIU phase and activation, its verification):
//! when it ends, what to call it in errors, and the token a kill cancels
//! the work with. Its own room: runc, the restore and the barrier all use it.

use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// A deadline, its name in errors and its cancel token.
#[derive(Clone, Debug)]
pub struct Deadline {
    pub at: Instant,
    /// e.g. "the activation timeout of 120s (activation_timeout_s)".
    pub what: String,
    /// Cancelled when the work must stop now (a kill during a restore).
    pub cancel: CancellationToken,
}

impl Deadline {
    pub fn new(at: Instant, what: impl Into<String>) -> Self {
        Self {
            at,
            what: what.into(),
            cancel: CancellationToken::new(),
        }
    }

    /// `msg`, naming this deadline once it has passed.
    pub fn explain(&self, msg: String) -> String {
        if Instant::now() >= self.at {
            format!("{msg}; deadline: {} passed", self.what)
        } else {
            msg
        }
    }

    /// The error for a failure under this deadline: DEADLINE_EXCEEDED once
    /// it has passed, CANCELLED once cancelled, else a failed precondition.
    pub fn fail(&self, msg: String) -> Error {
        if self.cancel.is_cancelled() {
            Error::Cancelled(format!("{msg}; cancelled: the task was killed"))
        } else if Instant::now() >= self.at {
            Error::DeadlineExceeded(self.explain(msg))
        } else {
            Error::FailedPrecondition(msg)
        }
    }
}
