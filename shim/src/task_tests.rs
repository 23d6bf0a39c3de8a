//! The task service over its two seams faked (fakes.rs): the order of its
//! events, a kill while a restore runs, the CRI sandbox's kill. Each test
//! waits for what the fakes report, never for time to pass.

use std::path::PathBuf;
use std::sync::Arc;

use containerd_shim::api;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::{Task, TtrpcContext, TtrpcResult};
use containerd_shim_protos::events::task::{TaskCreate, TaskExit};
use containerd_shim_protos::ttrpc::Code;

use super::TaskService;
use crate::exits::Exits;
use crate::fakes::{self, pid_of, FakeEvents, FakeRunc, CREATE, DELETE, EXIT, START};
use crate::runc::{Runc, RuncVerbs};

const SANDBOX: &str = "io.kubernetes.cri.container-type";

struct Shim {
    dir: tempfile::TempDir,
    exits: Exits,
    runc: Arc<FakeRunc>,
    events: Arc<FakeEvents>,
    service: Arc<TaskService>,
}

impl Shim {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let exits = Exits::default();
        let runc = FakeRunc::new(&dir.path().join("runc-root"), &exits);
        let (events, handle) = FakeEvents::new();
        let verbs: Arc<dyn RuncVerbs> = runc.clone();
        let service = TaskService::new(
            handle,
            exits.clone(),
            Arc::new(ExitSignal::default()),
            "default",
            "",
        )
        .with_runc(Arc::new(move |_: Runc| verbs.clone()));
        Self {
            dir,
            exits,
            runc,
            events,
            service: Arc::new(service),
        }
    }

    fn bundle(&self, id: &str, annotations: serde_json::Value) -> PathBuf {
        fakes::bundle(self.dir.path(), id, annotations)
    }

    /// Creates `id` (from a containerd checkpoint when `checkpoint`).
    async fn create(&self, id: &str, sandbox: bool, checkpoint: bool) -> u32 {
        let annotations = match sandbox {
            true => serde_json::json!({ SANDBOX: "sandbox" }),
            false => serde_json::json!({}),
        };
        let bundle = self.bundle(id, annotations);
        let image = checkpoint.then(|| self.dir.path().join("checkpoint"));
        let req = fakes::create_request(id, &bundle, image.as_deref());
        let ctx = TtrpcContext::default();
        self.service.create(&ctx, req).await.unwrap().pid
    }

    async fn start(&self, id: &str) -> TtrpcResult<api::StartResponse> {
        start(self.service.clone(), id).await
    }

    async fn kill(&self, id: &str, signal: u32, all: bool) -> TtrpcResult<()> {
        let req = api::KillRequest {
            id: id.into(),
            signal,
            all,
            ..Default::default()
        };
        self.service
            .kill(&TtrpcContext::default(), req)
            .await
            .map(drop)
    }

    async fn state(&self, id: &str) -> api::StateResponse {
        let req = api::StateRequest {
            id: id.into(),
            ..Default::default()
        };
        self.service
            .state(&TtrpcContext::default(), req)
            .await
            .unwrap()
    }

    /// Whether the restore of `id` under way was cancelled.
    async fn restore_cancelled(&self, id: &str) -> bool {
        let handle = self.service.container(id).unwrap();
        let c = handle.lock().await;
        c.starting
            .as_ref()
            .expect("a restore under way")
            .is_cancelled()
    }
}

async fn start(service: Arc<TaskService>, id: &str) -> TtrpcResult<api::StartResponse> {
    let req = api::StartRequest {
        id: id.into(),
        ..Default::default()
    };
    service.start(&TtrpcContext::default(), req).await
}

/// The Start spawned as `starting`, once it answered.
async fn finished(
    starting: tokio::task::JoinHandle<TtrpcResult<api::StartResponse>>,
) -> TtrpcResult<api::StartResponse> {
    tokio::time::timeout(fakes::PATIENCE, starting)
        .await
        .expect("Start answers once its restore is cancelled")
        .unwrap()
}

fn code_of<T: std::fmt::Debug>(r: TtrpcResult<T>) -> Code {
    match r {
        Err(containerd_shim_protos::ttrpc::Error::RpcStatus(s)) => s.code(),
        other => panic!("not an error status: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_start_exit_publish_create_start_exit_in_order_once_each() {
    let shim = Shim::new();
    let pid = shim.create("c1", false, false).await;
    assert_eq!(pid as i32, shim.runc.pid("c1"));
    assert_eq!(shim.start("c1").await.unwrap().pid, pid);
    shim.exits.deliver(pid as i32, 3);
    let exit = shim.events.next(EXIT).await;
    assert_eq!(shim.events.topics(), [CREATE, START, EXIT]);
    let sent = shim.events.sent();
    assert!(sent.iter().all(|s| pid_of(s) == pid), "one pid throughout");
    let create: TaskCreate = sent[0].decode();
    assert_eq!(create.container_id, "c1");
    assert!(create.bundle.ends_with("/c1"), "{}", create.bundle);
    let exit: TaskExit = exit.decode();
    assert_eq!((exit.container_id.as_str(), exit.id.as_str()), ("c1", "c1"));
    assert_eq!(exit.exit_status, 3);
    assert_eq!(shim.runc.calls(), ["create c1", "start c1"]);

    let req = api::DeleteRequest {
        id: "c1".into(),
        ..Default::default()
    };
    let deleted = shim.service.delete(&TtrpcContext::default(), req).await;
    assert_eq!(deleted.unwrap().exit_status, 3);
    assert_eq!(shim.events.topics(), [CREATE, START, EXIT, DELETE]);
    assert_eq!(shim.runc.calls().last().unwrap(), "delete c1 --force");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_that_exits_during_create_is_reported_after_task_create_and_never_started() {
    let shim = Shim::new();
    // Reaped before the service even watches the pid.
    shim.runc.exit_after("create", 1);
    shim.create("c1", false, false).await;
    shim.events.next(EXIT).await;
    assert_eq!(shim.events.topics(), [CREATE, EXIT]);
    assert_eq!(code_of(shim.start("c1").await), Code::FAILED_PRECONDITION);
    assert_eq!(shim.events.topics(), [CREATE, EXIT], "no TaskStart");
    assert_eq!(shim.runc.calls(), ["create c1"], "runc start never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_that_exits_as_it_starts_is_reported_after_task_start() {
    let shim = Shim::new();
    shim.runc.exit_after("start", 0);
    let pid = shim.create("c1", false, false).await;
    shim.start("c1").await.unwrap();
    let exit = shim.events.next(EXIT).await;
    assert_eq!(pid_of(&exit), pid);
    assert_eq!(shim.events.topics(), [CREATE, START, EXIT]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_created_without_runc_and_started_with_its_restored_pid() {
    let shim = Shim::new();
    assert_eq!(shim.create("c1", false, true).await, 0, "no process yet");
    assert_eq!(shim.state("c1").await.status, api::Status::CREATED.into());
    let pid = shim.start("c1").await.unwrap().pid;
    assert_eq!(pid as i32, shim.runc.pid("c1"));
    assert_eq!(shim.state("c1").await.status, api::Status::RUNNING.into());
    let sent = shim.events.sent();
    assert_eq!(shim.events.topics(), [CREATE, START]);
    assert_eq!(pid_of(&sent[0]), 0);
    assert_eq!(pid_of(&sent[1]), pid);
    shim.exits.deliver(pid as i32, 0);
    shim.events.next(EXIT).await;
    assert_eq!(shim.events.topics(), [CREATE, START, EXIT]);
    assert_eq!(shim.runc.calls(), ["restore c1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_restoring_cancels_the_start_and_leaves_nothing_of_it() {
    let shim = Shim::new();
    shim.runc.hang_restores();
    shim.create("c1", false, true).await;
    let starting = tokio::spawn(start(shim.service.clone(), "c1"));
    shim.runc.seen("restore c1").await;
    // Restoring is CREATED to containerd.
    assert_eq!(shim.state("c1").await.status, api::Status::CREATED.into());
    // A probe (signal 0) is no kill: the restore goes on.
    shim.kill("c1", 0, false).await.unwrap();
    assert!(!shim.restore_cancelled("c1").await);

    shim.kill("c1", 9, false).await.unwrap();
    assert_eq!(code_of(finished(starting).await), Code::CANCELLED);
    let exit: TaskExit = shim.events.next(EXIT).await.decode();
    assert_eq!((exit.pid, exit.exit_status), (0, 137));
    assert_eq!(shim.events.topics(), [CREATE, EXIT], "never started");
    let state = shim.state("c1").await;
    assert_eq!(state.status, api::Status::STOPPED.into());
    assert_eq!(state.exit_status, 137);
    // The probe went to runc; the kill cancelled runc restore instead
    // (no process to signal), and runc's state was undone.
    assert_eq!(
        shim.runc.calls(),
        ["restore c1", "kill c1 0", "delete c1 --force"]
    );
    assert!(!shim.runc.state_dir("c1").exists());
    let record = std::fs::read_to_string(shim.dir.path().join("c1/vsnap-error.json")).unwrap();
    assert!(record.contains("restore: CRIU"), "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_cri_sandbox_cancels_the_restores_beside_it() {
    let shim = Shim::new();
    shim.create("pause", true, false).await;
    shim.start("pause").await.unwrap();
    shim.runc.hang_restores();
    shim.create("app", false, true).await;
    let starting = tokio::spawn(start(shim.service.clone(), "app"));
    shim.runc.seen("restore app").await;

    // A probe of the sandbox cancels nothing.
    shim.kill("pause", 0, false).await.unwrap();
    assert!(!shim.restore_cancelled("app").await);

    shim.kill("pause", 9, false).await.unwrap();
    assert_eq!(code_of(finished(starting).await), Code::CANCELLED);
    let exit: TaskExit = shim.events.next(EXIT).await.decode();
    assert_eq!((exit.container_id.as_str(), exit.exit_status), ("app", 137));
    let calls = shim.runc.calls();
    assert!(calls.contains(&"kill pause 9".to_string()), "{calls:?}");
    assert!(
        !calls.iter().any(|c| c.starts_with("kill app")),
        "{calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_containers_kill_does_not_cancel_its_neighbours_restore() {
    let shim = Shim::new();
    shim.create("web", false, false).await;
    shim.start("web").await.unwrap();
    shim.runc.hang_restores();
    shim.create("app", false, true).await;
    let starting = tokio::spawn(start(shim.service.clone(), "app"));
    shim.runc.seen("restore app").await;
    shim.kill("web", 9, false).await.unwrap();
    assert!(!shim.restore_cancelled("app").await);
    shim.kill("app", 9, false).await.unwrap();
    assert_eq!(code_of(finished(starting).await), Code::CANCELLED);
}

#[tokio::test]
async fn requests_refused_at_the_edge_never_reach_runc() {
    let shim = Shim::new();
    shim.create("c1", false, false).await;
    let update = api::UpdateTaskRequest {
        id: "c1".into(),
        ..Default::default()
    };
    let refused = shim
        .service
        .update(&TtrpcContext::default(), update)
        .await
        .map(drop);
    assert_eq!(code_of(refused), Code::INVALID_ARGUMENT);
    let checkpoint = api::CheckpointTaskRequest {
        id: "c1".into(),
        ..Default::default()
    };
    let refused = shim
        .service
        .checkpoint(&TtrpcContext::default(), checkpoint)
        .await
        .map(drop);
    assert_eq!(code_of(refused), Code::INVALID_ARGUMENT);
    assert_eq!(shim.runc.calls(), ["create c1"]);
}
