//! The undo of a failed capture, phase by phase: the real checkpoint
//! phase run by the driver over a real [`CaptureRun`] with runc faked
//! (fakes.rs), and failing phases before and after it. Whatever failed,
//! nothing is staged or published and the task is killed so it exits
//! non-zero; a dump killed at its deadline thaws the tree first. A capture
//! its container owns: a kill or a delete during its dump cancels it, and
//! the delete returns once the capture is undone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim::asynchronous::io::Stdio;

use super::checkpoint::Checkpoint;
use super::context::CaptureRun;
use crate::container::{Container, CreateConfig};
use crate::error::{Error, Result};
use crate::exits::{Exit, Exits};
use crate::fakes::{FakeRunc, PATIENCE};
use crate::init_start::InitStart;
use crate::lifecycle::driver::{self, Failed};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::lifecycle::test_support;
use crate::shared::ContainerRef;
use crate::snapshot::plan::{AfterCapture, CapturePlan, WriteLock};
use crate::snapshot::rootfs::WritableLayer;

const ID: &str = "c1";
const PID: i32 = 5_999_999;
const ARTIFACT: &str = "undo-test";

/// A create plan of artifact [`ARTIFACT`] under `root`. The one place
/// these tests build the plan's struct.
fn create_plan(root: &Path, checkpoint_timeout: Duration) -> CapturePlan {
    CapturePlan {
        common: test_support::common(root, ARTIFACT),
        lock: None,
        capture_timeout: Duration::from_secs(60),
        checkpoint_timeout,
        after_capture: AfterCapture::Exit,
        donor_stop_grace: Duration::from_secs(1),
        layer: WritableLayer::Shared,
        layer_limit: 0,
        elide_zero_pages: true,
        seal_at_rest: true,
        push_to: None,
        spec: serde_json::json!({}),
        criu: vsnap_artifact::CriuOptions::snapshot(false, Vec::new()),
    }
}

struct Capture {
    dir: tempfile::TempDir,
    runc: Arc<FakeRunc>,
}

impl Capture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(ID)).unwrap();
        let runc = FakeRunc::new(&dir.path().join("runc-root"), &Exits::default());
        Self { dir, runc }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("artifacts")
    }

    fn run(&self, checkpoint_timeout: Duration) -> CaptureRun {
        let plan = create_plan(&self.root(), checkpoint_timeout);
        let bundle = self.dir.path().join(ID);
        CaptureRun::new(ID, bundle, self.runc.clone(), PID, false, &plan)
    }

    /// What is under the artifact root: nothing staged, nothing published.
    fn under_root(&self) -> Vec<String> {
        match std::fs::read_dir(self.root()) {
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    fn error_record(&self) -> serde_json::Value {
        let path = self.dir.path().join(ID).join("vsnap-error.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

/// A phase that fails; it notes the staging dir when there is one.
struct Fails(PhaseName, Arc<Mutex<Option<PathBuf>>>);

impl Fails {
    fn at(name: PhaseName) -> Self {
        Self(name, Arc::default())
    }
}

#[async_trait]
impl Phase<CaptureRun> for Fails {
    fn name(&self) -> PhaseName {
        self.0
    }

    async fn run(&self, run: &mut CaptureRun, _: &Stop) -> Result<()> {
        let staged = run.staging.as_ref().map(|s| s.images());
        *self.1.lock().unwrap() = staged;
        Err(Error::FailedPrecondition(format!("{}: broken", self.0)))
    }
}

async fn drive(run: &mut CaptureRun, phases: &[&dyn Phase<CaptureRun>]) -> Failed {
    let stop = Stop::new(run.outer_deadline());
    let driven = driver::drive(run, phases, &stop, driver::GRACE);
    tokio::time::timeout(Duration::from_secs(10), driven)
        .await
        .expect("the capture ends")
        .expect_err("the capture fails")
}

#[tokio::test]
async fn a_capture_failing_before_the_dump_kills_the_task_and_stages_nothing() {
    let c = Capture::new();
    let mut run = c.run(Duration::from_secs(60));
    let failed = drive(&mut run, &[&Fails::at(PhaseName::WaitReady), &Checkpoint]).await;
    assert_eq!(failed.phase, PhaseName::WaitReady);
    assert_eq!(c.runc.calls(), ["kill c1 9 --all"]);
    assert!(c.under_root().is_empty(), "{:?}", c.under_root());
    assert_eq!(c.error_record()["phase"], "capture: waiting");
}

#[tokio::test]
async fn a_failed_dump_leaves_no_staging_dir_and_kills_the_task() {
    let c = Capture::new();
    c.runc.fail("checkpoint", "criu failed: type DUMP errno 0");
    let mut run = c.run(Duration::from_secs(60));
    let failed = drive(&mut run, &[&Checkpoint, &Fails::at(PhaseName::Carry)]).await;
    assert_eq!(failed.phase, PhaseName::Checkpoint);
    assert!(
        failed.error.to_string().starts_with("capture: "),
        "{}",
        failed.error
    );
    // Not a dump killed at its deadline: nothing to thaw.
    assert_eq!(c.runc.calls(), ["checkpoint c1", "kill c1 9 --all"]);
    assert!(c.under_root().is_empty(), "{:?}", c.under_root());
    assert_eq!(c.error_record()["phase"], "capture: checkpoint");
}

#[tokio::test]
async fn a_dump_killed_at_its_deadline_thaws_the_tree_before_the_task_is_killed() {
    let c = Capture::new();
    c.runc.hang_checkpoints();
    let mut run = c.run(Duration::from_millis(50));
    let failed = drive(&mut run, &[&Checkpoint]).await;
    assert_eq!(failed.phase, PhaseName::Checkpoint);
    assert!(
        matches!(failed.error, Error::DeadlineExceeded(_)),
        "{:?}",
        failed.error
    );
    assert_eq!(
        c.runc.calls(),
        ["checkpoint c1", "resume c1", "kill c1 9 --all"]
    );
    assert!(c.under_root().is_empty(), "{:?}", c.under_root());
}

#[tokio::test]
async fn a_failure_after_the_dump_removes_the_staged_images_and_publishes_nothing() {
    let c = Capture::new();
    let mut run = c.run(Duration::from_secs(60));
    let carry = Fails::at(PhaseName::Carry);
    let failed = drive(&mut run, &[&Checkpoint, &carry]).await;
    assert_eq!(failed.phase, PhaseName::Carry);
    let staged = carry.1.lock().unwrap().clone().expect("the dump staged");
    assert!(!staged.exists(), "{} is left", staged.display());
    assert!(c.under_root().is_empty(), "{:?}", c.under_root());
    assert_eq!(c.runc.calls(), ["checkpoint c1", "kill c1 9 --all"]);
    assert_eq!(c.error_record()["phase"], "capture: carry");
}

/// The dump alone, as the capture a container owns runs it here.
const DUMP: [&dyn Phase<CaptureRun>; 1] = [&Checkpoint];

impl Capture {
    /// A capture of [`ARTIFACT`] holding its write lock, as Start hands it
    /// over (the plan's own hold let go).
    fn locked_run(&self, checkpoint_timeout: Duration) -> CaptureRun {
        let mut plan = create_plan(&self.root(), checkpoint_timeout);
        plan.lock = Some(WriteLock::take(&self.root(), ARTIFACT).unwrap());
        let bundle = self.dir.path().join(ID);
        CaptureRun::new(ID, bundle, self.runc.clone(), PID, false, &plan)
    }

    /// Container [`ID`], created and started through the fake runc, its
    /// capture of `phases` under way as Start leaves it.
    async fn owning(
        &self,
        run: CaptureRun,
        phases: &'static [&'static dyn Phase<CaptureRun>],
    ) -> ContainerRef {
        let mut c = Container::create(CreateConfig {
            id: ID.into(),
            bundle: self.dir.path().join(ID),
            rootfs: Vec::new(),
            stdio: Stdio::new("", "", "", false),
            runc: self.runc.clone(),
            no_pivot: false,
            start: InitStart::Plain,
            spec: Default::default(),
        })
        .await
        .unwrap();
        c.run_start().await.unwrap();
        let handle = Arc::new(tokio::sync::Mutex::new(c));
        let owner = Arc::downgrade(&handle);
        let task = super::spawn_phases(run, Exits::default(), owner, phases);
        handle.lock().await.capture = Some(task);
        handle
    }

    /// The staging dirs and artifacts under the root (its locks and
    /// journal left out).
    fn staged_or_published(&self) -> Vec<String> {
        let mut left = self.under_root();
        left.retain(|n| n.starts_with(".staging-") || !n.starts_with('.'));
        left
    }
}

/// The init gone (killed, or dead on its own), then containerd's Delete.
async fn exit_and_delete(handle: &ContainerRef) {
    let mut c = handle.lock().await;
    c.init.set_exited(Exit {
        code: 128 + libc::SIGKILL,
        at: time::OffsetDateTime::now_utc(),
    });
    tokio::time::timeout(PATIENCE, c.delete())
        .await
        .expect("the delete ends")
        .unwrap();
    assert!(c.capture.is_none(), "the delete took the capture");
}

#[tokio::test]
async fn a_delete_during_a_hanging_dump_cancels_it_publishes_nothing_and_frees_the_lock() {
    let c = Capture::new();
    c.runc.hang_checkpoints();
    let handle = c
        .owning(c.locked_run(Duration::from_secs(3600)), &DUMP)
        .await;
    c.runc.seen("checkpoint").await;
    exit_and_delete(&handle).await;
    // runc and CRIU killed by the cancel (the fake's dump ends only so),
    // the tree thawed and killed, all before runc's delete.
    assert_eq!(
        c.runc.calls()[2..],
        [
            "checkpoint c1",
            "resume c1",
            "kill c1 9 --all",
            "delete c1 --force"
        ]
    );
    assert_eq!(c.staged_or_published(), Vec::<String>::new());
    assert!(
        WriteLock::take(&c.root(), ARTIFACT).is_ok(),
        "the artifact's lock is free"
    );
    let record = c.error_record();
    assert_eq!(record["phase"], "capture: checkpoint");
    assert!(
        record["error"].as_str().unwrap().contains("cancelled"),
        "{record}"
    );
}

#[tokio::test]
async fn a_kill_during_a_hanging_dump_cancels_it_and_the_delete_waits_for_its_undo() {
    let c = Capture::new();
    c.runc.hang_checkpoints();
    let handle = c
        .owning(c.locked_run(Duration::from_secs(3600)), &DUMP)
        .await;
    c.runc.seen("checkpoint").await;
    handle
        .lock()
        .await
        .kill("", libc::SIGKILL as u32, true)
        .await
        .unwrap();
    c.runc.seen("resume c1").await;
    exit_and_delete(&handle).await;
    let calls = c.runc.calls();
    assert_eq!(calls.last().map(String::as_str), Some("delete c1 --force"));
    assert_eq!(calls.iter().filter(|l| *l == "kill c1 9 --all").count(), 2);
    assert_eq!(c.staged_or_published(), Vec::<String>::new());
    assert!(WriteLock::take(&c.root(), ARTIFACT).is_ok());
}

#[tokio::test]
async fn a_capture_that_ends_leaves_its_container() {
    let c = Capture::new();
    let handle = c.owning(c.locked_run(Duration::from_secs(60)), &[]).await;
    tokio::time::timeout(PATIENCE, async {
        while handle.lock().await.capture.is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the ended capture leaves its container");
    assert!(WriteLock::take(&c.root(), ARTIFACT).is_ok());
    exit_and_delete(&handle).await;
    assert_eq!(c.runc.calls()[2..], ["delete c1 --force"]);
}
