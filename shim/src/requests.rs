//! The task API's requests converted at the edge: each ttrpc request the
//! service handles becomes the domain request its handler takes
//! (`TryFrom`), refused here when malformed, so task.rs and what it calls
//! never read a wire field. Replies and events stay in task.rs.

use std::path::PathBuf;

use containerd_shim::api;
use containerd_shim::asynchronous::io::Stdio;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::shim::oci::CheckpointOptions;

use crate::container::CheckpointRequest;
use crate::error::{Error, Result};
use crate::lifecycle::create::CreateRequest;
use crate::options;
use crate::runc::CheckpointFlags;
use crate::snapshot::rootfs::RootMount;

/// A whole task, by container id (Pids, Pause, Resume, Stats, Connect).
pub struct TaskId(pub String);

/// One process of a container: its init (an empty exec id) or an exec
/// (Start, Delete, State, Wait, CloseIO).
pub struct ProcessRef {
    pub id: String,
    pub exec_id: String,
}

impl ProcessRef {
    pub fn is_init(&self) -> bool {
        self.exec_id.is_empty()
    }
}

/// A signal for a process (or, with `all`, every process of the task).
pub struct Kill {
    pub process: ProcessRef,
    pub signal: u32,
    pub all: bool,
}

/// An exec to register: its stdio and its OCI process spec (JSON).
pub struct Exec {
    pub process: ProcessRef,
    pub stdio: Stdio,
    pub spec: Vec<u8>,
}

/// A terminal's new size.
pub struct Resize {
    pub process: ProcessRef,
    pub width: u32,
    pub height: u32,
}

/// New resources for a task: OCI LinuxResources, checked to be a JSON
/// object.
pub struct Update {
    pub id: String,
    pub resources: Vec<u8>,
}

/// A CheckpointTask of container `id`.
pub struct Checkpoint {
    pub id: String,
    pub request: CheckpointRequest,
}

/// Shutdown: now, or once the last container is deleted.
pub struct Shutdown {
    pub now: bool,
}

/// `TryFrom<&Wire>` for a domain type built only from the request's
/// container id and exec id.
macro_rules! process_of {
    ($($wire:ty),* $(,)?) => {
        $(impl TryFrom<&$wire> for ProcessRef {
            type Error = Error;

            fn try_from(req: &$wire) -> Result<Self> {
                Ok(ProcessRef {
                    id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                })
            }
        })*
    };
}

process_of!(
    api::StartRequest,
    api::DeleteRequest,
    api::StateRequest,
    api::WaitRequest,
    api::CloseIORequest,
);

macro_rules! task_of {
    ($($wire:ty),* $(,)?) => {
        $(impl TryFrom<&$wire> for TaskId {
            type Error = Error;

            fn try_from(req: &$wire) -> Result<Self> {
                Ok(TaskId(req.id.clone()))
            }
        })*
    };
}

task_of!(
    api::PidsRequest,
    api::PauseRequest,
    api::ResumeRequest,
    api::StatsRequest,
    api::ConnectRequest,
);

impl TryFrom<&api::KillRequest> for Kill {
    type Error = Error;

    fn try_from(req: &api::KillRequest) -> Result<Self> {
        Ok(Kill {
            process: ProcessRef {
                id: req.id.clone(),
                exec_id: req.exec_id.clone(),
            },
            signal: req.signal,
            all: req.all,
        })
    }
}

impl TryFrom<&api::ExecProcessRequest> for Exec {
    type Error = Error;

    fn try_from(req: &api::ExecProcessRequest) -> Result<Self> {
        Ok(Exec {
            process: ProcessRef {
                id: req.id.clone(),
                exec_id: req.exec_id.clone(),
            },
            stdio: Stdio::new(&req.stdin, &req.stdout, &req.stderr, req.terminal),
            spec: req
                .spec
                .as_ref()
                .map(|a| a.value.clone())
                .unwrap_or_default(),
        })
    }
}

impl TryFrom<&api::ResizePtyRequest> for Resize {
    type Error = Error;

    fn try_from(req: &api::ResizePtyRequest) -> Result<Self> {
        Ok(Resize {
            process: ProcessRef {
                id: req.id.clone(),
                exec_id: req.exec_id.clone(),
            },
            width: req.width,
            height: req.height,
        })
    }
}

impl TryFrom<&api::UpdateTaskRequest> for Update {
    type Error = Error;

    fn try_from(req: &api::UpdateTaskRequest) -> Result<Self> {
        let resources = req
            .resources
            .as_ref()
            .map(|a| a.value.clone())
            .unwrap_or_default();
        match serde_json::from_slice::<serde_json::Value>(&resources) {
            Ok(serde_json::Value::Object(_)) => Ok(Update {
                id: req.id.clone(),
                resources,
            }),
            Ok(_) => Err(Error::InvalidArgument(
                "update: resources: not an object".into(),
            )),
            Err(e) => Err(Error::InvalidArgument(format!("update: resources: {e}"))),
        }
    }
}

impl TryFrom<&api::ShutdownRequest> for Shutdown {
    type Error = Error;

    fn try_from(req: &api::ShutdownRequest) -> Result<Self> {
        Ok(Shutdown { now: req.now })
    }
}

impl TryFrom<&api::CheckpointTaskRequest> for Checkpoint {
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
        let request = CheckpointRequest {
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
        };
        Ok(Checkpoint {
            id: req.id.clone(),
            request,
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

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::well_known_types::any::Any;
    use containerd_shim_protos::protobuf::MessageField;

    fn any(value: Vec<u8>) -> MessageField<Any> {
        MessageField::some(Any {
            value,
            ..Default::default()
        })
    }

    #[test]
    fn an_update_takes_only_a_json_object() {
        let req = |v: &[u8]| api::UpdateTaskRequest {
            id: "c1".into(),
            resources: any(v.to_vec()),
            ..Default::default()
        };
        let ok = Update::try_from(&req(br#"{"cpu":{"shares":512}}"#)).unwrap();
        assert_eq!(ok.id, "c1");
        assert_eq!(ok.resources, br#"{"cpu":{"shares":512}}"#);
        for bad in [&b"[1]"[..], b"not json", b""] {
            let e = Update::try_from(&req(bad)).err().expect("refused");
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        }
    }

    #[test]
    fn a_checkpoint_needs_an_image_and_its_options_choose_the_flags() {
        let none = api::CheckpointTaskRequest {
            id: "c1".into(),
            ..Default::default()
        };
        let e = Checkpoint::try_from(&none).err().expect("no image path");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");

        let opts = CheckpointOptions {
            exit: true,
            open_tcp: true,
            image_path: "/img".into(),
            work_path: "/work".into(),
            cgroups_mode: "soft".into(),
            ..Default::default()
        };
        let req = api::CheckpointTaskRequest {
            id: "c1".into(),
            path: "/ignored".into(),
            options: any(opts.write_to_bytes().unwrap()),
            ..Default::default()
        };
        let c = Checkpoint::try_from(&req).unwrap();
        assert_eq!(c.id, "c1");
        assert_eq!(c.request.image, PathBuf::from("/img"));
        assert_eq!(c.request.work, Some(PathBuf::from("/work")));
        let f = &c.request.flags;
        assert!(!f.leave_running && f.tcp_established && !f.shell_job);
        assert_eq!(f.manage_cgroups_mode.as_deref(), Some("soft"));

        let garbage = api::CheckpointTaskRequest {
            path: "/img".into(),
            options: any(vec![0xff, 0xff, 0xff]),
            ..Default::default()
        };
        let e = Checkpoint::try_from(&garbage).err().expect("malformed");
        assert!(e.to_string().contains("malformed options"), "{e}");
    }

    #[test]
    fn kill_exec_and_resize_keep_the_process_and_their_fields() {
        let k = Kill::try_from(&api::KillRequest {
            id: "c1".into(),
            exec_id: "e1".into(),
            signal: 9,
            all: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (k.process.id.as_str(), k.process.exec_id.as_str()),
            ("c1", "e1")
        );
        assert!(!k.process.is_init() && k.signal == 9 && k.all);
        let x = Exec::try_from(&api::ExecProcessRequest {
            id: "c1".into(),
            exec_id: "e1".into(),
            terminal: true,
            spec: any(b"{}".to_vec()),
            ..Default::default()
        })
        .unwrap();
        assert!(x.stdio.terminal);
        assert_eq!(x.spec, b"{}");
        let r = Resize::try_from(&api::ResizePtyRequest {
            id: "c1".into(),
            width: 80,
            height: 24,
            ..Default::default()
        })
        .unwrap();
        assert!(r.process.is_init());
        assert_eq!((r.width, r.height), (80, 24));
    }
}
