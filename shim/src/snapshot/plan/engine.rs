//! What create hands the preparation ([`Inputs`]) and what it reads of
//! the engine from the spec ([`Engine`]): the workload's identity keyed
//! with the host's or the fleet's key, the command (its line, environment
//! and profile, as engine_argv/ reads them), the container's GPUs, the
//! binaries an artifact depends on.

use std::collections::HashMap;
use std::path::Path;

use vsnap_artifact::{self as artifact, Tenant, Tools, Workload};
use vsnap_config::RuntimeConfig;

use super::annotations::{AfterCapture, Plan, AFTER_CAPTURE, PER_POD_ENV};
use crate::bundle_spec::BundleSpec;
use crate::error::{Error, Result};
use crate::snapshot::engine_argv::EngineCommand;
use crate::snapshot::{artifact_error, gpu, rootfs, CONTROL_MOUNT};

/// What a create hands the preparation.
pub struct Inputs<'a> {
    pub bundle: &'a Path,
    pub id: &'a str,
    pub namespace: &'a str,
    /// Whose container this is (tenant.rs).
    pub tenant: &'a Tenant,
    pub config: &'a RuntimeConfig,
    /// The `vsnap.io/` annotations merged with the labels.
    pub settings: &'a HashMap<String, String>,
    /// The plan read from them (once, by the caller).
    pub plan: Plan,
    pub image_digest: Option<&'a str>,
    pub layer: rootfs::WritableLayer,
    /// The bundle's spec as read at create: edited here, written once.
    pub spec: BundleSpec,
    /// When the shim's Create began (reported with a restore's timings).
    pub create_began: std::time::SystemTime,
    /// The bundle's file the spec names as its network namespace, set by
    /// [`crate::snapshot::plan::prepare`] (netns_holder.rs).
    pub netns: Option<std::path::PathBuf>,
    /// The pull a restore streams from (`vsnap.io/artifact-ref`, an
    /// artifact not here yet): its tree stands for the artifact.
    pub streamed: Option<crate::snapshot::registry::stream::Streamed>,
}

/// What identifies the workload and how its engine speaks.
pub(super) struct Engine {
    pub(super) workload: Workload,
    pub(super) command: EngineCommand,
    pub(super) gpus: Vec<gpu::Gpu>,
    /// The plan's, or `exit` for a GPU engine that did not choose.
    pub(super) after_capture: AfterCapture,
}

impl Engine {
    /// The workload's identity (keyed with the host's or the fleet's key),
    /// its command line, the engine profile and the container's GPUs.
    pub(super) fn of(inputs: &Inputs<'_>, root: &Path) -> Result<Self> {
        let plan = &inputs.plan;
        let config = inputs.config;
        let spec = inputs.spec.value();
        let key =
            artifact::FingerprintKey::load_or_create(root, config.fleet_fingerprint_key.as_deref())
                .map_err(|e| artifact_error("create: fingerprint key", e))?;
        let per_pod = match inputs.settings.get(PER_POD_ENV) {
            Some(v) => artifact::per_pod::parse(v)
                .map_err(|e| Error::InvalidArgument(format!("create: {e}")))?,
            None => Vec::new(),
        };
        let workload = Workload {
            image_digest: inputs.image_digest.unwrap_or_default().to_string(),
            ..Workload::from_spec(spec, CONTROL_MOUNT, &key)
        }
        .with_per_pod_env(config.per_pod_env.iter().chain(&per_pod))
        .with_tenant(inputs.tenant);
        let (command, missing) = EngineCommand::of(&inputs.spec, plan.engine_protocol)?;
        for missing in missing {
            log::warn!(
                "{}: vLLM without {missing}: a capture may fail or a copy misbehave (docs/gpu-hosts.md)",
                inputs.id
            );
        }
        let gpus = gpus_of(spec, config)?;
        // A donor that goes on serving keeps its GPU memory: a restore on
        // the same GPU would run out of it.
        let after_capture = if !gpus.is_empty() && !inputs.settings.contains_key(AFTER_CAPTURE) {
            AfterCapture::Exit
        } else {
            plan.after_capture
        };
        Ok(Engine {
            workload,
            command,
            gpus,
            after_capture,
        })
    }
}

pub(super) fn tools_of(config: &RuntimeConfig) -> Tools {
    Tools {
        runc: config.runc_binary.clone(),
        criu: config.criu_binary.clone(),
        cuda_plugin: config.cuda_plugin_dir.join("cuda_plugin.so"),
        cuda_checkpoint: config.cuda_checkpoint.clone(),
    }
}

/// For a container with NVIDIA devices: the CUDA preflight (plugin,
/// cuda-checkpoint, driver >= 570 for process trees) and the GPUs it was
/// given (not every GPU of the host). GPUs given by an OCI hook are refused.
fn gpus_of(spec: &serde_json::Value, config: &RuntimeConfig) -> Result<Vec<gpu::Gpu>> {
    gpu::check_no_gpu_hook(spec).map_err(|e| Error::FailedPrecondition(format!("create: {e}")))?;
    let devices = gpu::spec_nvidia_devices(spec);
    if devices.is_empty() {
        return Ok(Vec::new());
    }
    let tools = gpu::CudaTools {
        plugin_dir: config.cuda_plugin_dir.clone(),
        cuda_checkpoint: config.cuda_checkpoint.clone(),
        ..Default::default()
    };
    let identity = gpu::preflight(&tools, gpu::MIN_DRIVER_PROCESS_TREE)
        .map_err(|e| Error::FailedPrecondition(format!("create: {e}")))?;
    gpu::container_gpus(&identity, &devices, Path::new("/proc"))
        .map_err(|e| Error::FailedPrecondition(format!("create: preflight: {e}")))
}
