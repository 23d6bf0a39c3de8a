//! A snapshot plan prepared at create, from the plan its annotations ask
//! (read by the caller, once): the engine read from the spec (engine.rs),
//! the artifact's name, the choice between a capture and a restore
//! (choose.rs); then for a capture the tenant's right to create and the
//! exclusive lock (here), for a restore its preflight (preflight.rs); the
//! shared part and the bundle's spec edited once (bundle.rs).

use std::path::Path;
use std::time::Instant;

use vsnap_artifact::{self as artifact, ArtifactError, ArtifactName, Workload};

use super::annotations::{Mode, Plan};
use super::bundle::{common_part, edit_spec};
use super::capture::CapturePlan;
use super::choose::{choose, Choice, OnDisk};
use super::cold::capture_plan;
use super::engine::{Engine, Inputs};
use super::fallback::{self, Fallback};
use super::lock::WriteLock;
use super::prepared_plan::{PlanRef, PreparedPlan};
use super::refusal::Cause;
use crate::error::{Error, Result};
use crate::snapshot::{artifact_error, plan::tenant, rootfs};

/// Prepares the container for its plan: the control dir, the spec edits
/// and, for a restore, the validated artifact. `None`: the container
/// starts cold without a capture (see [`prepare_capture`]).
pub fn prepare(mut inputs: Inputs<'_>) -> Result<Option<PreparedPlan>> {
    let started = Instant::now();
    let root = inputs.config.artifact_root.clone();
    artifact::ensure_root(&root).map_err(|e| artifact_error("create: artifact root", e))?;
    let layer = resolve_layer(
        std::mem::replace(&mut inputs.layer, rootfs::WritableLayer::Shared),
        &inputs,
    );
    // A network namespace of the container's own is made by the shim
    // (netns_holder.rs): named before the workload is read, so a capture
    // and its restores record the same.
    inputs.netns = crate::netns_holder::name_in_spec(inputs.spec.value_mut(), inputs.bundle);
    let mut engine = Engine::of(&inputs, &root)?;
    if let rootfs::WritableLayer::Mounted(overlay) = &layer {
        // dockerd's per-container merged path: the image's layers instead.
        engine.workload.rootfs = overlay.image_identity();
    }
    let name = artifact_name(&inputs.plan, &engine.workload)?;
    // A pull streaming the artifact in stands for it (registry/stream.rs).
    let streamed = inputs.streamed.is_some();
    let choice = choose(inputs.plan.mode, || match streamed {
        true => OnDisk::Published,
        false => OnDisk::look(&root, name.as_str()),
    });
    if choice == Choice::Capture {
        return prepare_capture(&mut inputs, engine, name, layer, None)
            .map(|c| c.map(PreparedPlan::Capture));
    }
    match super::preflight::prepare_restore(&mut inputs, &engine, name.clone(), &layer, started) {
        Ok(r) => Ok(Some(PreparedPlan::Restore(r))),
        // Another container is writing it (it published a moment ago, or
        // replaces it): this one starts cold and captures nothing.
        Err(refusal) if inputs.plan.mode == Mode::Auto && refusal.cause == Cause::Busy => {
            log::warn!(
                "{}: auto: {}: starting cold without a capture",
                inputs.id,
                refusal.error
            );
            Ok(None)
        }
        // `auto` restores what can be restored here, else creates.
        Err(refusal) if inputs.plan.mode == Mode::Auto => {
            // A streamed artifact refused here is never published over
            // what this start captures (registry/stream.rs).
            if let Some(s) = inputs
                .streamed
                .as_ref()
                .filter(|_| refusal.cause.sets_aside())
            {
                s.abandon();
            }
            match fallback::at_create(&inputs, &name, refusal)? {
                Fallback::Cold => Ok(None),
                Fallback::Capture(lock) => {
                    prepare_capture(&mut inputs, engine, name, layer, Some(lock))
                        .map(|c| c.map(PreparedPlan::Capture))
                }
            }
        }
        Err(refusal) => Err(refusal.error),
    }
}

/// A capture's plan, under the exclusive lock, once the tenant may create.
/// None: the container starts cold without a capture (the name is being
/// written, or `auto` in a tenant the policy lets create nothing).
fn prepare_capture(
    inputs: &mut Inputs<'_>,
    engine: Engine,
    name: ArtifactName,
    layer: rootfs::WritableLayer,
    locked: Option<WriteLock>,
) -> Result<Option<Box<CapturePlan>>> {
    let config = inputs.config;
    if !tenant::may_create(&config.tenants, inputs.tenant) {
        let refused = tenant::create_refused(inputs.tenant, name.as_str());
        if inputs.plan.mode != Mode::Auto {
            return Err(refused);
        }
        log::warn!("{}: auto: {refused}: starting cold", inputs.id);
        return Ok(None);
    }
    let lock = match locked {
        // Taken to set the artifact aside: what is there now is nothing.
        Some(lock) => lock,
        None => match lock_for_create(inputs, &config.artifact_root, name.as_str())? {
            Some(lock) => lock,
            None => return Ok(None),
        },
    };
    let common = common_part(inputs, &engine, name)?;
    let plan = capture_plan(inputs, &engine, common, Some(lock), layer);
    edit_spec(inputs, PlanRef::Capture(&plan), &engine.command)?;
    Ok(Some(plan))
}

/// The layer a capture carries: for a rootfs without mounts in the request,
/// the overlay the caller mounted at the spec's root path (dockerd's
/// overlay2), else a shared folder.
fn resolve_layer(layer: rootfs::WritableLayer, inputs: &Inputs<'_>) -> rootfs::WritableLayer {
    match layer {
        rootfs::WritableLayer::Shared => match inputs.spec.root_path() {
            Some(root) => rootfs::WritableLayer::of_root_folder(
                &inputs.bundle.join(root),
                &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            ),
            None => rootfs::WritableLayer::Shared,
        },
        other => other,
    }
}

/// The plan's artifact; for `auto` without a name, the one the workload's
/// identity names.
fn artifact_name(plan: &Plan, workload: &Workload) -> Result<ArtifactName> {
    match plan.artifact.clone() {
        Some(name) => Ok(name),
        None => ArtifactName::new(format!("auto-{}", workload.key()))
            .map_err(|e| Error::Other(format!("create: {e}"))),
    }
}

/// A create's exclusive lock on the artifact's name, and the check that it
/// may replace what is there. None: another container is writing it, so
/// this one starts cold and captures nothing.
fn lock_for_create(inputs: &Inputs<'_>, root: &Path, name: &str) -> Result<Option<WriteLock>> {
    match WriteLock::take(root, name) {
        Ok(lock) => {
            tenant::check_replace(
                root,
                name,
                inputs.tenant,
                inputs.config.allow_artifact_replace,
            )?;
            Ok(Some(lock))
        }
        Err(ArtifactError::Locked(name)) => {
            // Never two writers.
            log::warn!(
                "{}: artifact {name} is being written by another container: starting cold without a capture",
                inputs.id
            );
            Ok(None)
        }
        Err(e) => Err(artifact_error("create", e)),
    }
}
