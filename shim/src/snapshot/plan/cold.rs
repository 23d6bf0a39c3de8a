//! The capture plan of a container (a create's), and the cold start an
//! `auto` restore is prepared to go on as, should it fail at Start: the
//! container's own spec kept, and where the tenant may create, a capture
//! ready beside the restore (restore.rs, `ColdStart`).

use std::time::Duration;

use vsnap_artifact::Tenant;

use super::bundle::{capture_timeout, write_capture_spec};
use super::capture::CapturePlan;
use super::common::Common;
use super::engine::{Engine, Inputs};
use super::lock::WriteLock;
use super::prepared_plan::PlanRef;
use super::restore::ColdStart;
use super::tenant;
use crate::error::Result;
use crate::snapshot::{registry::fetch, rootfs};

/// A capture's plan of the container, on its shared part `common`.
pub(super) fn capture_plan(
    inputs: &Inputs<'_>,
    engine: &Engine,
    common: Common,
    lock: Option<WriteLock>,
    layer: rootfs::WritableLayer,
) -> Box<CapturePlan> {
    let config = inputs.config;
    Box::new(CapturePlan {
        common,
        lock,
        capture_timeout: capture_timeout(inputs),
        checkpoint_timeout: Duration::from_secs(config.checkpoint_timeout_s),
        after_capture: engine.after_capture,
        donor_stop_grace: Duration::from_secs(config.donor_stop_grace_s),
        layer,
        layer_limit: config.rootfs_diff_limit_bytes,
        elide_zero_pages: config.elide_zero_pages,
        seal_at_rest: config.seal_at_rest,
        push_to: fetch::PushTarget::of(config, inputs.plan.wanted()),
        spec: inputs.spec.value().clone(),
        criu: crate::snapshot::criu::options::dump_options(inputs.spec.value(), config),
    })
}

/// Under `auto`, the cold start an artifact restore goes on as should it
/// fail at Start (after CRIU started, for the artifact's sake): the
/// container's own spec kept in the bundle, and where the tenant may
/// create, the capture that replaces the artifact, its spec and CRIU
/// config beside (its lock is taken when the artifact is set aside).
/// Called before the restore's edits of the spec.
pub(super) fn cold_start(
    inputs: &Inputs<'_>,
    engine: &Engine,
    (common, owner): (&Common, &Tenant),
    layer: &rootfs::WritableLayer,
    cold: ColdStart,
) -> Result<ColdStart> {
    inputs.spec.write_to(&cold.spec)?;
    // Never over another tenant's artifact (`owner`: one shared with
    // this container's tenant).
    if owner != inputs.tenant || !tenant::may_create(&inputs.config.tenants, inputs.tenant) {
        return Ok(cold);
    }
    let plan = capture_plan(inputs, engine, common.clone(), None, layer.clone());
    write_capture_spec(
        inputs,
        PlanRef::Capture(&plan),
        &engine.command,
        ColdStart::CAPTURE_FILES,
    )?;
    Ok(cold.with_capture(inputs.bundle, plan))
}
