//! GPUs given by an OCI hook (the NVIDIA container runtime, `ctr run
//! --gpus`): noticed in the spec and refused, pointing at CDI.

use std::path::Path;

use serde_json::Value;

/// An OCI hook in the spec that gives the container GPUs, if any, as
/// `stage hook path args...`: the NVIDIA container runtime hook, or the
/// prestart hook `ctr run --gpus` adds (the containerd binary running
/// `containerd oci-hook -- nvidia-container-cli ... configure`). Such a hook
/// adds devices and mounts at create time, invisible to
/// [`spec_nvidia_devices`](super::spec_nvidia_devices), unknown to CRIU, and
/// runc runs it again at restore.
pub fn spec_nvidia_hook(spec: &Value) -> Option<String> {
    let hooks = spec.get("hooks")?.as_object()?;
    let is_nvidia = |p: &str| {
        Path::new(p)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("nvidia-container"))
    };
    for (stage, list) in hooks {
        for hook in list.as_array().into_iter().flatten() {
            let path = hook.get("path").and_then(Value::as_str).unwrap_or("");
            let args: Vec<&str> = hook
                .get("args")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if is_nvidia(path) || args.iter().any(|a| is_nvidia(a)) {
                let shown: Vec<&str> = args.iter().skip(1).take(3).copied().collect();
                return Some(
                    format!("{stage} hook {path} {}", shown.join(" "))
                        .trim()
                        .to_string(),
                );
            }
        }
    }
    None
}

/// Refuses a snapshot container whose GPUs come from an OCI hook
/// ([`spec_nvidia_hook`]), pointing at CDI, which puts the devices and
/// mounts in the spec itself where CRIU and runc see them.
pub fn check_no_gpu_hook(spec: &Value) -> Result<(), String> {
    match spec_nvidia_hook(spec) {
        None => Ok(()),
        Some(hook) => Err(format!(
            "the container gets its GPUs from an OCI hook ({hook}; `ctr run --gpus` and the legacy NVIDIA runtime add one): \
             the devices and mounts it makes are unknown to CRIU and runc would run it again at restore; \
             give the container its GPUs through CDI instead (`nvidia-ctk cdi generate`, then a CDI device \
             such as nvidia.com/gpu=0; docs/gpu-hosts.md)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::devices::spec_nvidia_devices;
    use super::*;
    use serde_json::json;

    #[test]
    fn an_nvidia_hook_is_noticed() {
        let spec = json!({"hooks": {"prestart": [
            {"path": "/usr/bin/true"},
            {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}
        ]}});
        assert_eq!(
            spec_nvidia_hook(&spec).as_deref(),
            Some("prestart hook /usr/bin/nvidia-container-runtime-hook prestart")
        );
        assert_eq!(spec_nvidia_hook(&json!({})), None);
    }

    #[test]
    fn gpus_given_by_ctr_run_gpus_are_refused_pointing_at_cdi() {
        let spec: Value =
            serde_json::from_str(include_str!("../../../tests/fixtures/spec-ctr-gpus.json"))
                .unwrap();
        let hook = spec_nvidia_hook(&spec).unwrap();
        assert_eq!(
            hook,
            "prestart hook /usr/local/bin/containerd oci-hook -- /usr/bin/nvidia-container-cli"
        );
        let e = check_no_gpu_hook(&spec).unwrap_err();
        assert!(e.contains("through CDI"), "{e}");
        assert!(e.contains("ctr run --gpus"), "{e}");
        // A CDI spec: devices and mounts in the spec itself, no hook that
        // injects GPUs (nvidia-ctk's createContainer hooks only update the
        // ld cache and make symlinks).
        let cdi: Value =
            serde_json::from_str(include_str!("../../../tests/fixtures/spec-cdi-gpu.json"))
                .unwrap();
        check_no_gpu_hook(&cdi).unwrap();
        assert_eq!(
            spec_nvidia_devices(&cdi),
            [
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia1",
                "/dev/nvidiactl"
            ]
        );
    }
}
