//! The containerd task API (v3) served over ttrpc. This is the wire edge:
//! requests are unwrapped here and handed to [`Container`] (and to
//! [`crate::start`] for the init's start). Each container has its own lock;
//! the map of containers is locked only to look one up, never across an
//! await, so a long call on one container (a restore, a checkpoint) never
//! holds up another. Events go out in the order containerd expects (create,
//! start, exit, delete; exec added, exec started, exit): each is queued while
//! its container's lock is held.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::io::Stdio;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::util::convert_to_timestamp;
use containerd_shim::{api, Task, TtrpcContext, TtrpcResult};
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskIO, TaskPaused, TaskResumed,
};
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim::oci::{CheckpointOptions, ProcessDetails};
use log::info;
use tokio::sync::Mutex;

use crate::console;
use crate::container::{CheckpointRequest, Container};
use crate::error::{Error, Result};
use crate::events::Events;
use crate::exits::Exits;
use crate::lifecycle::create::{CreateRequest, Creator};
use crate::options;
use crate::process::{wait_exit, Status};
use crate::runc::CheckpointFlags;
use crate::shared::{ContainerRef, Shared};
use crate::snapshot::rootfs::RootMount;

pub struct TaskService {
    shared: Shared,
    exit_signal: Arc<ExitSignal>,
    /// A Shutdown came while containers remained. containerd sends it once
    /// when the pod's sandbox task is deleted, and none after deleting a
    /// pod's other containers (CRI's sandboxed tasks): a container deleted
    /// after the sandbox (a restore StopPodSandbox cancelled) would leave
    /// the shim running for ever. The last delete then ends the shim.
    shutdown_pending: std::sync::atomic::AtomicBool,
    namespace: String,
    /// containerd's socket, for its API (labels).
    containerd_address: String,
}

impl TaskService {
    pub fn new(
        events: Events,
        exits: Exits,
        exit_signal: Arc<ExitSignal>,
        namespace: &str,
        containerd_address: &str,
    ) -> Self {
        Self {
            shared: Shared {
                containers: Arc::default(),
                events,
                exits,
            },
            exit_signal,
            shutdown_pending: Default::default(),
            namespace: namespace.to_string(),
            containerd_address: containerd_address.to_string(),
        }
    }

    fn container(&self, id: &str) -> Result<ContainerRef> {
        self.shared.get(id)
    }

    async fn do_create(&self, req: api::CreateTaskRequest) -> Result<api::CreateTaskResponse> {
        if self.container(&req.id).is_ok() {
            return Err(already_exists(&req.id));
        }
        let creator = Creator {
            namespace: &self.namespace,
            containerd_address: &self.containerd_address,
            exits: &self.shared.exits,
        };
        let mark = self.shared.exits.mark();
        let c = creator.create(CreateRequest::try_from(&req)?).await?;
        let pid = c.init.pid;
        let handle = Arc::new(Mutex::new(c));
        // Queued under the container's lock: TaskCreate before its exit.
        let guard = handle.lock().await;
        {
            let mut map = self.shared.containers.lock().expect("containers lock");
            if map.contains_key(&req.id) {
                return Err(already_exists(&req.id));
            }
            map.insert(req.id.clone(), handle.clone());
            self.shutdown_pending.store(false, Ordering::SeqCst);
        }
        if pid != 0 {
            self.shared.watch(&req.id, "", pid, mark);
        }
        info!("created {} (pid {pid})", req.id);
        self.shared.events.send(task_create(req, pid)).await;
        drop(guard);
        Ok(api::CreateTaskResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    async fn do_start(&self, req: api::StartRequest) -> Result<api::StartResponse> {
        let handle = self.container(&req.id)?;
        let mark = self.shared.exits.mark();
        let pid = if req.exec_id.is_empty() {
            crate::lifecycle::start_init(self.shared.clone(), handle, mark).await?
        } else {
            let mut c = handle.lock().await;
            let pid = c.start_exec(&req.exec_id).await?;
            self.shared.watch(&req.id, &req.exec_id, pid, mark);
            self.shared
                .events
                .send(TaskExecStarted {
                    container_id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                    pid: pid as u32,
                    ..Default::default()
                })
                .await;
            pid
        };
        Ok(api::StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    async fn do_delete(&self, req: api::DeleteRequest) -> Result<api::DeleteResponse> {
        let handle = self.container(&req.id)?;
        let mut c = handle.lock().await;
        if !req.exec_id.is_empty() {
            let mut p = c.delete_exec(&req.exec_id)?;
            drop(c);
            p.shutdown_io().await;
            let (exit_status, exited_at) = p.exit_status();
            return Ok(api::DeleteResponse {
                pid: p.pid as u32,
                exit_status,
                exited_at: MessageField::some(convert_to_timestamp(exited_at)),
                ..Default::default()
            });
        }
        c.delete().await?;
        let last = {
            let mut map = self.shared.containers.lock().expect("containers lock");
            map.remove(&req.id);
            map.is_empty()
        };
        if last && self.shutdown_pending.load(Ordering::SeqCst) {
            info!(
                "{}: last container deleted after a Shutdown: exiting",
                req.id
            );
            // After this reply is on its way.
            let exit = self.exit_signal.clone();
            tokio::spawn(async move { exit.signal() });
        }
        for p in c.execs.values_mut() {
            p.shutdown_io().await;
        }
        c.init.shutdown_io().await;
        let (exit_status, exited_at) = c.init.exit_status();
        let exited_at = convert_to_timestamp(exited_at);
        info!("deleted {}", req.id);
        self.shared
            .events
            .send(TaskDelete {
                container_id: req.id.clone(),
                pid: c.init.pid as u32,
                exit_status,
                exited_at: MessageField::some(exited_at.clone()),
                id: req.id,
                ..Default::default()
            })
            .await;
        Ok(api::DeleteResponse {
            pid: c.init.pid as u32,
            exit_status,
            exited_at: MessageField::some(exited_at),
            ..Default::default()
        })
    }

    async fn do_state(&self, req: api::StateRequest) -> Result<api::StateResponse> {
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        let p = c.process(&req.exec_id)?;
        let (exit_status, exited_at) = p.exit_status();
        Ok(api::StateResponse {
            id: req.id.clone(),
            bundle: c.bundle.display().to_string(),
            pid: p.pid as u32,
            status: wire_status(p.status()).into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status,
            exited_at: MessageField::from_option(exited_at.map(|t| convert_to_timestamp(Some(t)))),
            exec_id: req.exec_id,
            ..Default::default()
        })
    }

    async fn do_pids(&self, req: api::PidsRequest) -> Result<api::PidsResponse> {
        let handle = self.container(&req.id)?;
        let pids = Container::pids(&handle).await?;
        let mut processes = Vec::with_capacity(pids.len());
        for (pid, exec_id) in pids {
            let mut info = containerd_shim_protos::types::task::ProcessInfo {
                pid: pid as u32,
                ..Default::default()
            };
            if let Some(exec_id) = exec_id {
                let details = ProcessDetails {
                    exec_id,
                    ..Default::default()
                };
                info.info = MessageField::some(
                    crate::any::pack(&details).map_err(|e| Error::Other(format!("pids: {e}")))?,
                );
            }
            processes.push(info);
        }
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn do_pause(&self, id: &str, pause: bool) -> Result<()> {
        let handle = self.container(id)?;
        let mut c = handle.lock().await;
        c.pause(pause).await?;
        if pause {
            self.shared
                .events
                .send(TaskPaused {
                    container_id: id.to_string(),
                    ..Default::default()
                })
                .await;
        } else {
            self.shared
                .events
                .send(TaskResumed {
                    container_id: id.to_string(),
                    ..Default::default()
                })
                .await;
        }
        Ok(())
    }

    async fn do_checkpoint(&self, req: api::CheckpointTaskRequest) -> Result<()> {
        let checkpoint = CheckpointRequest::try_from(&req)?;
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        c.checkpoint(checkpoint).await
    }
}

impl TryFrom<&api::CheckpointTaskRequest> for CheckpointRequest {
    type Error = Error;

    fn try_from(req: &api::CheckpointTaskRequest) -> Result<Self> {
        let opts = match req.options.as_ref() {
            Some(any) if !any.value.is_empty() => CheckpointOptions::parse_from_bytes(&any.value)
                .map_err(|e| {
                Error::InvalidArgument(format!("checkpoint: malformed options: {e}"))
            })?,
            _ => CheckpointOptions::default(),
        };
        let image = PathBuf::from(if opts.image_path.is_empty() {
            &req.path
        } else {
            &opts.image_path
        });
        if image.as_os_str().is_empty() {
            return Err(Error::InvalidArgument(
                "checkpoint: no image path given".into(),
            ));
        }
        Ok(CheckpointRequest {
            image,
            work: (!opts.work_path.is_empty()).then(|| PathBuf::from(&opts.work_path)),
            flags: CheckpointFlags {
                leave_running: !opts.exit,
                tcp_established: opts.open_tcp,
                ext_unix_sk: opts.external_unix_sockets,
                file_locks: opts.file_locks,
                shell_job: opts.terminal,
                manage_cgroups_mode: (!opts.cgroups_mode.is_empty())
                    .then(|| opts.cgroups_mode.clone()),
            },
        })
    }
}

impl TryFrom<&api::CreateTaskRequest> for CreateRequest {
    type Error = Error;

    fn try_from(req: &api::CreateTaskRequest) -> Result<Self> {
        Ok(CreateRequest {
            id: req.id.clone(),
            bundle: PathBuf::from(&req.bundle),
            rootfs: req
                .rootfs
                .iter()
                .map(|m| RootMount {
                    kind: m.type_.clone(),
                    source: m.source.clone(),
                    options: m.options.to_vec(),
                })
                .collect(),
            stdio: Stdio::new(&req.stdin, &req.stdout, &req.stderr, req.terminal),
            checkpoint: (!req.checkpoint.is_empty()).then(|| PathBuf::from(&req.checkpoint)),
            config: options::from_any(req.options.as_ref())?,
        })
    }
}

/// The TaskCreate event of `req`, whose init has `pid`.
fn task_create(req: api::CreateTaskRequest, pid: i32) -> TaskCreate {
    TaskCreate {
        container_id: req.id,
        bundle: req.bundle,
        rootfs: req.rootfs,
        io: MessageField::some(TaskIO {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            terminal: req.terminal,
            ..Default::default()
        }),
        checkpoint: req.checkpoint,
        pid: pid as u32,
        ..Default::default()
    }
}

fn already_exists(id: &str) -> Error {
    Error::AlreadyExists(format!("create: container {id} already exists"))
}

#[async_trait]
impl Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        Ok(self.do_create(req).await?)
    }

    async fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        Ok(self.do_start(req).await?)
    }

    async fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        Ok(self.do_delete(req).await?)
    }

    async fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        Ok(self.do_state(req).await?)
    }

    async fn pids(
        &self,
        _ctx: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        Ok(self.do_pids(req).await?)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<Empty> {
        self.do_pause(&req.id, true).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<Empty> {
        self.do_pause(&req.id, false).await?;
        Ok(Empty::new())
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        req: api::CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        self.do_checkpoint(req).await?;
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<Empty> {
        let handle = self.container(&req.id)?;
        let bundle = handle.lock().await.bundle.clone();
        if req.exec_id.is_empty() && req.signal != 0 && is_cri_sandbox(&bundle) {
            self.shared.cancel_restores_beside(&req.id).await;
        }
        let c = handle.lock().await;
        c.kill(&req.exec_id, req.signal, req.all).await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<Empty> {
        let handle = self.container(&req.id)?;
        let mut c = handle.lock().await;
        let spec = req
            .spec
            .as_ref()
            .map(|a| a.value.as_slice())
            .unwrap_or_default();
        let stdio = Stdio::new(&req.stdin, &req.stdout, &req.stderr, req.terminal);
        c.add_exec(&req.exec_id, stdio, spec)?;
        self.shared
            .events
            .send(TaskExecAdded {
                container_id: req.id,
                exec_id: req.exec_id,
                ..Default::default()
            })
            .await;
        Ok(Empty::new())
    }

    async fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<Empty> {
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        let p = c.process(&req.exec_id)?;
        if let Some(pty) = &p.pty {
            console::resize(pty, req.width, req.height)?;
        }
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<Empty> {
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        c.process(&req.exec_id)?.io.close_input();
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: api::UpdateTaskRequest) -> TtrpcResult<Empty> {
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        let resources = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        match serde_json::from_slice::<serde_json::Value>(&resources) {
            Ok(serde_json::Value::Object(_)) => {}
            Ok(_) => {
                return Err(
                    Error::InvalidArgument("update: resources: not an object".into()).into(),
                )
            }
            Err(e) => return Err(Error::InvalidArgument(format!("update: resources: {e}")).into()),
        }
        c.runc.update(&req.id, resources).await?;
        Ok(Empty::new())
    }

    async fn wait(
        &self,
        _ctx: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let rx = {
            let handle = self.container(&req.id)?;
            let c = handle.lock().await;
            c.process(&req.exec_id)?.exit_watch()
        };
        let exit = wait_exit(rx).await;
        Ok(api::WaitResponse {
            exit_status: exit.code as u32,
            exited_at: MessageField::some(convert_to_timestamp(Some(exit.at))),
            ..Default::default()
        })
    }

    async fn stats(
        &self,
        _ctx: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        let pid = {
            let handle = self.container(&req.id)?;
            let c = handle.lock().await;
            if c.init.status() == Status::Restoring {
                // CRIU is restoring: no process of the container exists yet.
                // CRI's ContainerStats fails on a missing answer, and kubelet
                // polls it during StartContainer, so answer zero usage.
                0
            } else {
                c.init.ensure_running("stats")?;
                c.init.pid as u32
            }
        };
        let metrics = if pid == 0 {
            crate::metrics::empty()
        } else {
            tokio::task::spawn_blocking(move || crate::metrics::collect(pid))
                .await
                .map_err(|e| Error::Other(format!("stats: {e}")))??
        };
        Ok(api::StatsResponse {
            stats: MessageField::some(metrics.to_any()?),
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = match self.container(&req.id) {
            Ok(handle) => handle.lock().await.init.pid as u32,
            Err(_) => 0,
        };
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, req: api::ShutdownRequest) -> TtrpcResult<Empty> {
        let empty = self
            .shared
            .containers
            .lock()
            .expect("containers lock")
            .is_empty();
        if req.now || empty {
            self.exit_signal.signal();
        } else {
            self.shutdown_pending.store(true, Ordering::SeqCst);
        }
        Ok(Empty::new())
    }
}

/// The task status containerd sees: a restore and its activation are
/// CREATED until the copy is visible.
fn wire_status(s: Status) -> api::Status {
    match s {
        Status::Created | Status::Restoring | Status::Activating => api::Status::CREATED,
        Status::Running => api::Status::RUNNING,
        Status::Paused => api::Status::PAUSED,
        Status::Stopped => api::Status::STOPPED,
    }
}

/// Whether the bundle's spec is a CRI pod sandbox (pause) container.
fn is_cri_sandbox(bundle: &Path) -> bool {
    std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|spec| spec["annotations"]["io.kubernetes.cri.container-type"] == "sandbox")
}
