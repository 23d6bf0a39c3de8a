//! `auto`'s go-on-cold, unit by unit: the decision ([`after_failure`]) for
//! each cause, and the real phases of an artifact's restore run by the
//! driver over a real [`RestoreRun`] of a container whose plan is `auto`,
//! with runc and the event sender faked (fakes.rs); a phase failing after
//! CRIU shows what the abort undoes, sets aside and starts instead.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use containerd_shim_protos::events::task::TaskExit;
use vsnap_artifact::Tenant;
use vsnap_protocol::Oracle;

use super::begin::Begun;
use super::context::RestoreRun;
use super::go_cold::{after_failure, AfterFailure};
use super::snapshot::Snapshot;
use super::{criu, restored};
use crate::error::{Error, Result};
use crate::exits::Exits;
use crate::fakes::{self, FakeEvents, FakeRunc, EXIT, START};
use crate::init_start::{InitStart, RestoreSource};
use crate::lifecycle::driver::{self, Failed};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::lifecycle::test_support;
use crate::process::Status;
use crate::shared::ContainerRef;
use crate::snapshot::plan::refusal::Cause;
use crate::snapshot::plan::{ColdStart, RestorePlan};

const ID: &str = "c1";
const ARTIFACT: &str = "cold-test";

#[test]
fn only_an_auto_restore_failing_for_the_artifact_sets_it_aside_and_goes_cold_where_planned() {
    let criu = Error::FailedPrecondition("criu failed".into());
    let killed = Error::Cancelled("killed".into());
    let damaged = Error::Damaged("chunk 3".into());
    let go = |auto, cold, phase, e: &Error| after_failure(auto, cold, phase, e);
    use AfterFailure::*;
    assert_eq!(go(false, true, PhaseName::CriuRestore, &criu), Fails);
    assert_eq!(
        go(true, true, PhaseName::CriuRestore, &criu),
        GoesCold(Cause::Restore)
    );
    assert_eq!(
        go(true, true, PhaseName::Activation, &criu),
        GoesCold(Cause::Restore)
    );
    assert_eq!(
        go(true, true, PhaseName::GpuResume, &criu),
        GoesCold(Cause::Restore)
    );
    assert_eq!(
        go(true, false, PhaseName::CriuRestore, &criu),
        SetAside(Cause::Restore)
    );
    assert_eq!(
        go(true, true, PhaseName::Verify, &criu),
        GoesCold(Cause::Damaged)
    );
    assert_eq!(
        go(true, true, PhaseName::CriuRestore, &damaged),
        GoesCold(Cause::Damaged)
    );
    // A kill, or a phase that is the container's, never sets it aside.
    assert_eq!(go(true, true, PhaseName::CriuRestore, &killed), Fails);
    assert_eq!(go(true, true, PhaseName::Visible, &criu), Fails);
    assert_eq!(go(true, true, PhaseName::Restored, &criu), Fails);
}

/// A restore plan; `cold`: the cold start planned under `auto`.
fn plan(root: &Path, auto: bool, cold: Option<ColdStart>) -> RestorePlan {
    RestorePlan {
        common: test_support::common(root, ARTIFACT),
        lock: None,
        owner: Tenant::new("default", None).unwrap(),
        fingerprint_key: None,
        oracle: Oracle {
            sampled_token_logprob: -0.5,
            text: "x".into(),
            token_ids: vec![1],
        },
        contents: None,
        verified_at_create: Vec::new(),
        pages: None,
        memory: None,
        create_began: SystemTime::now(),
        preflight: Duration::ZERO,
        rootfs_unpack: Duration::ZERO,
        auto,
        cold,
        shared_root: None,
        hostname: None,
        criu: None,
        sealed: None,
    }
}

struct Restore {
    dir: tempfile::TempDir,
    runc: Arc<FakeRunc>,
    events: Arc<FakeEvents>,
    handle: ContainerRef,
}

impl Restore {
    /// A container whose init restores `ARTIFACT` (present under the
    /// root), its restore begun.
    async fn begin(auto: bool, cold: bool) -> (Self, RestoreRun<Snapshot>) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("artifacts");
        std::fs::create_dir_all(vsnap_artifact::path(&root, ARTIFACT).join("images")).unwrap();
        let exits = Exits::default();
        let runc = FakeRunc::new(&dir.path().join("runc-root"), &exits);
        let bundle = fakes::bundle(dir.path(), ID, serde_json::json!({}));
        let cold = cold.then(|| cold_start(&bundle));
        let start = InitStart::Restore(RestoreSource::Artifact(Box::new(plan(&root, auto, cold))));
        let (handle, shared, events) =
            test_support::container(dir.path(), ID, start, runc.clone(), &exits).await;
        let run = {
            let mut c = handle.lock().await;
            match super::begin(&mut c, shared, handle.clone(), exits.mark()).unwrap() {
                Begun::Snapshot(run) => *run,
                Begun::Checkpoint(_) => panic!("an artifact's restore began as a checkpoint's"),
            }
        };
        let restore = Self {
            dir,
            runc,
            events,
            handle,
        };
        (restore, run)
    }

    fn artifact(&self) -> PathBuf {
        vsnap_artifact::path(&self.dir.path().join("artifacts"), ARTIFACT)
    }

    fn fallback_record(&self) -> Option<serde_json::Value> {
        let path = self.dir.path().join(ID).join("vsnap-fallback.json");
        let bytes = std::fs::read(path).ok()?;
        Some(serde_json::from_slice(&bytes).unwrap())
    }
}

/// The cold start of the container's own spec, saved in its bundle.
fn cold_start(bundle: &Path) -> ColdStart {
    let spec = bundle.join(ColdStart::SPEC_FILE);
    std::fs::copy(bundle.join("config.json"), &spec).unwrap();
    ColdStart {
        spec,
        upper: None,
        shm: Vec::new(),
        capture: None,
    }
}

/// A phase after CRIU that fails, as the activation of a copy whose
/// canary does not match.
struct Fails(PhaseName);

#[async_trait]
impl Phase<RestoreRun<Snapshot>> for Fails {
    fn name(&self) -> PhaseName {
        self.0
    }

    async fn run(&self, _: &mut RestoreRun<Snapshot>, _: &Stop) -> Result<()> {
        Err(Error::FailedPrecondition(format!(
            "{}: canary differs",
            self.0
        )))
    }
}

async fn drive(run: &mut RestoreRun<Snapshot>, failing: PhaseName) -> Failed {
    let stop = run.stop.clone();
    let fails = Fails(failing);
    let phases: [&dyn Phase<RestoreRun<Snapshot>>; 3] =
        [&criu::CriuRestore, &restored::Restored, &fails];
    let driven = driver::drive(run, &phases, &stop, driver::GRACE);
    tokio::time::timeout(fakes::PATIENCE, driven)
        .await
        .expect("the restore ends")
        .expect_err("the restore fails")
}

#[tokio::test]
async fn an_auto_restore_failing_after_criu_undoes_the_copy_sets_the_artifact_aside_and_starts_cold(
) {
    let (r, mut run) = Restore::begin(true, true).await;
    let failed = drive(&mut run, PhaseName::Activation).await;
    assert_eq!(failed.phase, PhaseName::Activation);
    // The copy and runc's state of it went before the cold start's create.
    assert_eq!(
        r.runc.calls(),
        ["restore c1", "delete c1 --force", "create c1", "start c1"]
    );
    let cold = run.source.cold_pid.expect("the start went on cold");
    assert_eq!(cold, r.runc.pid(ID));
    assert_eq!(r.handle.lock().await.init.status(), Status::Running);
    let start = r.events.next(START).await;
    assert_eq!(fakes::pid_of(&start) as i32, cold);
    assert!(!r.artifact().exists(), "the artifact was set aside");
    let record = r.fallback_record().expect("vsnap-fallback.json");
    assert_eq!(record["cause"], "restore");
    assert_eq!(record["start"], "cold, without a capture");
}

#[tokio::test]
async fn an_auto_restore_without_a_cold_start_sets_the_artifact_aside_and_fails_once() {
    let (r, mut run) = Restore::begin(true, false).await;
    let failed = drive(&mut run, PhaseName::Activation).await;
    assert_eq!(failed.phase, PhaseName::Activation);
    assert!(run.source.cold_pid.is_none());
    assert!(!r.artifact().exists(), "the artifact was set aside");
    assert_eq!(r.fallback_record().unwrap()["cause"], "restore");
    // The copy ran: it is killed and its exit comes through the reaper.
    assert!(r.runc.calls().iter().any(|c| c.starts_with("kill c1 9")));
    assert!(!r.events.topics().contains(&START.to_string()));
}

#[tokio::test]
async fn a_failure_of_the_containers_own_under_auto_leaves_the_artifact_and_starts_nothing() {
    let (r, mut run) = Restore::begin(true, true).await;
    let failed = drive(&mut run, PhaseName::Visible).await;
    assert_eq!(failed.phase, PhaseName::Visible);
    assert!(run.source.cold_pid.is_none());
    assert!(r.artifact().exists(), "the artifact stays");
    assert!(r.fallback_record().is_none());
    assert!(!r.runc.calls().contains(&"create c1".to_string()));
}

#[tokio::test]
async fn a_plain_restore_plan_never_goes_cold_and_reports_the_init_killed() {
    let (r, mut run) = Restore::begin(false, true).await;
    r.runc.fail("restore", "criu failed: type RESTORE errno 0");
    let stop = run.stop.clone();
    let phases: [&dyn Phase<RestoreRun<Snapshot>>; 2] = [&criu::CriuRestore, &restored::Restored];
    let failed = driver::drive(&mut run, &phases, &stop, driver::GRACE)
        .await
        .expect_err("the restore fails");
    assert_eq!(failed.phase, PhaseName::CriuRestore);
    assert_eq!(r.runc.calls(), ["restore c1", "delete c1 --force"]);
    assert!(r.artifact().exists(), "the artifact stays");
    let exit: TaskExit = r.events.next(EXIT).await.decode();
    assert_eq!((exit.pid, exit.exit_status), (0, 137));
}
