//! The CRI client: kubelet's calls, each blocking on a runtime of its own.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::*;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::snapshot_env::poll;

/// A CRI client: the runtime and image services on one connection, with a
/// runtime of its own so that tests stay synchronous and any thread can
/// hold one.
pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl Cri {
    pub fn connect(socket: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let path = socket.to_path_buf();
        let channel = rt
            .block_on(
                // The URI is required by tonic and unused by the connector.
                Endpoint::from_static("http://localhost").connect_with_connector(
                    tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(stream))
                        }
                    }),
                ),
            )
            .unwrap_or_else(|e| panic!("connect CRI at {}: {e}", socket.display()));
        Cri {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// The runtime service, to pass a call to [`Cri::call`].
    pub fn rs(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// The image service, to pass a call to [`Cri::call`].
    pub fn is(&self) -> ImageServiceClient<Channel> {
        self.images.clone()
    }

    /// Runs one CRI call to completion.
    pub fn call<T>(
        &self,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, tonic::Status> {
        self.rt.block_on(f).map(tonic::Response::into_inner)
    }

    pub fn status(&self) -> StatusResponse {
        self.call(self.rs().status(StatusRequest { verbose: false }))
            .expect("CRI Status")
    }

    pub fn run_pod(
        &self,
        config: &PodSandboxConfig,
        handler: &str,
    ) -> Result<String, tonic::Status> {
        self.call(self.rs().run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.into(),
        }))
        .map(|r| r.pod_sandbox_id)
    }

    pub fn create(
        &self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> Result<String, tonic::Status> {
        self.call(self.rs().create_container(CreateContainerRequest {
            pod_sandbox_id: pod.into(),
            config: Some(config),
            sandbox_config: Some(pod_config.clone()),
        }))
        .map(|r| r.container_id)
    }

    pub fn start(&self, id: &str) -> Result<(), tonic::Status> {
        self.call(self.rs().start_container(StartContainerRequest {
            container_id: id.into(),
        }))
        .map(drop)
    }

    pub fn stop(&self, id: &str, timeout_s: i64) -> Result<(), tonic::Status> {
        self.call(self.rs().stop_container(StopContainerRequest {
            container_id: id.into(),
            timeout: timeout_s,
        }))
        .map(drop)
    }

    pub fn remove(&self, id: &str) -> Result<(), tonic::Status> {
        self.call(self.rs().remove_container(RemoveContainerRequest {
            container_id: id.into(),
        }))
        .map(drop)
    }

    pub fn stop_pod(&self, pod: &str) -> Result<(), tonic::Status> {
        self.call(self.rs().stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.into(),
        }))
        .map(drop)
    }

    pub fn remove_pod(&self, pod: &str) -> Result<(), tonic::Status> {
        self.call(self.rs().remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod.into(),
        }))
        .map(drop)
    }

    pub fn container_status(&self, id: &str) -> ContainerStatus {
        self.call(self.rs().container_status(ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        }))
        .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
        .status
        .expect("a status")
    }

    /// The host pid of container `id`'s init (CRI's verbose info).
    pub fn container_pid(&self, id: &str) -> i32 {
        let info = self
            .call(self.rs().container_status(ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            }))
            .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
            .info;
        pid_of(&info, id)
    }

    /// The host pid of pod `pod`'s sandbox (pause) container.
    pub fn pod_pid(&self, pod: &str) -> i32 {
        pid_of(&self.pod_status(pod).info, pod)
    }

    pub fn state(&self, id: &str) -> ContainerState {
        self.container_status(id).state()
    }

    pub fn pod_status(&self, pod: &str) -> PodSandboxStatusResponse {
        self.call(self.rs().pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: pod.into(),
            verbose: true,
        }))
        .unwrap_or_else(|e| panic!("PodSandboxStatus {pod}: {e}"))
    }

    pub fn exec_sync(&self, id: &str, cmd: &[&str]) -> ExecSyncResponse {
        self.call(self.rs().exec_sync(ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 30,
        }))
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?} in {id}: {e}"))
    }

    pub fn stats(&self, id: &str) -> ContainerStats {
        self.call(self.rs().container_stats(ContainerStatsRequest {
            container_id: id.into(),
        }))
        .unwrap_or_else(|e| panic!("ContainerStats {id}: {e}"))
        .stats
        .expect("stats")
    }

    /// Waits until container `id` is EXITED; returns its status.
    pub fn wait_exited(&self, id: &str, timeout: Duration) -> ContainerStatus {
        poll(timeout, &format!("container {id} to exit"), || {
            self.state(id) == ContainerState::ContainerExited
        });
        self.container_status(id)
    }

    /// Waits until the image service knows `reference` (it learns about
    /// imports from containerd's events).
    pub fn wait_image(&self, reference: &str) {
        poll(
            Duration::from_secs(30),
            &format!("image {reference}"),
            || {
                self.call(self.is().image_status(ImageStatusRequest {
                    image: Some(ImageSpec {
                        image: reference.into(),
                        ..Default::default()
                    }),
                    verbose: false,
                }))
                .is_ok_and(|r| r.image.is_some())
            },
        );
    }
}

/// The `pid` of CRI's verbose `info` JSON.
fn pid_of(info: &std::collections::HashMap<String, String>, what: &str) -> i32 {
    let v: serde_json::Value =
        serde_json::from_str(info.get("info").map_or("{}", |s| s.as_str())).unwrap_or_default();
    v["pid"]
        .as_i64()
        .filter(|p| *p > 0)
        .unwrap_or_else(|| panic!("{what}: no pid in CRI's verbose info: {info:?}")) as i32
}
