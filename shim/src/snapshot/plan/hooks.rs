//! The preflight checks a snapshot container's bundle gets as
//! `createRuntime` hooks (`vsnap-hook`): ownership of the control dir and,
//! for a restore, of the artifact, the fingerprint (manifest MAC, host,
//! workload, tenant) and the io_uring sysctl.

use std::path::Path;

use serde_json::Value;

use super::prepared_plan::PlanRef;
use super::restore::RestorePlan;
use super::spec::{add_hooks, hook_binary, HOOK_BINARY};
use crate::error::{Error, Result};
use crate::snapshot::engine_argv::{EngineCommand, Profile};

/// The checks for a snapshot container. Restore: `ownership` of the
/// artifact and the copy's control dir, and `fingerprint` (manifest MAC, host
/// and workload) with the shim's tools and version. Create: `ownership` of
/// the control dir. Both add `io-uring` when `enforce_io_uring` (the
/// container's user against `kernel.io_uring_disabled`).
pub fn snapshot_checks(
    p: PlanRef<'_>,
    command: &EngineCommand,
    enforce_io_uring: bool,
) -> Vec<Vec<String>> {
    let c = p.common();
    let control = c.control_dir.display().to_string();
    // The control dir is the engine's user's (the folders above it root's).
    let owner = c.control_owner.0;
    let control_owner: Vec<String> = if owner == 0 {
        Vec::new()
    } else {
        vec!["--control-owner".into(), owner.to_string()]
    };
    let mut checks = match p {
        PlanRef::Restore(r) => restore_checks(r, command, control, control_owner),
        PlanRef::Capture(_) => vec![["ownership".into(), "--control-dir".into(), control]
            .into_iter()
            .chain(control_owner)
            .collect()],
    };
    if enforce_io_uring {
        checks.push(vec!["io-uring".into()]);
    }
    checks
}

/// A restore's checks: the artifact's and the control dir's ownership, and
/// its fingerprint (manifest MAC, host, workload) with the shim's tools.
fn restore_checks(
    r: &RestorePlan,
    command: &EngineCommand,
    control: String,
    control_owner: Vec<String>,
) -> Vec<Vec<String>> {
    let s = &r.common;
    let text = |p: &Path| p.display().to_string();
    let name = s.artifact.as_str().to_string();
    let root = text(&s.root);
    // A restore streamed from a pull reads the pull's tree: the hooks
    // check that instead of the artifact (oci-hooks' `streamed_tree`).
    let streamed = s.tree.as_ref().map(|_| "--streamed".to_string());
    let ownership = [
        "ownership",
        "--artifact-root",
        &root,
        "--artifact",
        &name,
        "--control-dir",
        &control,
    ]
    .map(String::from)
    .into_iter()
    .chain(control_owner)
    .chain(streamed.clone())
    .collect();
    let mut fingerprint: Vec<String> = [
        "fingerprint",
        "--artifact-root",
        &root,
        "--artifact",
        &name,
        "--runc",
        &text(&s.tools.runc),
        "--criu",
        &text(&s.tools.criu),
        "--cuda-plugin",
        &text(&s.tools.cuda_plugin),
        "--cuda-checkpoint",
        &text(&s.tools.cuda_checkpoint),
        "--shim-version",
        env!("CARGO_PKG_VERSION"),
    ]
    .map(String::from)
    .to_vec();
    fingerprint.extend(streamed);
    // prepare appended `--snapshot-config JSON` to a vllm serve argv; the
    // captured workload was taken before that edit.
    if s.profile == Profile::Startup && command.is_vllm_serve() {
        fingerprint.push("--strip-snapshot-config-arg".into());
    }
    // Whose container this is, and whose artifact it may restore: the
    // hook checks the spec's Kubernetes namespace and the manifest's owner.
    fingerprint.extend([
        "--tenant".to_string(),
        s.workload.tenant().to_string(),
        "--owner".to_string(),
        r.owner.to_string(),
    ]);
    // The root folder containerd gave, restored on a private bind of it.
    if let Some(folder) = &r.shared_root {
        fingerprint.push("--root-folder".into());
        fingerprint.push(text(folder));
    }
    // The workload's secrets were keyed with the fleet's key.
    if let Some(key) = &r.fingerprint_key {
        fingerprint.push("--fingerprint-key".into());
        fingerprint.push(text(key));
    }
    // The container's own GPUs, not the host's.
    let uuids: Vec<&str> = s.gpus.iter().map(|g| g.uuid.as_str()).collect();
    if !uuids.is_empty() {
        fingerprint.push("--gpu-uuids".into());
        fingerprint.push(uuids.join(","));
    }
    vec![ownership, fingerprint]
}

/// Installs [`snapshot_checks`] as `createRuntime` hooks in the bundle, so
/// that runc runs them at `runc create` and again at `runc restore` (runc
/// runs createRuntime hooks when CRIU reports "setup-namespaces"), after the
/// other spec edits. Without `vsnap-hook` beside the shim, the hooks are
/// left out with a warning (the shim's own preflight still runs), unless the
/// io_uring sysctl is enforced: then the create fails.
pub fn add_snapshot_hooks(
    spec: &mut Value,
    p: PlanRef<'_>,
    command: &EngineCommand,
    enforce_io_uring: bool,
) -> Result<()> {
    let Some(hook) = hook_binary() else {
        if enforce_io_uring {
            return Err(Error::FailedPrecondition(format!(
                "create: the io_uring sysctl is enforced but {HOOK_BINARY} is not installed beside the shim"
            )));
        }
        log::warn!("{HOOK_BINARY} is not installed beside the shim: no preflight hooks");
        return Ok(());
    };
    let checks = snapshot_checks(p, command, enforce_io_uring);
    add_hooks(spec, &hook, &checks)
}
