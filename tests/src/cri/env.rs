//! A private containerd with CRI on: its CRI config, the images it is
//! given, pods and containers run on it, and what must be left after.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_cri::v1::*;

use super::client::Cri;
use super::request::{
    BUSYBOX_IMAGE, ENGINE_IMAGE, NAMESPACE, PAUSE_IMAGE, RUNC, VSNAP, VSNAP_FEATURES,
};
use crate::containerd::{list, runc_list, Containerd};
use crate::image::{busybox_rootfs, import_image_to};
use crate::snapshot_env::{poll, setup_on, Env};

static PODS: AtomicU32 = AtomicU32::new(0);

/// A private containerd with CRI on, set up for the snapshot plans
/// ([`Env`]: artifacts under its folder, `ConfigPath` of the `vsnap`
/// handler), and a CRI client on it.
pub struct CriEnv {
    pub env: Env,
    pub cri: Cri,
    /// Pod log folders go under this.
    pub logs: PathBuf,
    pod_cgroups: std::sync::Mutex<Vec<String>>,
}

impl std::ops::Deref for CriEnv {
    type Target = Env;
    fn deref(&self) -> &Env {
        &self.env
    }
}

/// The tables of the CRI plugin for an instance in `dir` (after the common
/// config, which keeps CRI on).
fn cri_config(dir: &Path) -> String {
    let d = dir.display();
    let cni = dir.join("cni");
    std::fs::create_dir_all(&cni).unwrap();
    // A subnet per instance: instances of parallel test runs route side by side.
    let n = crate::containerd::instance_number(dir);
    let subnet = format!("10.{}.{}.0/24", 200 + std::process::id() % 50, n % 250);
    let net = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "vsnap-test",
        "plugins": [{
            "type": "ptp",
            "ipMasq": false,
            "ipam": {
                "type": "host-local", "subnet": subnet, "dataDir": dir.join("cni-ipam"),
                // As a cluster's CNI does: the pod's default route is its
                // interface (an engine finds its own address by it).
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    });
    std::fs::write(cni.join("10-vsnap-test.conflist"), net.to_string()).unwrap();
    let cri = "plugins.\"io.containerd.cri.v1.runtime\"";
    let runtimes = format!("{cri}.containerd.runtimes");
    format!(
        r#"[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[{cri}]
  enable_cdi = false
  # Without CAP_SYS_RESOURCE (a test host may lack it), the pause
  # container's oom_score_adj of -998 cannot be set: keep containerd's.
  restrict_oom_score_adj = true
  [{cri}.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{d}/cni"
    max_conf_num = 1
  [{cri}.containerd]
    default_runtime_name = "{RUNC}"
    [{runtimes}.{RUNC}]
      runtime_type = "io.containerd.runc.v2"
      [{runtimes}.{RUNC}.options]
        Root = "{d}/state/runc-v2"
    [{runtimes}.{VSNAP}]
      runtime_type = "io.vsnap.v1"
      # CRI's own sandbox-namespace passes too: a pod that sets it must not
      # change its tenant (containerd sets it after the pass-through ones).
      pod_annotations = ["vsnap.io/*", "io.kubernetes.cri.sandbox-namespace"]
      container_annotations = ["vsnap.io/*", "io.kubernetes.cri.sandbox-namespace"]
      [{runtimes}.{VSNAP}.options]
        ConfigPath = "{d}/vsnap.toml"
    [{runtimes}.{VSNAP_FEATURES}]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim}"
      pod_annotations = ["vsnap.io/*"]
      container_annotations = ["vsnap.io/*"]
"#,
        shim = dir.join("bin").join(crate::containerd::SHIM_NAME).display(),
    )
}

impl CriEnv {
    /// Starts the instance, imports the pause, busybox and engine images
    /// into `k8s.io` and waits for CRI to report runtime and network ready.
    pub fn start(tag: &str) -> Self {
        let c = Containerd::start_with_cri(tag, cri_config);
        let env = setup_on(c);
        let logs = env.c.dir.join("logs");
        let cri = Cri::connect(&env.c.socket());
        let e = CriEnv {
            env,
            cri,
            logs,
            pod_cgroups: Default::default(),
        };
        e.import_images();
        poll(
            Duration::from_secs(30),
            "CRI runtime and network ready",
            || {
                let s = e.cri.status();
                s.status
                    .is_some_and(|s| s.conditions.iter().all(|c| c.status))
            },
        );
        e
    }

    fn import_images(&self) {
        let c = &self.env.c;
        let work = c.dir.join("images");
        // pause: a static binary of tests/pause/pause.c, alone in its image.
        let pause_root = work.join("pause/rootfs");
        std::fs::create_dir_all(&pause_root).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("pause/pause.c");
        let out = crate::cmd::run(
            {
                let mut cmd = Command::new("gcc");
                cmd.args(["-static", "-O2", "-o"])
                    .arg(pause_root.join("pause"))
                    .arg(&src);
                cmd
            },
            None,
            Duration::from_secs(60),
        );
        assert!(
            out.ok(),
            "build the pause binary from {}: {out:?}",
            src.display()
        );
        let pause = serde_json::json!({"Entrypoint": ["/pause"]});
        import_image_to(
            c,
            NAMESPACE,
            &work.join("pause"),
            &pause_root,
            PAUSE_IMAGE,
            pause,
        );
        let plain = serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]});
        let busybox = busybox_rootfs(&work.join("busybox"));
        import_image_to(
            c,
            NAMESPACE,
            &work.join("busybox"),
            &busybox,
            BUSYBOX_IMAGE,
            plain,
        );
        let engine = Path::new(&self.env.rootfs);
        let config = serde_json::json!({"Entrypoint": ["/vsnap-ref-engine"], "Env": ["PATH=/bin"]});
        import_image_to(
            c,
            NAMESPACE,
            &work.join("engine"),
            engine,
            ENGINE_IMAGE,
            config,
        );
        for image in [PAUSE_IMAGE, BUSYBOX_IMAGE, ENGINE_IMAGE] {
            self.cri.wait_image(image);
        }
    }

    /// A pod config with a unique name and uid, logs under [`CriEnv::logs`];
    /// `host_network`: the node's network namespace, else a CNI network.
    pub fn pod_config(
        &self,
        name: &str,
        host_network: bool,
        annotations: &[(&str, &str)],
    ) -> PodSandboxConfig {
        self.pod_config_in("default", name, host_network, annotations)
    }

    /// As [`CriEnv::pod_config`], for a pod of Kubernetes namespace `namespace`.
    pub fn pod_config_in(
        &self,
        namespace: &str,
        name: &str,
        host_network: bool,
        annotations: &[(&str, &str)],
    ) -> PodSandboxConfig {
        let n = PODS.fetch_add(1, Ordering::Relaxed);
        let uid = format!("{}-{}-{n}", std::process::id(), name);
        let log_directory = self.logs.join(&uid);
        std::fs::create_dir_all(&log_directory).unwrap();
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: uid.clone(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: if host_network {
                String::new()
            } else {
                name.into()
            },
            log_directory: log_directory.display().to_string(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            linux: Some(LinuxPodSandboxConfig {
                // As kubelet (cgroupfs driver) does: pod stats read this cgroup.
                cgroup_parent: self.pod_cgroup(&uid),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: if host_network {
                            NamespaceMode::Node
                        } else {
                            NamespaceMode::Pod
                        } as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pod-level cgroup (relative to each hierarchy) for pod `uid`; it
    /// is removed when the instance is dropped, as kubelet would.
    fn pod_cgroup(&self, uid: &str) -> String {
        let path = format!("/vsnap-cri-{uid}");
        self.pod_cgroups.lock().unwrap().push(path.clone());
        path
    }

    /// Runs a pod; panics naming the handler and the pod on failure.
    pub fn run_pod(&self, config: &PodSandboxConfig, handler: &str) -> String {
        self.cri.run_pod(config, handler).unwrap_or_else(|e| {
            panic!(
                "RunPodSandbox {:?} on {handler}: {e}\n{}",
                config.metadata.as_ref().map(|m| &m.name),
                self.c.log_tail()
            )
        })
    }

    /// Creates and starts a container; panics naming the phase on failure.
    pub fn run_container(
        &self,
        pod: &str,
        pod_config: &PodSandboxConfig,
        config: ContainerConfig,
    ) -> String {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let id = self
            .cri
            .create(pod, pod_config, config)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", self.c.log_tail()));
        self.cri
            .start(&id)
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", self.c.log_tail()));
        id
    }

    /// Stops and removes a pod; both must succeed.
    pub fn remove_pod(&self, pod: &str) {
        self.cri
            .stop_pod(pod)
            .unwrap_or_else(|e| panic!("StopPodSandbox {pod}: {e}\n{}", self.c.log_tail()));
        self.cri
            .remove_pod(pod)
            .unwrap_or_else(|e| panic!("RemovePodSandbox {pod}: {e}\n{}", self.c.log_tail()));
    }

    /// runc's state root of the vsnap shim for CRI's namespace.
    pub fn vsnap_runc_root(&self) -> PathBuf {
        self.c.dir.join("state/vsnap-runc").join(NAMESPACE)
    }

    /// After every pod was removed: no shim, no runc container (vsnap's
    /// and runc-v2's roots), no bundle, no mount under the instance, no
    /// control dir, no staging folder, no artifact lock held.
    pub fn assert_nothing_left(&self) {
        let t = std::time::Instant::now();
        poll(Duration::from_secs(20), "the vsnap shims to exit", || {
            let pids = self.c.shim_pids();
            if t.elapsed() > Duration::from_secs(19) {
                for pid in &pids {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    eprintln!("shim left: {stat}");
                }
            }
            pids.is_empty()
        });
        assert_eq!(
            runc_list(&self.vsnap_runc_root()),
            Vec::<String>::new(),
            "vsnap's runc"
        );
        assert_eq!(
            list(&self.vsnap_runc_root()),
            Vec::<String>::new(),
            "vsnap's runc state"
        );
        let runc_v2 = self.c.dir.join("state/runc-v2").join(NAMESPACE);
        assert_eq!(runc_list(&runc_v2), Vec::<String>::new(), "runc-v2's runc");
        assert_eq!(
            self.c.bundles_left_in(NAMESPACE, Duration::from_secs(30)),
            Vec::<String>::new(),
            "bundles"
        );
        assert_eq!(self.c.mounts(), Vec::<String>::new(), "mounts");
        assert_eq!(
            crate::snapshot_env::control_dirs(&self.artifacts),
            Vec::<String>::new(),
            "control dirs"
        );
        assert_eq!(self.staging_dirs(), Vec::<String>::new(), "staging");
        for name in self.artifact_names() {
            assert!(
                !vsnap_artifact::lock::ArtifactLock::is_held(&self.artifacts, &name).unwrap(),
                "artifact lock of {name} still held"
            );
        }
    }

    /// Stops and removes every pod CRI knows (what a failed test left).
    fn clean_up(&self) {
        let Ok(pods) = self.cri.call(
            self.cri
                .rs()
                .list_pod_sandbox(ListPodSandboxRequest { filter: None }),
        ) else {
            return;
        };
        for pod in pods.items {
            let _ = self.cri.stop_pod(&pod.id);
            let _ = self.cri.remove_pod(&pod.id);
        }
    }
}

impl Drop for CriEnv {
    fn drop(&mut self) {
        self.clean_up();
        for root in [
            self.vsnap_runc_root(),
            self.c.dir.join("state/runc-v2").join(NAMESPACE),
        ] {
            for id in runc_list(&root) {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force", &id])
                    .status();
            }
        }
        // The pod-level cgroups runc created as parents (kubelet's to remove).
        let base = Path::new("/sys/fs/cgroup");
        for cgroup in self.pod_cgroups.lock().unwrap().iter() {
            let relative = cgroup.trim_start_matches('/');
            for hierarchy in list(base) {
                let _ = std::fs::remove_dir(base.join(hierarchy).join(relative));
            }
            let _ = std::fs::remove_dir(base.join(relative));
        }
    }
}
