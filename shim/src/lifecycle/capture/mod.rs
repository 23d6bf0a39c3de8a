//! The background half of the capture plan: once the cold-started engine
//! is capture-ready, its inventory taken, the tree checkpointed with runc +
//! CRIU (left running), its writable layer and /dev/shm carried, every file
//! digested, the manifest sealed and the artifact published, then the donor
//! woken or stopped. Phases, one file each, run by the driver
//! (../driver.rs): any failure publishes nothing, leaves an error record
//! naming the phase, and kills the task so it exits non-zero. Its container
//! owns it (../../capture_task.rs): a kill of the init or a delete before
//! the publish cancels it, and the delete waits for its undo.

mod carry;
mod checkpoint;
mod context;
mod donor;
mod inventory;
mod publish;
mod ready;
#[cfg(test)]
mod undo_tests;

use std::sync::Weak;

use log::info;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::driver;
use super::phase::Phase;
use crate::capture_task::CaptureTask;
use crate::container::Container;
use crate::exits::Exits;
pub use context::CaptureRun;

/// The phases of a capture, in order.
pub const PHASES: [&dyn Phase<CaptureRun>; 7] = [
    &ready::WaitReady,
    &inventory::Inventory,
    &checkpoint::Checkpoint,
    &carry::Carry,
    &publish::Digest,
    &publish::Publish,
    &donor::Donor,
];

/// How many of the driver's grace periods a delete waits for a cancelled
/// capture: one for the stopped phase, the rest for the undo (runc and
/// CRIU reaped, the tree thawed and killed, the staging dir removed).
const UNDO_GRACES: u32 = 20;

/// Starts the capture in the background, owned by its `container`, which
/// keeps the returned handle: once the capture ends, it drops it there.
pub fn spawn(capture: CaptureRun, exits: Exits, container: Weak<Mutex<Container>>) -> CaptureTask {
    spawn_phases(capture, exits, container, &PHASES)
}

/// [`spawn`] of the capture's `phases`.
fn spawn_phases(
    capture: CaptureRun,
    exits: Exits,
    container: Weak<Mutex<Container>>,
    phases: &'static [&'static dyn Phase<CaptureRun>],
) -> CaptureTask {
    let ended = CancellationToken::new();
    let task = CaptureTask::new(
        capture.commit.clone(),
        ended.clone(),
        driver::GRACE * UNDO_GRACES,
    );
    tokio::spawn(async move {
        // Ended on every path out, a panic's included.
        let ending = ended.drop_guard();
        run(capture, exits, phases).await;
        drop(ending);
        if let Some(handle) = container.upgrade() {
            let mut c = handle.lock().await;
            if c.capture.as_ref().is_some_and(CaptureTask::has_ended) {
                c.capture = None;
            }
        }
    });
    task
}

/// Runs the capture to the end; then pushes the artifact where the plan
/// says (after the lock is gone, its tools spawned under `exits`), or,
/// on failure, the task is killed.
async fn run(mut capture: CaptureRun, exits: Exits, phases: &[&dyn Phase<CaptureRun>]) {
    let stop = capture.stop();
    let ran = driver::drive(&mut capture, phases, &stop, driver::GRACE).await;
    capture.journal(&ran);
    if ran.is_err() {
        return;
    }
    if let Some(path) = &capture.published {
        info!("{}: artifact published at {}", capture.id, path.display());
    }
    if let Some(target) = capture.plan.push_to.clone() {
        target.push_in_background(capture.id.clone(), exits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::phase::PhaseName;

    #[test]
    fn a_capture_publishes_only_after_every_byte_is_digested_and_wakes_the_donor_last() {
        let names: Vec<PhaseName> = PHASES.iter().map(|p| p.name()).collect();
        let at = |n| names.iter().position(|x| *x == n).unwrap();
        assert_eq!(at(PhaseName::WaitReady), 0);
        assert!(at(PhaseName::Inventory) < at(PhaseName::Checkpoint));
        assert!(at(PhaseName::Checkpoint) < at(PhaseName::Carry));
        assert!(at(PhaseName::Carry) < at(PhaseName::Digest));
        assert!(at(PhaseName::Digest) < at(PhaseName::Publish));
        assert_eq!(names.last(), Some(&PhaseName::Donor));
        assert!(
            names.iter().all(|n| n.as_str().starts_with("capture: ")),
            "{names:?}"
        );
    }
}
