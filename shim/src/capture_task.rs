//! A capture plan's capture as its container holds it: it runs in the
//! background after Start (lifecycle/capture/), and a kill of the init or
//! the container's Delete cancels it. A cancel before the artifact's
//! rename stops the capture with nothing published (its driver undoes
//! what ran: runc and CRIU killed, the staging dir removed, the lock let
//! go); one after the rename comes too late to matter and is ignored: the
//! artifact is whole. Its own room, below the container and the lifecycle.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

const RUNNING: u8 = 0;
const CANCELLED: u8 = 1;
const PUBLISHING: u8 = 2;

/// A capture's cancel and its publish, each excluding the other: whichever
/// comes first wins.
#[derive(Debug, Default)]
pub struct Commit {
    state: AtomicU8,
    cancel: CancellationToken,
}

impl Commit {
    /// The token the capture's stop listens to.
    pub fn token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Cancels the capture unless its publish began; returns whether it did.
    pub fn cancel(&self) -> bool {
        let cancelled =
            self.state
                .compare_exchange(RUNNING, CANCELLED, Ordering::SeqCst, Ordering::SeqCst);
        match cancelled {
            Ok(_) | Err(CANCELLED) => {
                self.cancel.cancel();
                true
            }
            Err(_) => false,
        }
    }

    /// Whether the publish may rename the artifact into place: not once
    /// cancelled; once it may, a cancel is ignored.
    pub fn begin_publish(&self) -> bool {
        self.state
            .compare_exchange(RUNNING, PUBLISHING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

/// The capture running in the background: what a kill cancels and what a
/// delete waits for.
#[derive(Debug)]
pub struct CaptureTask {
    commit: Arc<Commit>,
    /// Cancelled once the capture's driver is done, its undo included
    /// (also when the task panics).
    ended: CancellationToken,
    /// How long a delete waits for the capture to end.
    undo_within: Duration,
}

impl CaptureTask {
    pub fn new(commit: Arc<Commit>, ended: CancellationToken, undo_within: Duration) -> Self {
        Self {
            commit,
            ended,
            undo_within,
        }
    }

    /// Cancels the capture unless its publish began.
    pub fn cancel(&self) -> bool {
        self.commit.cancel()
    }

    pub fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Cancels the capture and waits until it ended (its work undone, or,
    /// past its publish, its donor phase over), at most its bound; returns
    /// whether it ended.
    pub async fn cancel_and_wait(self) -> bool {
        self.commit.cancel();
        tokio::time::timeout(self.undo_within, self.ended.cancelled())
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_before_the_publish_wins_and_one_after_it_is_ignored() {
        let early = Commit::default();
        assert!(early.cancel());
        assert!(!early.begin_publish(), "nothing published once cancelled");
        assert!(early.token().is_cancelled());
        assert!(early.cancel(), "a second cancel still says cancelled");

        let late = Commit::default();
        assert!(late.begin_publish());
        assert!(!late.cancel(), "too late: the artifact is whole");
        assert!(!late.token().is_cancelled());
    }
}
