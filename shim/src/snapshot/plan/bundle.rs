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
use super::prepared_plan::PlanRef;
use super::restore::RestorePlan;
use crate::error::{Error, Result};
use crate::snapshot::criu::{self, options::Options};
use crate::snapshot::engine_argv::{EngineCommand, Profile};
use crate::snapshot::{activation::canary, plan::spec};

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
        profile: engine.command.profile.clone(),
        listen: Listen {
            host: inputs.plan.host.clone(),
            port: inputs.plan.port,
        },
        control_dir,
        control_owner,
        api_key: engine.command.api_key().map(canary::ApiKey::new),
        gpus: engine.gpus.clone(),
        host_shm: spec::host_dev_shm(inputs.spec.value()),
        activation_timeout,
        activation_source,
        netns: inputs.netns.clone(),
        tree: None,
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
pub(super) fn edit_spec(
    inputs: &mut Inputs<'_>,
    p: PlanRef<'_>,
    command: &EngineCommand,
) -> Result<()> {
    let edited = edit_spec_once(inputs, p, command);
    if edited.is_err() {
        p.cleanup();
    }
    edited
}

fn edit_spec_once(inputs: &mut Inputs<'_>, p: PlanRef<'_>, command: &EngineCommand) -> Result<()> {
    let mut spec = std::mem::take(&mut inputs.spec);
    let edited = edit(inputs, spec.value_mut(), p, command, criu::BUNDLE_CONFIG);
    if let PlanRef::Restore(r) = p {
        if r.shared_root.is_some() {
            spec.value_mut()["root"]["path"] = Value::from(RestorePlan::SHARED_ROOT_MOUNT);
        }
    }
    inputs.spec = spec;
    edited?;
    inputs.spec.write(inputs.bundle)
}

/// The spec and CRIU config a capture of the container would run with,
/// written to the bundle's `spec_file` and `criu_file`, not to config.json:
/// an `auto` restore's way on should it fail at Start (restore.rs,
/// `ColdCapture`). The container's own spec is untouched.
pub(super) fn write_capture_spec(
    inputs: &Inputs<'_>,
    p: PlanRef<'_>,
    command: &EngineCommand,
    (spec_file, criu_file): (&str, &str),
) -> Result<()> {
    let mut spec = inputs.spec.clone();
    edit(inputs, spec.value_mut(), p, command, criu_file)?;
    spec.write_to(&inputs.bundle.join(spec_file))
}

/// Edits `spec` for `p`: the control dir, the snapshot config, CRIU's
/// config (written to the bundle's `criu_file`), the preflight hooks.
fn edit(
    inputs: &Inputs<'_>,
    spec: &mut Value,
    p: PlanRef<'_>,
    command: &EngineCommand,
    criu_file: &str,
) -> Result<()> {
    let (bundle, config) = (inputs.bundle, inputs.config);
    let timeout = capture_timeout(inputs).as_secs();
    let common = p.common();
    let startup = common.profile == Profile::Startup;
    spec::add_control_dir(spec, &common.control_dir, startup.then_some(timeout))?;
    if startup && command.is_vllm_serve() {
        spec::add_snapshot_config_arg(spec, timeout)?;
    }
    let criu = match p {
        PlanRef::Capture(c) => Options::capture(&c.criu, c.common.host_shm.as_deref()),
        PlanRef::Restore(r) => {
            let held = (r.holds_stopped(), r.pages.is_some());
            Options::restore(spec, config, r.criu.as_ref(), held)?
        }
    };
    spec::add_criu_config(
        spec,
        bundle,
        criu_file,
        &config.criu_config,
        &config.cuda_plugin_dir,
        criu,
    )?;
    super::hooks::add_snapshot_hooks(spec, p, command, config.enforce_io_uring_sysctl)
}

/// A fresh control dir for the container, owned by its engine's user.
fn make_control_dir(inputs: &Inputs<'_>, root: &Path) -> Result<(std::path::PathBuf, (u32, u32))> {
    let control_dir = root
        .join(".control")
        .join(format!("{}-{}", inputs.namespace, inputs.id));
    crate::snapshot::remove_control_dir(&control_dir);
    let owner = spec::process_owner(inputs.spec.value())?;
    ControlDir::create_owned_by(&control_dir, owner.0, Some(owner.1))
        .map_err(|e| Error::FailedPrecondition(format!("create: control dir: {e}")))?;
    Ok((control_dir, owner))
}
