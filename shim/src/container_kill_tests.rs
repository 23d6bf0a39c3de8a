//! Kill of a container's init in every state of the state machine
//! (lifecycle/state.rs), through a recording runc (fakes.rs): what goes
//! to runc, what a kill cancels, and what containerd is answered.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use containerd_shim::asynchronous::io::Stdio;
use tokio_util::sync::CancellationToken;

use super::Container;
use crate::capture_task::{CaptureTask, Commit};
use crate::error::Error;
use crate::exits::{Exit, Exits};
use crate::fakes::FakeRunc;
use crate::init_start::InitStart;
use crate::process::{Process, Status, Transition};

const PID: i32 = 5_999_999;

/// A container whose init is `status`, its runc `runc`; a restoring or
/// activating one has its start's cancel token.
fn container_in(status: Status, runc: Arc<FakeRunc>) -> Container {
    let mut init = Process::new("", Stdio::new("", "", "", false));
    let moves: &[Transition] = match status {
        Status::Created => &[],
        Status::Restoring => &[Transition::BeginRestore],
        Status::Activating => &[Transition::BeginRestore, Transition::Restored],
        Status::Running => &[Transition::Start],
        Status::Paused => &[Transition::Start, Transition::Pause],
        Status::Stopped => &[Transition::Start],
    };
    for via in moves {
        init.transition("test", *via).unwrap();
    }
    if status != Status::Restoring {
        init.pid = PID;
    }
    if status == Status::Stopped {
        init.set_exited(Exit {
            code: 0,
            at: time::OffsetDateTime::now_utc(),
        });
    }
    assert_eq!(init.status(), status);
    let starting =
        matches!(status, Status::Restoring | Status::Activating).then(CancellationToken::new);
    Container {
        id: "c1".into(),
        bundle: PathBuf::from("/nonexistent-bundle"),
        runc,
        no_pivot: false,
        init,
        execs: HashMap::new(),
        start: InitStart::Plain,
        starting,
        capture: None,
        spec: Default::default(),
        rootfs: Vec::new(),
        rootfs_mounted: false,
        copy_exit: super::CopyExit::Publish,
        netns: None,
    }
}

/// What a kill of the init did.
#[derive(Debug, PartialEq)]
struct Outcome {
    answer: &'static str,
    runc: Vec<String>,
    cancelled: Option<bool>,
}

async fn kill_in(status: Status, signal: u32, all: bool) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let runc = FakeRunc::new(dir.path(), &Exits::default());
    let c = container_in(status, runc.clone());
    let answer = match c.kill("", signal, all).await {
        Ok(()) => "ok",
        Err(Error::NotFound(_)) => "not found",
        Err(e) => panic!("{status}: {e:?}"),
    };
    Outcome {
        answer,
        runc: runc.calls(),
        cancelled: c.starting.as_ref().map(CancellationToken::is_cancelled),
    }
}

fn outcome(answer: &'static str, runc: &[&str], cancelled: Option<bool>) -> Outcome {
    Outcome {
        answer,
        runc: runc.iter().map(|s| s.to_string()).collect(),
        cancelled,
    }
}

#[tokio::test]
async fn a_kill_in_every_init_state_does_what_that_state_needs() {
    use Status::*;
    let table = [
        // runc created the init: runc delivers the signal.
        (Created, outcome("ok", &["kill c1 15"], None)),
        // CRIU is restoring, no process exists: the restore is
        // cancelled (runc and CRIU killed by the start), runc not asked.
        (Restoring, outcome("ok", &[], Some(true))),
        // The copy exists but is not visible: the start is cancelled and
        // the copy signalled.
        (Activating, outcome("ok", &["kill c1 15"], Some(true))),
        (Running, outcome("ok", &["kill c1 15"], None)),
        // A paused container is signalled too (runc delivers it when
        // thawed), as containerd's runc shim does.
        (Paused, outcome("ok", &["kill c1 15"], None)),
        // Already exited: NotFound, which containerd and CRI read as
        // "already stopped"; runc is not asked.
        (Stopped, outcome("not found", &[], None)),
    ];
    for (status, want) in table {
        assert_eq!(kill_in(status, 15, false).await, want, "{status}");
    }
}

#[tokio::test]
async fn kill_all_reaches_runc_even_after_the_init_exited() {
    // The init's exit does not end the others of a shared pid namespace.
    let got = kill_in(Status::Stopped, 9, true).await;
    assert_eq!(got, outcome("ok", &["kill c1 9 --all"], None));
}

#[tokio::test]
async fn a_probe_with_signal_0_never_cancels_a_start() {
    for status in [Status::Restoring, Status::Activating] {
        let got = kill_in(status, 0, false).await;
        assert_eq!(got.cancelled, Some(false), "{status}");
        assert_eq!(got.runc, ["kill c1 0"], "{status}");
    }
}

#[tokio::test]
async fn a_signal_to_a_capturing_init_cancels_its_capture_and_a_probe_does_not() {
    for (signal, cancelled) in [(0, false), (libc::SIGTERM, true), (libc::SIGKILL, true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = container_in(
            Status::Running,
            FakeRunc::new(dir.path(), &Exits::default()),
        );
        let commit = Arc::new(Commit::default());
        let ended = CancellationToken::new();
        c.capture = Some(CaptureTask::new(commit.clone(), ended, Duration::ZERO));
        c.kill("", signal as u32, false).await.unwrap();
        assert_eq!(commit.token().is_cancelled(), cancelled, "signal {signal}");
    }
}

#[tokio::test]
async fn a_kill_runc_finds_nothing_to_signal_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let runc = FakeRunc::new(dir.path(), &Exits::default());
    runc.fail("kill", "container not running");
    let c = container_in(Status::Running, runc.clone());
    let e = c.kill("", 9, false).await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    runc.fail("kill", "permission denied");
    let e = c.kill("", 9, false).await.unwrap_err();
    assert!(matches!(e, Error::Runc { .. }), "{e:?}");
}

#[tokio::test]
async fn a_start_that_failed_is_killed_through_runc_or_recorded_as_killed() {
    let dir = tempfile::tempdir().unwrap();
    let runc = FakeRunc::new(dir.path(), &Exits::default());
    // A copy exists: killed, its exit left to the reaper.
    let mut c = container_in(Status::Activating, runc.clone());
    assert!(c.start_failed().await.is_none());
    assert_eq!(runc.calls(), ["kill c1 9 --all"]);
    assert!(c.starting.is_none());
    // Nothing exists: recorded as killed (137), runc not asked.
    let mut c = container_in(Status::Restoring, runc.clone());
    let exit = c.start_failed().await.expect("a synthetic exit");
    assert_eq!(exit.code, 137);
    assert_eq!(c.init.status(), Status::Stopped);
    assert_eq!(runc.calls(), ["kill c1 9 --all"]);
}
