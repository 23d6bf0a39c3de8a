//! Recording fakes of the shim's two seams, for unit tests: runc's verbs
//! ([`RuncVerbs`]) and the event sender ([`EventSender`]). Each records
//! every call in order and tells a test of it on a channel, so a test
//! waits for the moment it needs instead of sleeping.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use containerd_shim::api;
use containerd_shim_protos::events::task::{TaskCreate, TaskExit, TaskStart};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::Message;
use tokio::sync::mpsc;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::events::{EventSender, Events};
use crate::exits::Exits;
use crate::runc::{CheckpointFlags, ChildStdio, RestoreFiles, RuncVerbs};

/// How long a test waits for something a fake reports before failing.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Pids the fake hands out: above any kernel's pid_max (2^22), so no
/// real process is ever signalled, watched or read through them.
const FIRST_PID: i32 = 5_000_000;

/// runc, faked: a created or restored container gets a made-up pid in
/// its pid file and a state folder under `root`; every verb is recorded
/// as a line (`"kill c1 15 --all"`) and sent to [`FakeRunc::seen`].
pub struct FakeRunc {
    pub root: PathBuf,
    calls: Mutex<Vec<String>>,
    tx: mpsc::UnboundedSender<String>,
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>,
    /// Verbs that fail, with runc's message.
    failing: Mutex<HashMap<&'static str, String>>,
    /// A restore waits for its cancel (a kill of the task), then fails as
    /// runc killed by it does.
    restore_hangs: Mutex<bool>,
    /// A checkpoint runs until its deadline passes or its cancel (a kill
    /// or delete of the task) comes, then fails as runc killed then does.
    checkpoint_hangs: Mutex<bool>,
    /// Verbs after which the container's process exits at once, with
    /// this code (delivered to `exits` as the reaper would).
    exit_after: Mutex<HashMap<&'static str, i32>>,
    exits: Exits,
    next_pid: AtomicI32,
    pids: Mutex<HashMap<String, i32>>,
    /// Containers whose restore wrote no pid file.
    no_pid_file: Mutex<HashSet<&'static str>>,
}

impl FakeRunc {
    pub fn new(root: &Path, exits: &Exits) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            root: root.to_path_buf(),
            calls: Mutex::default(),
            tx,
            rx: tokio::sync::Mutex::new(rx),
            failing: Mutex::default(),
            restore_hangs: Mutex::new(false),
            checkpoint_hangs: Mutex::new(false),
            exit_after: Mutex::default(),
            exits: exits.clone(),
            next_pid: AtomicI32::new(FIRST_PID),
            pids: Mutex::default(),
            no_pid_file: Mutex::default(),
        })
    }

    /// `verb` fails with runc's `detail`.
    pub fn fail(&self, verb: &'static str, detail: &str) {
        self.failing.lock().unwrap().insert(verb, detail.into());
    }

    pub fn hang_restores(&self) {
        *self.restore_hangs.lock().unwrap() = true;
    }

    pub fn hang_checkpoints(&self) {
        *self.checkpoint_hangs.lock().unwrap() = true;
    }

    /// The container's process exits with `code` right after `verb`.
    pub fn exit_after(&self, verb: &'static str, code: i32) {
        self.exit_after.lock().unwrap().insert(verb, code);
    }

    /// The restore of `id` succeeds without writing its pid file.
    pub fn restore_without_pid(&self, id: &'static str) {
        self.no_pid_file.lock().unwrap().insert(id);
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// The pid the fake gave `id`'s init.
    pub fn pid(&self, id: &str) -> i32 {
        self.pids.lock().unwrap()[id]
    }

    /// Waits until a call starting with `prefix` is made (or was made
    /// since the last wait).
    pub async fn seen(&self, prefix: &str) {
        let mut rx = self.rx.lock().await;
        let wait = async {
            while let Some(call) = rx.recv().await {
                if call.starts_with(prefix) {
                    return;
                }
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("no runc call {prefix:?}; calls: {:?}", self.calls()));
    }

    fn record(&self, verb: &'static str, line: String) -> Result<()> {
        self.calls.lock().unwrap().push(line.clone());
        let _ = self.tx.send(line);
        match self.failing.lock().unwrap().get(verb) {
            Some(detail) => Err(Error::Runc {
                phase: verb.into(),
                verb,
                detail: detail.clone(),
            }),
            None => Ok(()),
        }
    }

    /// A process for `id`: its pid in `pid_file`, runc's state folder.
    fn spawn(&self, id: &str, pid_file: &Path) -> i32 {
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        self.pids.lock().unwrap().insert(id.to_string(), pid);
        std::fs::write(pid_file, pid.to_string()).unwrap();
        std::fs::create_dir_all(self.state_dir(id)).unwrap();
        pid
    }

    fn maybe_exit(&self, verb: &'static str, id: &str) {
        let code = self.exit_after.lock().unwrap().get(verb).copied();
        let pid = self.pids.lock().unwrap().get(id).copied();
        if let (Some(code), Some(pid)) = (code, pid) {
            self.exits.deliver(pid, code);
        }
    }
}

#[async_trait]
impl RuncVerbs for FakeRunc {
    fn state_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn systemd_cgroup(&self) -> bool {
        false
    }

    async fn create(
        &self,
        id: &str,
        _bundle: &Path,
        pid_file: &Path,
        _console: Option<&Path>,
        _no_pivot: bool,
        _stdio: Option<ChildStdio>,
    ) -> Result<()> {
        self.record("create", format!("create {id}"))?;
        self.spawn(id, pid_file);
        self.maybe_exit("create", id);
        Ok(())
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.record("start", format!("start {id}"))?;
        self.maybe_exit("start", id);
        Ok(())
    }

    async fn exec(
        &self,
        id: &str,
        _process_json: &Path,
        pid_file: &Path,
        _console: Option<&Path>,
        _stdio: Option<ChildStdio>,
    ) -> Result<()> {
        self.record("exec", format!("exec {id}"))?;
        let pid = self.next_pid.fetch_add(1, Ordering::Relaxed);
        std::fs::write(pid_file, pid.to_string()).unwrap();
        Ok(())
    }

    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let all = if all { " --all" } else { "" };
        self.record("kill", format!("kill {id} {signal}{all}"))
    }

    async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let force = if force { " --force" } else { "" };
        self.record("delete", format!("delete {id}{force}"))?;
        let _ = std::fs::remove_dir_all(self.state_dir(id));
        Ok(())
    }

    async fn pause(&self, id: &str) -> Result<()> {
        self.record("pause", format!("pause {id}"))
    }

    async fn resume(&self, id: &str) -> Result<()> {
        self.record("resume", format!("resume {id}"))
    }

    async fn ps(&self, id: &str) -> Result<Vec<i32>> {
        self.record("ps", format!("ps {id}"))?;
        Ok(self
            .pids
            .lock()
            .unwrap()
            .get(id)
            .copied()
            .into_iter()
            .collect())
    }

    async fn update(&self, id: &str, _resources: Vec<u8>) -> Result<()> {
        self.record("update", format!("update {id}"))
    }

    async fn checkpoint(
        &self,
        id: &str,
        _image: &Path,
        _work: &Path,
        _flags: &CheckpointFlags,
        deadline: Option<&Deadline>,
    ) -> Result<()> {
        self.record("checkpoint", format!("checkpoint {id}"))?;
        if *self.checkpoint_hangs.lock().unwrap() {
            let deadline = deadline.expect("a capture's dump runs under a deadline");
            tokio::select! {
                () = tokio::time::sleep_until(deadline.at.into()) => {}
                () = deadline.cancel.cancelled() => {}
            }
            return Err(deadline.fail(format!("checkpoint: runc checkpoint of {id} killed")));
        }
        Ok(())
    }

    async fn restore(
        &self,
        id: &str,
        files: &RestoreFiles<'_>,
        _flags: &CheckpointFlags,
        _stdio: Option<ChildStdio>,
        deadline: Option<&Deadline>,
    ) -> Result<()> {
        // runc makes its state folder first thing.
        std::fs::create_dir_all(self.state_dir(id)).unwrap();
        self.record("restore", format!("restore {id}"))?;
        if *self.restore_hangs.lock().unwrap() {
            let deadline = deadline.expect("a restore runs under a deadline");
            deadline.cancel.cancelled().await;
            return Err(Error::Cancelled(format!(
                "restore: runc restore cancelled by a kill of the task ({id})"
            )));
        }
        if !self.no_pid_file.lock().unwrap().contains(id) {
            self.spawn(id, files.pid_file);
        }
        Ok(())
    }
}

/// One event as the shim sent it.
#[derive(Clone, Debug)]
pub struct Sent {
    pub topic: String,
    pub event: Any,
}

impl Sent {
    pub fn decode<M: Message>(&self) -> M {
        M::parse_from_bytes(&self.event.value).expect("the event decodes")
    }
}

/// The event sender, faked: records each event and sends it on.
pub struct FakeEvents {
    sent: Mutex<Vec<Sent>>,
    tx: mpsc::UnboundedSender<Sent>,
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<Sent>>,
}

impl FakeEvents {
    /// The fake, and the shim's handle on it.
    pub fn new() -> (Arc<Self>, Events) {
        let (tx, rx) = mpsc::unbounded_channel();
        let fake = Arc::new(Self {
            sent: Mutex::default(),
            tx,
            rx: tokio::sync::Mutex::new(rx),
        });
        (fake.clone(), Events::through(fake))
    }

    /// The topics sent so far, in order.
    pub fn topics(&self) -> Vec<String> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.topic.clone())
            .collect()
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// Waits until an event of `topic` is sent (or was, since the last
    /// wait) and returns it.
    pub async fn next(&self, topic: &str) -> Sent {
        let mut rx = self.rx.lock().await;
        let wait = async {
            while let Some(sent) = rx.recv().await {
                if sent.topic == topic {
                    return sent;
                }
            }
            unreachable!("the fake holds its own sender")
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("no event {topic}; sent: {:?}", self.topics()))
    }
}

#[async_trait]
impl EventSender for FakeEvents {
    async fn send_packed(&self, topic: String, event: Any) {
        let sent = Sent { topic, event };
        self.sent.lock().unwrap().push(sent.clone());
        let _ = self.tx.send(sent);
    }
}

pub const CREATE: &str = "/tasks/create";
pub const START: &str = "/tasks/start";
pub const EXIT: &str = "/tasks/exit";
pub const DELETE: &str = "/tasks/delete";

/// The pid of a TaskCreate, TaskStart or TaskExit.
pub fn pid_of(sent: &Sent) -> u32 {
    match sent.topic.as_str() {
        CREATE => sent.decode::<TaskCreate>().pid,
        START => sent.decode::<TaskStart>().pid,
        EXIT => sent.decode::<TaskExit>().pid,
        t => panic!("no pid in {t}"),
    }
}

/// A bundle for container `id` in `dir`: its spec (`annotations` added)
/// and an empty rootfs.
pub fn bundle(dir: &Path, id: &str, annotations: serde_json::Value) -> PathBuf {
    let bundle = dir.join(id);
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"terminal": false, "args": ["/bin/true"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
    });
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    bundle
}

/// CreateTask of `id` in `bundle` (from containerd's `checkpoint` when
/// given), without stdio or rootfs mounts.
pub fn create_request(
    id: &str,
    bundle: &Path,
    checkpoint: Option<&Path>,
) -> api::CreateTaskRequest {
    api::CreateTaskRequest {
        id: id.into(),
        bundle: bundle.display().to_string(),
        checkpoint: checkpoint
            .map(|c| c.display().to_string())
            .unwrap_or_default(),
        ..Default::default()
    }
}
