//! What both plans make of the container at create: the part they share
//! ([`common_part`], with a fresh control dir owned by the engine's user)
//! and the bundle's spec edited once and written ([`edit_spec`]).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use vsnap_artifact::ArtifactName;
use vsnap_protocol::ControlDir;

use super::common::{self, Common, Listen};
use super::engine::{tools_of, Engine, Inputs};
use super::prepared_plan::Prepared;
use super::restore::RestorePlan;
use crate::error::{Error, Result};
use crate::snapshot::criu::{self, masks};
use crate::snapshot::plan::profile::Profile;
use crate::snapshot::{activation::canary, plan::spec, plan::vllm_command};

/// The part of the plan both directions share, with a fresh control dir.
pub(super) fn common_part(
    inputs: &Inputs<'_>,
    engine: &Engine,
    artifact: ArtifactName,
) -> Result<Common> {
    let config = inputs.config;
    let (control_dir, control_owner) = make_control_dir(inputs, &config.artifact_root)?;
    let (activation_timeout, activation_source) =
        common::activation_timeout(inputs.plan.activation_timeout, config, &engine.gpus);
    Ok(Common {
        artifact,
        root: config.artifact_root.clone(),
        workload: engine.workload.clone(),
        tools: tools_of(config),
        profile: engine.profile.clone(),
        listen: Listen {
            host: inputs.plan.host.clone(),
            port: inputs.plan.port,
        },
        control_dir,
        control_owner,
        api_key: vllm_command::api_key(&engine.argv, &engine.env).map(canary::ApiKey::new),
        gpus: engine.gpus.clone(),
        host_shm: spec::host_dev_shm(&inputs.spec),
        activation_timeout,
        activation_source,
        netns: inputs.netns.clone(),
    })
}

/// How long the engine may take to become capture-ready (and the timeout
/// vLLM's snapshot config is given, for both directions).
pub(super) fn capture_timeout(inputs: &Inputs<'_>) -> Duration {
    inputs
        .plan
        .capture_timeout
        .unwrap_or(Duration::from_secs(inputs.config.capture_timeout_s))
}

/// The spec's edits of either plan, written at once: the control dir, the
/// snapshot config, CRIU's config, the preflight hooks. On failure the
/// control dir goes.
pub(super) fn edit_spec(inputs: &mut Inputs<'_>, p: &Prepared, argv: &[String]) -> Result<()> {
    let edited = edit_spec_once(inputs, p, argv);
    if edited.is_err() {
        p.cleanup();
    }
    edited
}

fn edit_spec_once(inputs: &mut Inputs<'_>, p: &Prepared, argv: &[String]) -> Result<()> {
    let mut spec = std::mem::take(&mut inputs.spec);
    let edited = edit(inputs, &mut spec, p, argv, criu::BUNDLE_CONFIG);
    if let Prepared::Restore(r) = p {
        if r.shared_root.is_some() {
            spec["root"]["path"] = Value::from(RestorePlan::SHARED_ROOT_MOUNT);
        }
    }
    inputs.spec = spec;
    edited?;
    spec::write(inputs.bundle, &inputs.spec)
}

/// The spec and CRIU config a capture of the container would run with,
/// written to the bundle's `spec_file` and `criu_file`, not to config.json:
/// an `auto` restore's way on should it fail at Start (restore.rs,
/// `ColdCapture`). The container's own spec is untouched.
pub(super) fn write_capture_spec(
    inputs: &Inputs<'_>,
    p: &Prepared,
    argv: &[String],
    (spec_file, criu_file): (&str, &str),
) -> Result<()> {
    let mut spec = inputs.spec.clone();
    edit(inputs, &mut spec, p, argv, criu_file)?;
    spec::write_to(&inputs.bundle.join(spec_file), &spec)
}

/// Edits `spec` for `p`: the control dir, the snapshot config, CRIU's
/// config (written to the bundle's `criu_file`), the preflight hooks.
fn edit(
    inputs: &Inputs<'_>,
    spec: &mut Value,
    p: &Prepared,
    argv: &[String],
    criu_file: &str,
) -> Result<()> {
    let (bundle, config) = (inputs.bundle, inputs.config);
    let timeout = capture_timeout(inputs).as_secs();
    let common = p.common();
    let startup = common.profile == Profile::Startup;
    spec::add_control_dir(spec, &common.control_dir, startup.then_some(timeout))?;
    if startup && vllm_command::is_vllm_serve(argv) {
        spec::add_snapshot_config_arg(spec, timeout)?;
    }
    let (masked, empty) = match p {
        Prepared::Capture(_) if config.external_masks => (masks::masked_folders(spec), None),
        Prepared::Capture(_) => (Vec::new(), None),
        Prepared::Restore(_) => (Vec::new(), Some(empty_masks(config)?)),
    };
    let join_ns = match p {
        Prepared::Restore(_) => pod_namespaces(spec, config)?,
        Prepared::Capture(_) => Vec::new(),
    };
    let criu = match p {
        Prepared::Capture(c) => criu::CriuSetup {
            leave_stopped: false,
            lazy_pages: false,
            keep_link_remaps_in: c.common.host_shm.as_deref(),
            masked_folders: &masked,
            empty_masks: None,
            join_ns: &[],
            skip_network_lock: false,
        },
        Prepared::Restore(r) => criu::CriuSetup {
            leave_stopped: r.holds_stopped(),
            lazy_pages: r.pages.is_some(),
            keep_link_remaps_in: None,
            masked_folders: &[],
            empty_masks: empty.as_deref(),
            join_ns: &join_ns,
            skip_network_lock: criu::pod::joins_network(spec),
        },
    };
    spec::add_criu_config(
        spec,
        bundle,
        criu_file,
        &config.criu_config,
        &config.cuda_plugin_dir,
        criu,
    )?;
    super::hooks::add_snapshot_hooks(spec, p, config.enforce_io_uring_sysctl)
}

/// The pod's UTS and IPC namespaces a restore joins (criu/pod.rs), once
/// CRIU proved it can.
fn pod_namespaces(
    spec: &Value,
    config: &vsnap_config::RuntimeConfig,
) -> Result<Vec<criu::pod::JoinNs>> {
    let join =
        criu::pod::joined(spec).map_err(|e| Error::InvalidArgument(format!("restore: {e}")))?;
    if !join.is_empty() {
        criu::pod::check_patched(&config.criu_binary)
            .map_err(|e| Error::FailedPrecondition(format!("restore: preflight: {e}")))?;
    }
    Ok(join)
}

/// The host's empty read-only tmpfs a restore binds at runc's masked
/// folders (criu/masks.rs), mounted if it is not yet.
fn empty_masks(config: &vsnap_config::RuntimeConfig) -> Result<std::path::PathBuf> {
    masks::ensure_empty(&config.runtime_dir).map_err(|e| {
        Error::io(
            format!(
                "restore: mount the empty read-only tmpfs for runc's masked folders under {}",
                config.runtime_dir.display()
            ),
            e,
        )
    })
}

/// A fresh control dir for the container, owned by its engine's user.
fn make_control_dir(inputs: &Inputs<'_>, root: &Path) -> Result<(std::path::PathBuf, (u32, u32))> {
    let control_dir = root
        .join(".control")
        .join(format!("{}-{}", inputs.namespace, inputs.id));
    crate::snapshot::remove_control_dir(&control_dir);
    let owner = spec::process_owner(&inputs.spec)?;
    ControlDir::create_owned_by(&control_dir, owner.0, Some(owner.1))
        .map_err(|e| Error::FailedPrecondition(format!("create: control dir: {e}")))?;
    Ok((control_dir, owner))
}
