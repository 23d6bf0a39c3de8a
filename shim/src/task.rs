//! The containerd task API (v3) served over ttrpc. This is the wire edge:
//! requests are unwrapped here and handed to [`Container`] (and to
//! [`crate::start`] for the init's start). Each container has its own lock;
//! the map of containers is locked only to look one up, never across an
//! await, so a long call on one container (a restore, a checkpoint) never
//! holds up another. Events go out in the order containerd expects (create,
//! start, exit, delete; exec added, exec started, exit): each is queued while
//! its container's lock is held.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::io::Stdio;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::util::{convert_to_any, convert_to_timestamp};
use containerd_shim::{api, Task, TtrpcContext, TtrpcResult};
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskIO, TaskPaused, TaskResumed,
};
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim::oci::{CheckpointOptions, ProcessDetails};
use log::{info, warn};
use tokio::sync::Mutex;

use crate::cleanup;
use crate::console;
use crate::container::{Container, CreateConfig};
use crate::error::{Error, Result};
use crate::events::Events;
use crate::exits::Exits;
use crate::labels;
use crate::lifecycle::InitStart;
use crate::options;
use crate::process::{wait_exit, Status};
use crate::runc::{CheckpointFlags, CriuTools, Runc};
use crate::shared::{ContainerRef, Shared};
use crate::snapshot::Snapshot;

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

    /// The pod's sandbox is being killed (CRI's StopPodSandbox): restores
    /// of the pod's other containers in this shim are cancelled, as a kill
    /// of each would. CRI's StopContainer does nothing to a container whose
    /// StartContainer has not returned, so without this a restore would
    /// finish into a pod whose sandbox is gone and come up RUNNING, or fail
    /// on the vanished namespaces with a CRIU error instead of saying why.
    async fn cancel_restores_beside(&self, sandbox: &str) {
        let others: Vec<ContainerRef> = self
            .shared
            .containers
            .lock()
            .expect("containers lock")
            .iter()
            .filter(|(id, _)| id.as_str() != sandbox)
            .map(|(_, c)| c.clone())
            .collect();
        for other in others {
            let c = other.lock().await;
            if let Some(cancel) = &c.starting {
                info!(
                    "{}: restore cancelled: pod sandbox {sandbox} is being stopped",
                    c.id
                );
                cancel.cancel();
            }
        }
    }

    /// The `vsnap.io/` settings: the spec's annotations, over the container's
    /// and its image's labels (read from containerd unless the annotations
    /// already choose a plan, or `read_labels` is off).
    async fn snapshot_settings(
        &self,
        bundle: &Path,
        id: &str,
        config: &vsnap_config::RuntimeConfig,
    ) -> Result<HashMap<String, String>> {
        let annotations = crate::snapshot::spec::annotations(bundle)?;
        if !config.read_labels
            || annotations.contains_key(crate::snapshot::plan::PLAN)
            || annotations.contains_key(crate::snapshot::plan::CRI_CONTAINER_TYPE)
            || self.containerd_address.is_empty()
        {
            return Ok(annotations);
        }
        let labels = match labels::vsnap_labels(&self.containerd_address, &self.namespace, id).await
        {
            Ok(labels) => labels,
            Err(e) => {
                warn!("{id}: labels not read ({e}): only annotations choose a snapshot plan");
                HashMap::new()
            }
        };
        Ok(labels::merge(annotations, labels))
    }

    /// For a snapshot container: its image's digest, part of its identity.
    async fn image_digest(
        &self,
        settings: &HashMap<String, String>,
        id: &str,
    ) -> Result<Option<String>> {
        let planned = settings
            .get(crate::snapshot::plan::PLAN)
            .is_some_and(|p| p != "off");
        if !planned || self.containerd_address.is_empty() {
            return Ok(None);
        }
        labels::image_digest(&self.containerd_address, &self.namespace, id)
            .await
            .map_err(|e| Error::FailedPrecondition(format!("create: image identity: {e}")))
    }

    async fn do_create(&self, req: api::CreateTaskRequest) -> Result<api::CreateTaskResponse> {
        if self.container(&req.id).is_ok() {
            return Err(already_exists(&req.id));
        }
        let config = options::from_any(req.options.as_ref())?;
        // The config can raise the shim's log level (containerd's -debug too).
        if log::max_level() < config.log_level.filter() {
            log::set_max_level(config.log_level.filter());
        }
        let bundle = PathBuf::from(&req.bundle);
        let runc = Runc {
            binary: config.runc_binary.clone(),
            root: runc_root(config.runc_root.as_deref(), &bundle, &self.namespace),
            systemd_cgroup: config.systemd_cgroup,
            log_dir: bundle.clone(),
            exits: self.shared.exits.clone(),
            criu: CriuTools::new(&config.criu_binary, &config.cuda_checkpoint),
        };
        let settings = self.snapshot_settings(&bundle, &req.id, &config).await?;
        // A restore from a registry reference whose artifact is not here
        // pulls it first (fetch.rs), so the preflight sees a local artifact.
        crate::snapshot::fetch::ensure_local(&req.id, &config, &settings).await?;
        let image_digest = self.image_digest(&settings, &req.id).await?;
        // Hashes of binaries, nvidia-smi, artifact and /dev/shm files: off
        // the runtime thread. The version probes and nvidia-smi spawned there
        // tolerate the shim's reaper collecting their exit first.
        let snapshot = {
            let (bundle, id, ns) = (bundle.clone(), req.id.clone(), self.namespace.clone());
            let config = config.clone();
            let layer = crate::snapshot::rootfs::WritableLayer::of(
                &req.rootfs
                    .iter()
                    .map(|m| crate::snapshot::rootfs::RootMount {
                        kind: m.type_.clone(),
                        source: m.source.clone(),
                        options: m.options.to_vec(),
                    })
                    .collect::<Vec<_>>(),
            );
            tokio::task::spawn_blocking(move || {
                Snapshot::prepare(
                    &bundle,
                    &id,
                    &ns,
                    &config,
                    &settings,
                    image_digest.as_deref(),
                    layer,
                )
            })
            .await
            .map_err(|e| Error::Other(format!("create: {e}")))??
        };
        // What a delete after this shim's death needs (cleanup.rs).
        let record = cleanup::Record {
            runc_binary: runc.binary.clone(),
            runc_root: runc.root.clone(),
            systemd_cgroup: runc.systemd_cgroup,
            control_dir: snapshot.as_ref().map(|s| s.control_dir.clone()),
        };
        if let Err(e) = record.write(&bundle) {
            if let Some(s) = &snapshot {
                s.cleanup();
            }
            return Err(Error::io(
                format!("create: write {}", bundle.join(cleanup::RECORD).display()),
                e,
            ));
        }
        let mark = self.shared.exits.mark();
        let start = InitStart::resolve(
            (!req.checkpoint.is_empty()).then(|| PathBuf::from(&req.checkpoint)),
            snapshot,
        )?;
        let c = Container::create(CreateConfig {
            id: req.id.clone(),
            bundle,
            rootfs: req.rootfs.clone(),
            stdio: Stdio::new(&req.stdin, &req.stdout, &req.stderr, req.terminal),
            runc,
            no_pivot: config.no_pivot_root,
            start,
        })
        .await?;
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
        self.shared
            .events
            .send(TaskCreate {
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
            })
            .await;
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
        let c = handle.lock().await;
        if c.init.status() == Status::Restoring {
            // CRIU is restoring: what works on the container is runc (and
            // CRIU under it). containerd, reconnecting after a restart,
            // takes a shim with no pids for a leaked one and deletes it.
            // Between runc's exit and the end of the page placement and the
            // verification, the restored init (stopped) is what is there.
            let mut pids = crate::inflight::in_flight_pids(&c.bundle);
            if pids.is_empty() {
                pids.extend(cleanup::restored_init_pid(&c.bundle));
            }
            let processes = pids
                .into_iter()
                .map(|pid| containerd_shim_protos::types::task::ProcessInfo {
                    pid: pid as u32,
                    ..Default::default()
                })
                .collect();
            return Ok(api::PidsResponse {
                processes,
                ..Default::default()
            });
        }
        let runc = c.runc.clone();
        let execs: HashMap<i32, String> = c
            .execs
            .values()
            .map(|p| (p.pid, p.exec_id.clone()))
            .collect();
        drop(c);
        let pids = runc.ps(&req.id).await?;
        let mut processes = Vec::with_capacity(pids.len());
        for pid in pids {
            let mut info = containerd_shim_protos::types::task::ProcessInfo {
                pid: pid as u32,
                ..Default::default()
            };
            if let Some(exec_id) = execs.get(&pid) {
                let details = ProcessDetails {
                    exec_id: exec_id.clone(),
                    ..Default::default()
                };
                info.info = MessageField::some(convert_to_any(Box::new(details))?);
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
        let opts = match req.options.as_ref() {
            Some(any) if !any.value.is_empty() => CheckpointOptions::parse_from_bytes(&any.value)
                .map_err(|e| {
                Error::InvalidArgument(format!("checkpoint: malformed options: {e}"))
            })?,
            _ => CheckpointOptions::default(),
        };
        let handle = self.container(&req.id)?;
        let c = handle.lock().await;
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
        let work = if opts.work_path.is_empty() {
            c.bundle.join("criu-work")
        } else {
            PathBuf::from(&opts.work_path)
        };
        std::fs::create_dir_all(&work)
            .map_err(|e| Error::io(format!("checkpoint: mkdir {}", work.display()), e))?;
        let flags = CheckpointFlags {
            leave_running: !opts.exit,
            tcp_established: opts.open_tcp,
            ext_unix_sk: opts.external_unix_sockets,
            file_locks: opts.file_locks,
            shell_job: opts.terminal || c.init.stdio.terminal,
            manage_cgroups_mode: (!opts.cgroups_mode.is_empty()).then(|| opts.cgroups_mode.clone()),
        };
        c.checkpoint(&image, &work, &flags).await
    }
}

fn already_exists(id: &str) -> Error {
    Error::AlreadyExists(format!("create: container {id} already exists"))
}

/// runc's state root for `namespace`: `<runc_root>/<namespace>` when the
/// runtime options name a root (as containerd's runc shim reads its Root
/// option); else one per containerd instance, beside containerd's own state,
/// so two containerds on one host never see each other's containers.
pub fn runc_root(configured: Option<&Path>, bundle: &Path, namespace: &str) -> PathBuf {
    match configured {
        Some(root) => root.join(namespace),
        None => runc_root_for(bundle, namespace),
    }
}

/// `<containerd state>/io.containerd.runtime.v2.task/<ns>/<id>` is the bundle;
/// runc's root goes beside containerd's own state: `<state>/vsnap-runc/<ns>`.
fn runc_root_for(bundle: &Path, namespace: &str) -> PathBuf {
    match bundle.ancestors().nth(3) {
        Some(state)
            if bundle
                .ancestors()
                .nth(2)
                .is_some_and(|t| t.ends_with("io.containerd.runtime.v2.task")) =>
        {
            state.join("vsnap-runc").join(namespace)
        }
        _ => PathBuf::from("/run/vsnap/runc").join(namespace),
    }
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
            self.cancel_restores_beside(&req.id).await;
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
        serde_json::from_slice::<oci_spec::runtime::LinuxResources>(&resources)
            .map_err(|e| Error::InvalidArgument(format!("update: resources: {e}")))?;
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
