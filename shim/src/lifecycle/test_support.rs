//! What the lifecycle's unit tests build alike: a plan's shared part, and
//! a container the fakes run (fakes.rs) with the shared state its start
//! works in.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use containerd_shim::asynchronous::io::Stdio;
use tokio::sync::Mutex;
use vsnap_artifact::{ArtifactName, Tools, Workload};

use crate::container::{Container, CreateConfig};
use crate::exits::Exits;
use crate::fakes::{self, FakeEvents, FakeRunc};
use crate::init_start::InitStart;
use crate::shared::{ContainerRef, Shared};
use crate::snapshot::engine_argv::Profile;
use crate::snapshot::plan::common::Listen;
use crate::snapshot::plan::Common;

/// The part both plans share, of artifact `artifact` under `root`.
pub fn common(root: &Path, artifact: &str) -> Common {
    Common {
        artifact: ArtifactName::new(artifact).unwrap(),
        root: root.to_path_buf(),
        workload: Workload {
            argv: vec!["/engine".into()],
            env: Default::default(),
            rootfs: String::new(),
            image: String::new(),
            image_digest: String::new(),
            namespace: "default".into(),
            kubernetes_namespace: None,
            security: Default::default(),
            per_pod_env: Vec::new(),
            fingerprint_key: "host".into(),
        },
        tools: Tools::default(),
        profile: Profile::Startup,
        listen: Listen {
            host: None,
            port: 8000,
        },
        control_dir: root.join("control"),
        control_owner: (0, 0),
        api_key: None,
        gpus: Vec::new(),
        host_shm: None,
        activation_timeout: Duration::from_secs(60),
        activation_source: "activation_timeout_s",
        netns: None,
        tree: None,
    }
}

/// Container `id`, bundled in `dir`, whose init starts as `start`, on the
/// fake `runc`; the shared state (its events to a fake sender) holding it.
pub async fn container(
    dir: &Path,
    id: &str,
    start: InitStart,
    runc: Arc<FakeRunc>,
    exits: &Exits,
) -> (ContainerRef, Shared, Arc<FakeEvents>) {
    let (events, sender) = FakeEvents::new();
    let bundle = fakes::bundle(dir, id, serde_json::json!({}));
    let c = Container::create(CreateConfig {
        id: id.into(),
        bundle,
        rootfs: Vec::new(),
        stdio: Stdio::new("", "", "", false),
        runc,
        no_pivot: false,
        start,
        spec: serde_json::json!({}).into(),
    })
    .await
    .unwrap();
    let handle = Arc::new(Mutex::new(c));
    let shared = Shared {
        containers: Arc::new(std::sync::Mutex::new(HashMap::from([(
            id.to_string(),
            handle.clone(),
        )]))),
        events: sender,
        exits: exits.clone(),
    };
    (handle, shared, events)
}
