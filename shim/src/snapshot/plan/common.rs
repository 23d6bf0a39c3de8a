//! What a capture and a restore both hold: the artifact's name and root,
//! the workload's identity and the binaries the artifact depends on, and
//! the engine: how it speaks, where it listens, its control dir, its GPUs
//! and how long its activation may take.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vsnap_artifact::{self as artifact, ArtifactName, Tools, Workload};

use super::annotations::ACTIVATION_TIMEOUT;
use crate::deadline::Deadline;
use crate::snapshot::activation::canary::ApiKey;
use crate::snapshot::activation::target::Target;
use crate::snapshot::engine_argv::Profile;
use crate::snapshot::gpu::Gpu;

/// Where the engine listens (`vsnap.io/listen`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listen {
    /// `None`: every address (probed on loopback).
    pub host: Option<String>,
    pub port: u16,
}

/// The part of a prepared plan both directions share.
#[derive(Clone, Debug)]
pub struct Common {
    /// The artifact's name: from the annotation, or derived from the
    /// workload's identity for `auto`.
    pub artifact: ArtifactName,
    /// The artifact root (`artifact_root`).
    pub root: PathBuf,
    /// What identifies the workload (taken from the spec at create); its
    /// tenant is the container's.
    pub workload: Workload,
    /// The binaries the artifact depends on.
    pub tools: Tools,
    /// How the engine speaks with vsnap.
    pub profile: Profile,
    pub listen: Listen,
    /// The container's control dir, mounted into it.
    pub control_dir: PathBuf,
    /// The (uid, gid) the control dir and the files vsnap puts in it belong
    /// to: the engine's (`process.user`, as the host sees it), so that an
    /// engine that is not root can use it.
    pub control_owner: (u32, u32),
    /// The key the engine's API requires (`--api-key`, `VLLM_API_KEY`),
    /// for vsnap's HTTP canary of the barrier profile. Redacted in Debug.
    pub api_key: Option<ApiKey>,
    /// The container's GPUs, when it has NVIDIA devices.
    pub gpus: Vec<Gpu>,
    /// The host folder mounted at /dev/shm, when it is one.
    pub host_shm: Option<PathBuf>,
    /// How long an activation (a restored copy's, or a donor's) may take.
    pub activation_timeout: Duration,
    /// Where that bound came from (the annotation or a config key).
    pub activation_source: &'static str,
    /// The bundle's file the container's own network namespace is bound at
    /// (netns_holder.rs), when the spec gave it one without a path.
    pub netns: Option<PathBuf>,
    /// A restore streamed from a registry: the pull's partial tree, which
    /// it reads instead of `<root>/<artifact>` (registry/stream.rs).
    pub tree: Option<PathBuf>,
}

impl Common {
    /// Where the artifact's files are read: `<root>/<artifact>`, or the
    /// partial tree of the pull a streamed restore reads.
    pub fn artifact_dir(&self) -> PathBuf {
        match &self.tree {
            Some(tree) => tree.clone(),
            None => artifact::path(&self.root, self.artifact.as_str()),
        }
    }

    /// The activation deadline, from now. A restore's Start runs CRIU's
    /// restore and then the activation within this one deadline.
    pub fn activation_deadline(&self) -> Deadline {
        Deadline::new(
            Instant::now() + self.activation_timeout,
            format!(
                "the activation timeout of {}s ({})",
                self.activation_timeout.as_secs(),
                self.activation_source
            ),
        )
    }

    /// The engine an activation of container `container`'s init `pid` wakes.
    pub fn target(&self, container: &str, pid: i32) -> Target {
        Target {
            container: container.to_string(),
            pid,
            control_dir: self.control_dir.clone(),
            owner: self.control_owner.0,
            host: self.listen.host.clone(),
            port: self.listen.port,
        }
    }

    /// Removes what create prepared for the plan (its control dir).
    pub fn cleanup(&self) {
        crate::snapshot::remove_control_dir(&self.control_dir);
    }
}

/// The activation bound: the annotation's, else the config's (a GPU
/// engine's is longer), with where it came from.
pub(super) fn activation_timeout(
    asked: Option<Duration>,
    config: &vsnap_config::RuntimeConfig,
    gpus: &[Gpu],
) -> (Duration, &'static str) {
    match (asked, gpus.is_empty()) {
        (Some(t), _) => (t, ACTIVATION_TIMEOUT),
        (None, true) => (
            Duration::from_secs(config.activation_timeout_s),
            "activation_timeout_s",
        ),
        (None, false) => (
            Duration::from_secs(config.gpu_activation_timeout_s),
            "gpu_activation_timeout_s",
        ),
    }
}
