//! The containerd task API (v3) served over ttrpc. This is the wire edge:
//! every request is converted into its domain request (requests.rs) and
//! handed to [`Container`] (and to the lifecycle for the init's start). Each container has its own lock;
//! the map of containers is locked only to look one up, never across an
//! await, so a long call on one container (a restore, a checkpoint) never
//! holds up another. Events go out in the order containerd expects (create,
//! start, exit, delete; exec added, exec started, exit): each is queued while
//! its container's lock is held.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::util::convert_to_timestamp;
use containerd_shim::{api, Task, TtrpcContext, TtrpcResult};
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskIO, TaskPaused, TaskResumed,
};
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim::oci::ProcessDetails;
use log::info;
use tokio::sync::Mutex;

use crate::console;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::events::Events;
use crate::exits::Exits;
use crate::lifecycle::create::{runc_cli, CreateRequest, Creator, MakeRunc};
use crate::process::{wait_exit, Status};
use crate::requests::{Checkpoint, Exec, Kill, ProcessRef, Resize, Shutdown, TaskId, Update};
use crate::shared::{ContainerRef, Shared};

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
    /// What drives each container's runc.
    make_runc: MakeRunc,
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
            make_runc: runc_cli(),
        }
    }

    /// The service with every container's runc driven by `make_runc`.
    #[cfg(test)]
    pub fn with_runc(self, make_runc: MakeRunc) -> Self {
        Self { make_runc, ..self }
    }

    fn container(&self, id: &str) -> Result<ContainerRef> {
        self.shared.get(id)
    }

    /// Creates the container of `req`; `event` is its TaskCreate, sent
    /// with the init's pid.
    async fn do_create(
        &self,
        req: CreateRequest,
        mut event: TaskCreate,
    ) -> Result<api::CreateTaskResponse> {
        if self.container(&req.id).is_ok() {
            return Err(already_exists(&req.id));
        }
        let creator = Creator {
            namespace: &self.namespace,
            containerd_address: &self.containerd_address,
            exits: &self.shared.exits,
            make_runc: &self.make_runc,
        };
        let mark = self.shared.exits.mark();
        let id = req.id.clone();
        let c = creator.create(req).await?;
        let pid = c.init.pid;
        // A restore's init has no pid before Start: its network namespace's
        // holder stands in (container_netns.rs).
        let created_pid = c.created_pid();
        let handle = Arc::new(Mutex::new(c));
        // Queued under the container's lock: TaskCreate before its exit.
        let guard = handle.lock().await;
        {
            let mut map = self.shared.containers.lock().expect("containers lock");
            if map.contains_key(&id) {
                return Err(already_exists(&id));
            }
            map.insert(id.clone(), handle.clone());
            self.shutdown_pending.store(false, Ordering::SeqCst);
        }
        if pid != 0 {
            self.shared.watch(&id, "", pid, mark);
        }
        info!("created {id} (pid {created_pid})");
        event.pid = created_pid as u32;
        self.shared.events.send(event).await;
        drop(guard);
        Ok(api::CreateTaskResponse {
            pid: created_pid as u32,
            ..Default::default()
        })
    }

    async fn do_start(&self, req: ProcessRef) -> Result<api::StartResponse> {
        let handle = self.container(&req.id)?;
        let mark = self.shared.exits.mark();
        let pid = if req.is_init() {
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

    async fn do_delete(&self, req: ProcessRef) -> Result<api::DeleteResponse> {
        let handle = self.container(&req.id)?;
        let mut c = handle.lock().await;
        if !req.is_init() {
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

    async fn do_state(&self, req: ProcessRef) -> Result<api::StateResponse> {
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        let p = c.process(&req.exec_id)?;
        let (exit_status, exited_at) = p.exit_status();
        // The init of a restore not yet started: its namespace's holder,
        // as Create said (containerd asks State for the pid it answers).
        let pid = if req.exec_id.is_empty() {
            c.created_pid()
        } else {
            p.pid
        };
        Ok(api::StateResponse {
            id: req.id.clone(),
            bundle: c.bundle.display().to_string(),
            pid: pid as u32,
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

    async fn do_pids(&self, TaskId(id): TaskId) -> Result<api::PidsResponse> {
        let handle = self.container(&id)?;
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

    async fn do_checkpoint(&self, req: Checkpoint) -> Result<()> {
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        c.checkpoint(req.request).await
    }

    async fn do_kill(&self, req: Kill) -> Result<()> {
        let handle = self.container(&req.process.id)?;
        let sandbox = handle.lock().await.spec.is_cri_sandbox();
        if req.process.is_init() && req.signal != 0 && sandbox {
            self.shared.cancel_restores_beside(&req.process.id).await;
        }
        let c = handle.lock().await;
        c.kill(&req.process.exec_id, req.signal, req.all).await
    }

    async fn do_exec(&self, req: Exec) -> Result<()> {
        let ProcessRef { id, exec_id } = req.process;
        let handle = self.container(&id)?;
        let mut c = handle.lock().await;
        c.add_exec(&exec_id, req.stdio, &req.spec)?;
        self.shared
            .events
            .send(TaskExecAdded {
                container_id: id,
                exec_id,
                ..Default::default()
            })
            .await;
        Ok(())
    }

    async fn do_stats(&self, TaskId(id): TaskId) -> Result<api::StatsResponse> {
        let pid = {
            let handle = self.container(&id)?;
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
            crate::cgroup_stats::empty()
        } else {
            tokio::task::spawn_blocking(move || crate::cgroup_stats::collect(pid))
                .await
                .map_err(|e| Error::Other(format!("stats: {e}")))??
        };
        Ok(api::StatsResponse {
            stats: MessageField::some(metrics.to_any()?),
            ..Default::default()
        })
    }
}

/// The TaskCreate event of `req` (its init's pid set once created).
fn task_create(req: api::CreateTaskRequest) -> TaskCreate {
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
        let create = CreateRequest::try_from(&req)?;
        Ok(self.do_create(create, task_create(req)).await?)
    }

    async fn start(
        &self,
        _ctx: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        Ok(self.do_start(ProcessRef::try_from(&req)?).await?)
    }

    async fn delete(
        &self,
        _ctx: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        Ok(self.do_delete(ProcessRef::try_from(&req)?).await?)
    }

    async fn state(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        Ok(self.do_state(ProcessRef::try_from(&req)?).await?)
    }

    async fn pids(
        &self,
        _ctx: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        Ok(self.do_pids(TaskId::try_from(&req)?).await?)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<Empty> {
        let TaskId(id) = TaskId::try_from(&req)?;
        self.do_pause(&id, true).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<Empty> {
        let TaskId(id) = TaskId::try_from(&req)?;
        self.do_pause(&id, false).await?;
        Ok(Empty::new())
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        req: api::CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        self.do_checkpoint(Checkpoint::try_from(&req)?).await?;
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<Empty> {
        self.do_kill(Kill::try_from(&req)?).await?;
        Ok(Empty::new())
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: api::ExecProcessRequest) -> TtrpcResult<Empty> {
        self.do_exec(Exec::try_from(&req)?).await?;
        Ok(Empty::new())
    }

    async fn resize_pty(
        &self,
        _ctx: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<Empty> {
        let req = Resize::try_from(&req)?;
        let handle = self.container(&req.process.id)?;
        let c = handle.lock().await;
        let p = c.process(&req.process.exec_id)?;
        if let Some(pty) = &p.pty {
            console::resize(pty, req.width, req.height)?;
        }
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: api::CloseIORequest) -> TtrpcResult<Empty> {
        let req = ProcessRef::try_from(&req)?;
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        c.process(&req.exec_id)?.io.close_input();
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: api::UpdateTaskRequest) -> TtrpcResult<Empty> {
        let req = Update::try_from(&req)?;
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
        c.runc.update(&req.id, req.resources).await?;
        Ok(Empty::new())
    }

    async fn wait(
        &self,
        _ctx: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let req = ProcessRef::try_from(&req)?;
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
        Ok(self.do_stats(TaskId::try_from(&req)?).await?)
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let TaskId(id) = TaskId::try_from(&req)?;
        let task_pid = match self.container(&id) {
            // containerd's answer to Create asks this (shimTask.PID).
            Ok(handle) => handle.lock().await.created_pid() as u32,
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
        let Shutdown { now } = Shutdown::try_from(&req)?;
        let empty = self
            .shared
            .containers
            .lock()
            .expect("containers lock")
            .is_empty();
        if now || empty {
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

#[cfg(test)]
#[path = "task_tests.rs"]
mod tests;
