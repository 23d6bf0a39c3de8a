//! `auto`'s way past an artifact it cannot restore: the artifact is set
//! aside (vsnap_artifact::quarantine: kept whole with its reason, at most
//! one copy per name) under the exclusive lock, which the capture that
//! replaces it then holds; the fallback is logged, journaled (the metric
//! `vsnap_auto_fallbacks_total`) and recorded in the bundle
//! (`vsnap-fallback.json`). Only the artifact's own tenant replaces it,
//! and only a tenant the policy lets create.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use vsnap_artifact::journal::{Op, Record};
use vsnap_artifact::quarantine::{self, Reason};
use vsnap_artifact::{ArtifactError, ArtifactName};

use super::engine::Inputs;
use super::lock::WriteLock;
use super::refusal::{Cause, Refusal};
use super::tenant;
use crate::error::Result;
use crate::snapshot::{artifact_error, records::journal};

/// What became of a refusal under `auto`.
pub(super) enum Fallback {
    /// Set aside: the start captures anew, under this lock.
    Capture(WriteLock),
    /// Another writer holds the name: the start is cold, without a capture.
    Cold,
}

/// Sets `name` aside for `refusal` at create. Err: the refusal stands (its
/// cause is the container's, the tenant may not create, the artifact is
/// another tenant's, or it could not be moved).
pub(super) fn at_create(
    inputs: &Inputs<'_>,
    name: &ArtifactName,
    refusal: Refusal,
) -> Result<Fallback> {
    let (config, id) = (inputs.config, inputs.id);
    let root = &config.artifact_root;
    if !refusal.cause.sets_aside() || !tenant::may_create(&config.tenants, inputs.tenant) {
        return Err(refusal.error);
    }
    let lock = match WriteLock::take(root, name.as_str()) {
        Ok(lock) => lock,
        Err(ArtifactError::Locked(_)) => {
            log::warn!(
                "{id}: auto: artifact {name} cannot be restored ({}) and another container holds it: starting cold without a capture",
                refusal.error
            );
            return Ok(Fallback::Cold);
        }
        Err(e) => return Err(artifact_error("create: set aside", e)),
    };
    // Never over another tenant's artifact, whatever the policy allows a
    // create to replace.
    if tenant::check_replace(root, name.as_str(), inputs.tenant, false).is_err() {
        return Err(refusal.error);
    }
    let message = refusal.error.to_string();
    set_aside(root, name.as_str(), id, refusal.cause, &message)?;
    write_record(inputs.bundle, name.as_str(), refusal.cause, &message);
    Ok(Fallback::Capture(lock))
}

/// After a restore under `auto` failed at Start with `error` for `cause`
/// (refusal::start_cause): the artifact set aside when it is the artifact's
/// (blocking: call it off the runtime), and the exclusive lock it was set
/// aside under, which a capture replacing it holds next. Not while another
/// restore of it holds it: that one decides for itself.
pub fn after_start(
    root: &Path,
    name: &str,
    id: &str,
    bundle: &Path,
    cause: Cause,
    error: &str,
) -> Option<WriteLock> {
    if cause == Cause::Stream {
        // Nothing was published to set aside: only the record.
        write_record(bundle, name, cause, error);
        return None;
    }
    if !cause.sets_aside() {
        return None;
    }
    let lock = match WriteLock::take(root, name) {
        Ok(lock) => lock,
        Err(e) => {
            log::warn!(
                "{id}: auto: artifact {name} not set aside ({e}): it stays for the next start"
            );
            return None;
        }
    };
    match set_aside(root, name, id, cause, error) {
        Ok(()) => {
            write_record(bundle, name, cause, error);
            Some(lock)
        }
        Err(e) => {
            log::error!("{id}: {e}");
            None
        }
    }
}

/// The move, its log line and its journal record.
fn set_aside(root: &Path, name: &str, id: &str, cause: Cause, error: &str) -> Result<()> {
    let reason = Reason {
        cause: cause.slug().to_string(),
        message: error.to_string(),
        at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        container: id.to_string(),
    };
    let to = quarantine::set_aside(root, name, &reason)
        .map_err(|e| artifact_error("auto: set aside", e))?;
    if let Some(to) = to {
        log::warn!(
            "{id}: auto: artifact {name} set aside as {} ({}): {error}; this start is cold and captures it anew",
            to.display(),
            reason.cause
        );
    }
    journal::record_now(
        root,
        &Record::now(Op::Fallback, name, false, 0.0).failed_in(cause.slug()),
    );
    Ok(())
}

/// `vsnap-fallback.json` in the bundle: what this task's start set aside
/// and why. Best effort: the log line and the journal have it too.
fn write_record(bundle: &Path, name: &str, cause: Cause, error: &str) {
    let record = serde_json::json!({
        "artifact": name,
        "cause": cause.slug(),
        "error": error,
    });
    let path = bundle.join("vsnap-fallback.json");
    if let Err(e) = vsnap_protocol::write_atomic(&path, record.to_string().as_bytes()) {
        log::warn!("write {}: {e}", path.display());
    }
}

/// Adds to `vsnap-fallback.json` how the Start whose restore failed went
/// on (`how`: a cold start, with or without a capture). Best effort.
pub fn record_start(bundle: &Path, how: &str) {
    let path = bundle.join("vsnap-fallback.json");
    let Ok(mut record) = std::fs::read(&path)
        .map_err(drop)
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).map_err(drop))
    else {
        return;
    };
    record["start"] = serde_json::Value::String(how.to_string());
    if let Err(e) = vsnap_protocol::write_atomic(&path, record.to_string().as_bytes()) {
        log::warn!("write {}: {e}", path.display());
    }
}
