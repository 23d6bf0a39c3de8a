//! The undo of a failed restore, phase by phase: the real phases of a
//! containerd checkpoint's restore (CRIU, restored init, visible) run by
//! the driver over a real [`RestoreRun`], with runc and the event sender
//! faked (fakes.rs); a failing phase placed after each shows what the
//! abort undoes of what ran before it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim_protos::events::task::TaskExit;

use super::begin::Begun;
use super::context::{Checkpoint, RestoreRun};
use super::{criu, restored, visible};
use crate::error::{Error, Result};
use crate::exits::Exits;
use crate::fakes::{self, FakeEvents, FakeRunc, EXIT, START};
use crate::init_start::{InitStart, RestoreSource};
use crate::lifecycle::driver::{self, Failed};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::lifecycle::test_support;
use crate::process::Status;
use crate::runc::RuncVerbs;
use crate::shared::ContainerRef;

const ID: &str = "c1";

struct Restore {
    dir: tempfile::TempDir,
    runc: Arc<FakeRunc>,
    events: Arc<FakeEvents>,
    exits: Exits,
    handle: ContainerRef,
}

impl Restore {
    /// A container created from a containerd checkpoint, and its restore
    /// begun (the init Restoring).
    async fn begin() -> (Self, RestoreRun<Checkpoint>) {
        let dir = tempfile::tempdir().unwrap();
        let exits = Exits::default();
        let runc = FakeRunc::new(&dir.path().join("runc-root"), &exits);
        let start = InitStart::Restore(RestoreSource::Checkpoint(dir.path().join("checkpoint")));
        let (container, shared, events) =
            test_support::container(dir.path(), ID, start, runc.clone(), &exits).await;
        let mark = exits.mark();
        let run = {
            let mut c = container.lock().await;
            match super::begin(&mut c, shared, container.clone(), mark).unwrap() {
                Begun::Checkpoint(run) => *run,
                Begun::Snapshot(_) => panic!("a checkpoint's restore began as an artifact's"),
            }
        };
        let restore = Self {
            dir,
            runc,
            events,
            exits,
            handle: container,
        };
        (restore, run)
    }

    async fn status(&self) -> Status {
        self.handle.lock().await.init.status()
    }

    fn error_record(&self) -> serde_json::Value {
        let path = self.dir.path().join(ID).join("vsnap-error.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

/// What a fake phase after the real ones does.
#[derive(Clone, Copy)]
enum Act {
    Fail,
    /// The restored copy exits (its exit published), then the phase ends.
    CopyExits,
    /// containerd's Kill of the task lands.
    Killed,
}

struct Then(PhaseName, Act);

#[async_trait]
impl Phase<RestoreRun<Checkpoint>> for Then {
    fn name(&self) -> PhaseName {
        self.0
    }

    async fn run(&self, run: &mut RestoreRun<Checkpoint>, _: &Stop) -> Result<()> {
        match self.1 {
            Act::Fail => Err(Error::FailedPrecondition(format!("{}: broken", self.0))),
            Act::CopyExits => {
                run.shared.exits.deliver(run.pid, 1);
                // Until the exit watcher recorded it.
                let mut exited = run.handle.lock().await.init.exit_watch();
                tokio::time::timeout(fakes::PATIENCE, exited.wait_for(Option::is_some))
                    .await
                    .expect("the copy's exit recorded")
                    .unwrap();
                Ok(())
            }
            Act::Killed => run.handle.lock().await.kill("", 9, false).await,
        }
    }
}

async fn drive(
    run: &mut RestoreRun<Checkpoint>,
    phases: &[&dyn Phase<RestoreRun<Checkpoint>>],
) -> Failed {
    let stop = run.stop.clone();
    let driven = driver::drive(run, phases, &stop, driver::GRACE);
    tokio::time::timeout(Duration::from_secs(10), driven)
        .await
        .expect("the restore ends")
        .expect_err("the restore fails")
}

#[tokio::test]
async fn a_failed_runc_restore_undoes_runcs_state_and_reports_the_init_killed() {
    let (r, mut run) = Restore::begin().await;
    r.runc.fail("restore", "criu failed: type RESTORE errno 0");
    let failed = drive(&mut run, &[&criu::CriuRestore, &restored::Restored]).await;
    assert_eq!(failed.phase, PhaseName::CriuRestore);
    // runc's state goes once (the job undid it; the abort does not again).
    assert_eq!(r.runc.calls(), ["restore c1", "delete c1 --force"]);
    assert!(!r.runc.state_dir(ID).exists());
    let exit: TaskExit = r.events.next(EXIT).await.decode();
    assert_eq!((exit.pid, exit.exit_status), (0, 137));
    assert_eq!(r.status().await, Status::Stopped);
    assert!(r.handle.lock().await.starting.is_none());
    assert_eq!(r.error_record()["phase"], "restore: CRIU");
}

#[tokio::test]
async fn a_failure_after_criu_but_before_the_init_is_taken_undoes_runcs_state() {
    let (r, mut run) = Restore::begin().await;
    let failing = Then(PhaseName::Restored, Act::Fail);
    let failed = drive(&mut run, &[&criu::CriuRestore, &failing]).await;
    assert_eq!(failed.phase, PhaseName::Restored);
    // No pid was taken: what CRIU restored goes with runc's state.
    assert_eq!(r.runc.calls(), ["restore c1", "delete c1 --force"]);
    let exit: TaskExit = r.events.next(EXIT).await.decode();
    assert_eq!((exit.pid, exit.exit_status), (0, 137));
    assert_eq!(r.status().await, Status::Stopped);
    assert_eq!(r.error_record()["phase"], "restore: restored init");
}

#[tokio::test]
async fn a_restored_init_without_a_pid_file_fails_the_restored_phase() {
    let (r, mut run) = Restore::begin().await;
    r.runc.restore_without_pid(ID);
    let failed = drive(&mut run, &[&criu::CriuRestore, &restored::Restored]).await;
    assert_eq!(failed.phase, PhaseName::Restored);
    assert!(
        failed.error.to_string().contains("pid file"),
        "{}",
        failed.error
    );
    assert_eq!(r.runc.calls(), ["restore c1", "delete c1 --force"]);
    assert_eq!(r.events.topics(), [EXIT]);
}

#[tokio::test]
async fn a_failure_once_the_copy_exists_kills_it_and_leaves_its_exit_to_the_reaper() {
    let (r, mut run) = Restore::begin().await;
    let failing = Then(PhaseName::Activation, Act::Fail);
    let failed = drive(
        &mut run,
        &[&criu::CriuRestore, &restored::Restored, &failing],
    )
    .await;
    assert_eq!(failed.phase, PhaseName::Activation);
    // Killed through runc; runc's state stays for the task's delete.
    assert_eq!(r.runc.calls(), ["restore c1", "kill c1 9 --all"]);
    assert!(r.runc.state_dir(ID).exists());
    assert!(
        r.events.topics().is_empty(),
        "no synthetic exit, no TaskStart"
    );
    assert_eq!(r.status().await, Status::Activating);
    // The copy's own exit, when the reaper reports it, is the TaskExit.
    let pid = r.runc.pid(ID);
    r.exits.deliver(pid, 137);
    let exit: TaskExit = r.events.next(EXIT).await.decode();
    assert_eq!((exit.pid as i32, exit.exit_status), (pid, 137));
    assert_eq!(r.status().await, Status::Stopped);
}

#[tokio::test]
async fn a_copy_that_exited_before_it_was_visible_is_never_started() {
    let (r, mut run) = Restore::begin().await;
    let exits = Then(PhaseName::Activation, Act::CopyExits);
    let failed = drive(
        &mut run,
        &[
            &criu::CriuRestore,
            &restored::Restored,
            &exits,
            &visible::Visible,
        ],
    )
    .await;
    assert_eq!(failed.phase, PhaseName::Visible);
    assert!(
        failed.error.to_string().contains("exited"),
        "{}",
        failed.error
    );
    assert_eq!(r.events.topics(), [EXIT], "no TaskStart");
    assert_eq!(r.status().await, Status::Stopped);
}

#[tokio::test]
async fn a_kill_while_activating_cancels_the_start_before_it_is_visible() {
    let (r, mut run) = Restore::begin().await;
    let killed = Then(PhaseName::Activation, Act::Killed);
    let failed = drive(
        &mut run,
        &[
            &criu::CriuRestore,
            &restored::Restored,
            &killed,
            &visible::Visible,
        ],
    )
    .await;
    assert_eq!(failed.phase, PhaseName::Visible);
    assert!(
        matches!(failed.error, Error::Cancelled(_)),
        "{:?}",
        failed.error
    );
    // The kill signalled the copy and cancelled the start; the abort
    // made sure of the copy.
    assert_eq!(
        r.runc.calls(),
        ["restore c1", "kill c1 9", "kill c1 9 --all"]
    );
    assert!(!r.events.topics().contains(&START.to_string()));
}

#[tokio::test]
async fn every_phase_of_a_checkpoint_restore_passing_makes_it_visible_once() {
    let (r, mut run) = Restore::begin().await;
    let stop = run.stop.clone();
    let phases = super::checkpoint_phases();
    driver::drive(&mut run, phases, &stop, driver::GRACE)
        .await
        .unwrap();
    assert_eq!(r.status().await, Status::Running);
    assert_eq!(r.runc.calls(), ["restore c1"]);
    let start = r.events.next(START).await;
    assert_eq!(fakes::pid_of(&start) as i32, r.runc.pid(ID));
    assert_eq!(r.events.topics(), [START]);
}
