//! The shim process's lifecycle: the `start` and `delete` shim commands,
//! `-info`, and the long-running server that hosts the task service.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cleanup;
use crate::events::Events;
use crate::exits::Exits;
use crate::lifecycle::create::runc_root;
use crate::task::TaskService;
use async_trait::async_trait;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::{spawn, ExitSignal, Shim};
use containerd_shim::util::{convert_to_timestamp, write_str_to_file};
use containerd_shim::{api, Config, Flags, StartOpts};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::types::introspection::RuntimeInfo;

/// The annotation CRI puts on every container of a pod: one shim per pod.
const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

pub struct Service {
    id: String,
    namespace: String,
    /// containerd's own socket (`-address`).
    address: String,
    exit: Arc<ExitSignal>,
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Service {
            id: args.id.clone(),
            namespace: args.namespace.clone(),
            address: args.address.clone(),
            exit: Arc::default(),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // containerd starts us in the bundle: group a pod's containers in one shim.
        let grouping = cleanup::read_spec(std::path::Path::new("."))
            .ok()
            .and_then(|spec| spec["annotations"][SANDBOX_ID].as_str().map(String::from))
            .unwrap_or_else(|| opts.id.clone());
        let address = spawn(opts, &grouping, Vec::new()).await?;
        write_str_to_file("address", &address).await?;
        Ok(address)
    }

    /// Cleans up after a shim that died: containerd runs `delete` in the
    /// bundle. What the shim recorded there (cleanup.rs) says which runc to
    /// ask and what was in flight; runc and CRIU are stopped and their mounts
    /// undone before runc's state goes.
    async fn delete_shim(&mut self) -> containerd_shim::Result<api::DeleteResponse> {
        let bundle = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        let config = crate::options::from_any(None).unwrap_or_default();
        let fallback = cleanup::default_runc(
            config.runc_binary,
            runc_root(config.runc_root.as_deref(), &bundle, &self.namespace),
            config.systemd_cgroup,
        )
        .await;
        cleanup::dead_shim_delete(&bundle, &self.id, fallback).await;
        Ok(api::DeleteResponse {
            exited_at: MessageField::some(convert_to_timestamp(Some(
                time::OffsetDateTime::now_utc(),
            ))),
            // As containerd's runc shim: the task was killed.
            exit_status: 128 + libc::SIGKILL as u32,
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let exits = Exits::start().await;
        TaskService::new(
            Events::new(publisher, &self.namespace),
            exits,
            self.exit.clone(),
            &self.namespace,
            &self.address,
        )
    }

    fn runtime_info(
        runtime_id: &str,
        options: Option<&Any>,
    ) -> containerd_shim::Result<RuntimeInfo> {
        Ok(crate::info::runtime_info(runtime_id, options))
    }
}
