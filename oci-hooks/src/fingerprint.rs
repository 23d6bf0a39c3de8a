//! `fingerprint`: the artifact's manifest must verify with this host's key
//! (so it is one this host made, or re-sealed after a verified pull,
//! unedited), this host must be compatible with the one it was captured on
//! (kernel series, CPU model and flags, runc, CRIU, CUDA tools, shim
//! version, GPU models and driver: the rules of `vsnap_artifact::compat`),
//! and the workload must be this container (argv with secrets redacted,
//! environment fingerprints, root filesystem, image, security-relevant spec
//! fields). Every difference is named with its captured and live value, as
//! [`HostIdentity::incompatibilities`] and [`Workload::diff`] write them:
//! argv secrets are redacted and environment values appear only as
//! fingerprints.
//!
//! Where this kernel has no time namespaces, this host's clocks must not be
//! behind the capture's (vsnap_artifact::clocks): the restored engine's
//! timers would wait for them.
//!
//! When the manifest records GPUs, the live ones come from `nvidia-smi`
//! (`--nvidia-smi P`), as the shim takes them, narrowed to the container's
//! own (`--gpu-uuids U1,U2`, which the shim passes).
//!
//! With `--fingerprint-key P` (the shim passes its `fleet_fingerprint_key`)
//! the live workload's environment and secret flags are keyed with that
//! shared key instead of the host key, as the shim keyed them.
//!
//! With `--tenant T` (the shim passes the container's tenant, which holds
//! the containerd namespace a hook cannot see) the spec's Kubernetes
//! namespace (CRI's `io.kubernetes.cri.sandbox-namespace`) must be T's, and
//! the manifest's owner must be `--owner O` (T's own artifact, or one the
//! runtime config's policy shares with T, as the shim decided): an artifact
//! of another tenant is refused naming both.
//!
//! With `--strip-snapshot-config-arg` (the shim passes it when it appended
//! `--snapshot-config` to a `vllm serve` argv) that trailing pair is not
//! part of the comparison.
//!
//! With `--root-folder DIR` (the shim passes it when it restores a root
//! folder other containers may share on a private bind of it at the
//! bundle's `rootfs`, which the spec then names) the workload's root is
//! DIR, once the spec's root is found to be DIR itself (same inode).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use vsnap_artifact::gpu::{self, Gpu, GpuError, NVIDIA_SMI_ARGS};
use vsnap_artifact::spawn::{self, RunError};
use vsnap_artifact::{HostIdentity, Manifest, Tenant, Tools, Workload};

use crate::{artifact_name, read_spec, Failure, Flags, StateSource, CONTROL_MOUNT};

pub const VALUE_FLAGS: &[&str] = &[
    "--artifact-root",
    "--artifact",
    "--runc",
    "--criu",
    "--cuda-plugin",
    "--cuda-checkpoint",
    "--shim-version",
    "--nvidia-smi",
    "--gpu-uuids",
    "--fingerprint-key",
    "--tenant",
    "--owner",
    "--bundle",
    "--state",
    "--root-folder",
];
pub const BOOL_FLAGS: &[&str] = &[
    "--strip-snapshot-config-arg",
    "--artifact-from-state",
    "--streamed",
];

/// The shim version an artifact records; the hook ships with the shim.
pub const SHIM_VERSION: &str = env!("CARGO_PKG_VERSION");

pub fn run(flags: &Flags, state: &mut StateSource) -> Result<(), Failure> {
    let root = flags
        .abs_path("--artifact-root")?
        .ok_or_else(|| Failure::Usage("--artifact-root is required".into()))?;
    let name = artifact_name(flags, state)?
        .ok_or_else(|| Failure::Usage("--artifact or --artifact-from-state is required".into()))?;
    let name = name.as_str();
    let defaults = Tools::default();
    let tools = Tools {
        runc: flags.path("--runc").unwrap_or(defaults.runc),
        criu: flags.path("--criu").unwrap_or(defaults.criu),
        cuda_plugin: flags.path("--cuda-plugin").unwrap_or(defaults.cuda_plugin),
        cuda_checkpoint: flags
            .path("--cuda-checkpoint")
            .unwrap_or(defaults.cuda_checkpoint),
    };
    let shim_version = flags.value("--shim-version").unwrap_or(SHIM_VERSION);
    // The manifest first: a bad artifact is named even without a state.
    let manifest = match flags.has("--streamed") {
        // Still arriving: the manifest its pull put in the tree.
        true => Manifest::load_verified_in(&root, name, &crate::streamed_tree(&root, name))
            .map_err(|e| Failure::Check(e.to_string()))?,
        false => load(&root, name)?,
    };
    let bundle: PathBuf = state.bundle(flags.path("--bundle").as_deref())?;
    let mut spec = read_spec(&bundle)?;
    if flags.has("--strip-snapshot-config-arg") {
        strip_snapshot_config_arg(&mut spec);
    }
    if let Some(folder) = flags.abs_path("--root-folder")? {
        root_folder_as_given(&mut spec, &bundle, &folder).map_err(Failure::Check)?;
    }
    let mut live = HostIdentity::probe_cached(&tools, shim_version, Some(&root));
    // The shim records GPUs (from nvidia-smi) only for containers with NVIDIA
    // devices, whose spec digests differ from a GPU-less one anyway.
    if !manifest.host.gpus.is_empty() {
        let nvidia_smi = flags
            .path("--nvidia-smi")
            .unwrap_or_else(|| PathBuf::from("nvidia-smi"));
        let mut gpus = gpus(&nvidia_smi, NVIDIA_SMI_TIMEOUT)?;
        // The container's own GPUs, as the shim recorded them (not every
        // GPU of the host).
        if let Some(list) = flags.value("--gpu-uuids") {
            gpus = own_gpus(gpus, list);
        }
        live.gpus = gpu::entries(&gpus);
    }
    if let Some(tenant) = flags.value("--tenant") {
        let recorded = manifest.workload.tenant();
        check_tenant(&spec, &recorded, tenant, flags.value("--owner"))
            .map_err(|e| Failure::Check(format!("artifact {name}: {e}")))?;
    }
    let key = flags.abs_path("--fingerprint-key")?;
    compare(&root, key.as_deref(), &manifest, &live, &spec)?;
    check_clocks(&root, &manifest)
}

/// A restore whose engine would wait for this host's clocks to catch up
/// with the capture's (a kernel without time namespaces, clocks behind)
/// is refused, as the shim's preflight refuses it
/// ([`vsnap_artifact::clocks::check_restore`]). Manifests from before
/// clocks were recorded pass.
pub fn check_clocks(root: &Path, manifest: &Manifest) -> Result<(), Failure> {
    let Some(captured) = &manifest.clocks else {
        return Ok(());
    };
    let live = vsnap_artifact::Clocks::now();
    vsnap_artifact::clocks::check_restore(
        captured,
        &live,
        vsnap_artifact::clocks::has_time_namespaces(),
    )
    .map(drop)
    .map_err(|e| {
        Failure::Check(format!(
            "artifact {}: {e}",
            root.join(&manifest.name).display()
        ))
    })
}

/// The GPUs of `gpus` whose UUID is in the comma-separated `uuids`.
pub fn own_gpus(gpus: Vec<Gpu>, uuids: &str) -> Vec<Gpu> {
    let wanted: Vec<&str> = uuids.split(',').filter(|u| !u.is_empty()).collect();
    gpus.into_iter()
        .filter(|g| wanted.contains(&g.uuid.as_str()))
        .collect()
}

/// How long nvidia-smi may take (a wedged driver hangs it), within the
/// hook's own 30 s.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(20);

/// The GPUs nvidia-smi lists, asked and read as the shim does
/// ([`NVIDIA_SMI_ARGS`], [`gpu::parse_nvidia_smi`]).
pub fn gpus(nvidia_smi: &Path, timeout: Duration) -> Result<Vec<Gpu>, Failure> {
    let what = format!("{} {}", nvidia_smi.display(), NVIDIA_SMI_ARGS[0]);
    let mut cmd = Command::new(nvidia_smi);
    cmd.args(NVIDIA_SMI_ARGS);
    let ran = spawn::run(&mut cmd, timeout).map_err(|e| match e {
        RunError::Spawn(e) => {
            Failure::Check(format!("{what}: {e} (the artifact was made with GPUs)"))
        }
        RunError::Timeout | RunError::Wait(_) => Failure::Check(format!(
            "{what}: no answer within {}s (the driver may be wedged)",
            timeout.as_secs()
        )),
    })?;
    if let Some((status, _)) = ran.failure() {
        return Err(Failure::Check(format!("{what}: {status}")));
    }
    gpu::parse_nvidia_smi(&ran.stdout).map_err(|e| match e {
        GpuError::NoGpu => Failure::Check(format!(
            "{what}: lists no GPU (the artifact was made with GPUs)"
        )),
        GpuError::Row { line } | GpuError::Entry { entry: line } => Failure::Check(format!(
            "{what}: line {line:?} is not `name, uuid, driver_version`"
        )),
    })
}

/// Drops a trailing `--snapshot-config JSON` pair naming vsnap's control
/// mount: the shim appends it to a `vllm serve` argv after it took the
/// workload's identity. Anything else is left for the comparison to name.
pub fn strip_snapshot_config_arg(spec: &mut Value) -> bool {
    let Some(args) = spec["process"]["args"].as_array_mut() else {
        return false;
    };
    let n = args.len();
    let ours = n >= 2
        && args[n - 2] == "--snapshot-config"
        && args[n - 1]
            .as_str()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .is_some_and(|v| v["control_dir"] == CONTROL_MOUNT);
    if ours {
        args.truncate(n - 2);
    }
    ours
}

/// The spec's root, a bind of `folder` at the bundle's `rootfs`, named by
/// `folder` again: the root containerd gave, which the workload's identity
/// holds. Refused where the spec's root is not `folder` itself.
pub fn root_folder_as_given(spec: &mut Value, bundle: &Path, folder: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let root = bundle.join(spec["root"]["path"].as_str().unwrap_or_default());
    let id = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| (m.dev(), m.ino()))
            .map_err(|e| format!("root folder {}: {e}", p.display()))
    };
    if id(&root)? != id(folder)? {
        return Err(format!(
            "the container's root {} is not its root folder {}",
            root.display(),
            folder.display()
        ));
    }
    spec["root"]["path"] = Value::from(folder.display().to_string());
    Ok(())
}

/// The manifest, MAC verified with this host's key.
pub fn load(root: &Path, name: &str) -> Result<Manifest, Failure> {
    Manifest::load_verified(root, name).map_err(|e| Failure::Check(e.to_string()))
}

/// The container's tenant as the shim named it (`tenant`) agrees with the
/// spec's Kubernetes namespace, and the artifact's owner (`recorded`, from
/// the manifest) is the one the shim accepted (`owner`; the tenant itself
/// without one).
pub fn check_tenant(
    spec: &Value,
    recorded: &Tenant,
    tenant: &str,
    owner: Option<&str>,
) -> Result<(), String> {
    let tenant = Tenant::parse(tenant).map_err(|e| format!("--tenant: {e}"))?;
    let in_spec = Tenant::of_spec(tenant.containerd(), spec).map_err(|e| format!("tenant: {e}"))?;
    if in_spec != tenant {
        return Err(format!(
            "tenant: the spec says {in_spec}, the shim {tenant}"
        ));
    }
    let accepted = match owner {
        Some(o) => Tenant::parse(o).map_err(|e| format!("--owner: {e}"))?,
        None => tenant.clone(),
    };
    if *recorded != accepted {
        return Err(format!(
            "belongs to tenant {recorded}, not {accepted} (the container is tenant {tenant})"
        ));
    }
    Ok(())
}

/// Every host incompatibility and workload difference, one message.
/// `fingerprint_key`: the fleet's shared fingerprint key (the shim passes
/// `--fingerprint-key` when `fleet_fingerprint_key` is configured), else the
/// host key keys the live workload's secret fingerprints.
pub fn compare(
    root: &Path,
    fingerprint_key: Option<&Path>,
    manifest: &Manifest,
    host: &HostIdentity,
    spec: &Value,
) -> Result<(), Failure> {
    let mut diff = vsnap_artifact::compat::incompatibilities(&manifest.host, host);
    // Secret values are fingerprinted with the key the shim uses, as at capture.
    let key = vsnap_artifact::FingerprintKey::load(root, fingerprint_key)
        .map_err(|e| Failure::Check(e.to_string()))?;
    // The image digest comes from containerd's API, which a hook cannot ask:
    // the shim compares it before the hooks run.
    let mut live = Workload {
        image_digest: manifest.workload.image_digest.clone(),
        // The tenant is not part of the comparison: `check_tenant` and the
        // shim's policy decide whose artifact a container may restore.
        ..Workload::from_spec(spec, CONTROL_MOUNT, &key)
    }
    // The runtime config's per-pod names are the shim's to compare (it
    // refused another list before the hooks run): take the artifact's.
    .with_per_pod_env(&manifest.workload.per_pod_env);
    // A root folder the caller mounted as an overlay (dockerd's overlay2) is
    // identified by its image layers, which the shim reads from the mount
    // table and compares before the hooks run.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if is_overlay_mount_point(&live.rootfs, &mountinfo) {
        live.rootfs = manifest.workload.rootfs.clone();
    }
    diff.extend(manifest.workload.diff(&live));
    if diff.is_empty() {
        return Ok(());
    }
    Err(Failure::Check(format!(
        "artifact {}: made for another host or workload: {}",
        root.join(&manifest.name).display(),
        diff.join("; ")
    )))
}

/// Whether `path` (absolute) is an overlay's mount point in `mountinfo`.
fn is_overlay_mount_point(path: &str, mountinfo: &str) -> bool {
    path.starts_with('/')
        && vsnap_host::mountinfo::parse(mountinfo)
            .iter()
            .any(|r| r.mount_point == Path::new(path) && r.fs_type == "overlay")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_folder_is_named_as_given_only_where_the_root_is_that_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (bundle, folder, other) = (
            dir.path().join("b"),
            dir.path().join("shared"),
            dir.path().join("other"),
        );
        for d in [&bundle, &folder, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        // The bind's stand-in: a link in the bundle to the same inode.
        std::os::unix::fs::symlink(&folder, bundle.join("rootfs")).unwrap();
        let mut spec = serde_json::json!({"root": {"path": "rootfs"}});
        root_folder_as_given(&mut spec, &bundle, &folder).unwrap();
        assert_eq!(spec["root"]["path"], folder.display().to_string());
        let mut spec = serde_json::json!({"root": {"path": "rootfs"}});
        let e = root_folder_as_given(&mut spec, &bundle, &other).unwrap_err();
        assert!(
            e.contains("is not its root folder") && e.contains("other"),
            "{e}"
        );
        assert_eq!(spec["root"]["path"], "rootfs", "left as it was");
    }

    #[test]
    fn a_root_folder_the_caller_mounted_as_an_overlay_is_recognised() {
        let info = "36 25 0:31 / /d/overlay2/abc/merged rw,relatime shared:1 - overlay overlay rw,lowerdir=/l\n\
                    37 25 8:1 / /srv/rootfs rw,relatime shared:2 - ext4 /dev/vda rw\n";
        assert!(is_overlay_mount_point("/d/overlay2/abc/merged", info));
        assert!(!is_overlay_mount_point("/srv/rootfs", info));
        assert!(!is_overlay_mount_point("rootfs", info));
    }
    use serde_json::json;

    #[test]
    fn the_spec_and_the_manifest_must_agree_with_the_tenant_the_shim_named() {
        let spec = json!({"annotations": {"io.kubernetes.cri.sandbox-namespace": "team-a"}});
        let a = Tenant::parse("k8s.io/team-a").unwrap();
        let b = Tenant::parse("k8s.io/team-b").unwrap();
        check_tenant(&spec, &a, "k8s.io/team-a", None).unwrap();
        let e = check_tenant(&spec, &b, "k8s.io/team-a", None).unwrap_err();
        assert!(
            e.contains("belongs to tenant k8s.io/team-b, not k8s.io/team-a"),
            "{e}"
        );
        // Shared on purpose: the shim names the owner it accepted.
        check_tenant(&spec, &b, "k8s.io/team-a", Some("k8s.io/team-b")).unwrap();
        // A spec whose namespace is not the one the shim resolved.
        let e = check_tenant(&spec, &b, "k8s.io/team-b", None).unwrap_err();
        assert!(e.contains("the spec says k8s.io/team-a"), "{e}");
        let e = check_tenant(&json!({}), &a, "k8s.io/team-a", None).unwrap_err();
        assert!(e.contains("the spec says k8s.io,"), "{e}");
    }

    #[test]
    fn only_the_containers_gpus_are_compared() {
        let host = gpu::parse_nvidia_smi(
            "NVIDIA H200, GPU-aaaa, 570.124.06\nNVIDIA H200, GPU-bbbb, 570.124.06",
        )
        .unwrap();
        assert_eq!(
            gpu::entries(&own_gpus(host.clone(), "GPU-bbbb")),
            ["NVIDIA H200 GPU-bbbb 570.124.06"]
        );
        assert_eq!(own_gpus(host.clone(), "GPU-aaaa,GPU-bbbb"), host);
        assert!(own_gpus(host, "GPU-cccc").is_empty());
    }

    fn fake_nvidia_smi(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn nvidia_smi_is_read_as_the_shim_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let expected = NVIDIA_SMI_ARGS.join(" ");
        let smi = fake_nvidia_smi(
            dir.path(),
            "nvidia-smi",
            &format!(
                "[ \"$*\" = \"{expected}\" ] || exit 2\n\
                 echo 'NVIDIA H200, GPU-aaaa, 570.124.06'"
            ),
        );
        let found = gpus(&smi, Duration::from_secs(10)).unwrap();
        assert_eq!(gpu::entries(&found), ["NVIDIA H200 GPU-aaaa 570.124.06"]);

        // What the shim's preflight refuses, the hook refuses too.
        for (i, (answer, refusal)) in [
            ("", "lists no GPU (the artifact was made with GPUs)"),
            (
                "echo 'NVIDIA H200, 5f1c, 570.124.06'",
                "line \"NVIDIA H200, 5f1c, 570.124.06\" is not `name, uuid, driver_version`",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let smi = fake_nvidia_smi(dir.path(), &format!("nvidia-smi-{i}"), answer);
            match gpus(&smi, Duration::from_secs(10)) {
                Err(Failure::Check(e)) => assert!(e.ends_with(refusal), "{e}"),
                other => panic!("{answer:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_vsnaps_own_trailing_snapshot_config_is_stripped() {
        let config = json!({"mode": "startup", "control_dir": CONTROL_MOUNT}).to_string();
        let mut spec =
            json!({"process": {"args": ["vllm", "serve", "m", "--snapshot-config", config]}});
        assert!(strip_snapshot_config_arg(&mut spec));
        assert_eq!(spec["process"]["args"], json!(["vllm", "serve", "m"]));
        assert!(!strip_snapshot_config_arg(&mut spec), "once");
        let mut other =
            json!({"process": {"args": ["vllm", "--snapshot-config", "{\"control_dir\":\"/x\"}"]}});
        assert!(!strip_snapshot_config_arg(&mut other));
        assert_eq!(other["process"]["args"].as_array().unwrap().len(), 3);
    }
}
