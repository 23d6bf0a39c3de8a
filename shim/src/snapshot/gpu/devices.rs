//! Which GPUs a container was given: the NVIDIA devices of its OCI spec,
//! matched to nvidia-smi's GPUs through the driver's `/proc` information.

use std::path::Path;

use serde_json::Value;
use vsnap_artifact::Gpu;

use super::nvidia_smi::GpuIdentity;

pub(super) fn is_nvidia_path(p: &str) -> bool {
    p.starts_with("/dev/nvidia")
}

/// The NVIDIA device paths an OCI spec gives its container: entries of
/// `linux.devices` and the destinations of mounts whose source or
/// destination is a `/dev/nvidia*` path (how CDI and device plugins add
/// GPUs). Sorted, without duplicates; empty: no NVIDIA device in the spec.
///
/// A prestart hook of the legacy NVIDIA container runtime adds devices only
/// when the container is created and they do not show here; see
/// [`spec_nvidia_hook`](super::hook::spec_nvidia_hook).
pub fn spec_nvidia_devices(spec: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let devices = spec
        .pointer("/linux/devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for d in devices {
        if let Some(p) = d.get("path").and_then(Value::as_str) {
            if is_nvidia_path(p) {
                out.push(p.to_string());
            }
        }
    }
    let mounts = spec
        .get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for m in mounts {
        let dest = m.get("destination").and_then(Value::as_str);
        let src = m.get("source").and_then(Value::as_str);
        if dest.is_some_and(is_nvidia_path) || src.is_some_and(is_nvidia_path) {
            if let Some(dest) = dest {
                out.push(dest.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The GPUs the container was given, of those nvidia-smi lists: its spec's
/// `/dev/nvidiaN` devices are matched to GPU UUIDs through the driver's
/// `<proc_root>/driver/nvidia/gpus/*/information` ("Device Minor",
/// "GPU UUID"). A spec without a GPU device node keeps the whole list.
pub fn container_gpus(
    host: &GpuIdentity,
    devices: &[String],
    proc_root: &Path,
) -> Result<Vec<Gpu>, String> {
    let minors: Vec<u32> = devices.iter().filter_map(|d| gpu_device_index(d)).collect();
    if minors.is_empty() {
        return Ok(host.gpus.clone());
    }
    let dir = proc_root.join("driver/nvidia/gpus");
    let by_minor = uuids_by_minor(&dir);
    let mut out = Vec::new();
    for minor in minors {
        let uuid = by_minor
            .iter()
            .find(|(m, _)| *m == minor)
            .map(|(_, u)| u)
            .ok_or_else(|| {
                format!(
                    "/dev/nvidia{minor}: no GPU with device minor {minor} under {}",
                    dir.display()
                )
            })?;
        let gpu = host.gpus.iter().find(|g| &g.uuid == uuid).ok_or_else(|| {
            format!("/dev/nvidia{minor} is GPU {uuid}, which nvidia-smi does not list")
        })?;
        if !out.contains(gpu) {
            out.push(gpu.clone());
        }
    }
    Ok(out)
}

/// `(device minor, GPU UUID)` of each GPU the driver describes under `dir`
/// (`*/information`); GPUs whose file does not tell both are left out.
fn uuids_by_minor(dir: &Path) -> Vec<(u32, String)> {
    let mut by_minor = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path().join("information")) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim_start().strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        if let (Some(minor), Some(uuid)) = (field("Device Minor"), field("GPU UUID")) {
            if let Ok(minor) = minor.parse() {
                by_minor.push((minor, uuid));
            }
        }
    }
    by_minor
}

/// `Some(N)` for a GPU device node `/dev/nvidiaN` (not nvidiactl, nvidia-uvm,
/// nvidia-modeset or nvidia-caps).
pub fn gpu_device_index(path: &str) -> Option<u32> {
    let n = path.strip_prefix("/dev/nvidia")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::super::nvidia_smi::parse_gpus;
    use super::*;
    use serde_json::json;
    use std::fs;

    #[test]
    fn nvidia_devices_are_found_in_devices_and_mounts() {
        let spec = json!({
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev/nvidia-caps", "type": "bind", "source": "/dev/nvidia-caps"},
                {"destination": "/dev/nvidia0", "type": "bind", "source": "/dev/nvidia0"}
            ],
            "linux": {"devices": [
                {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
                {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
                {"path": "/dev/nvidia-uvm", "type": "c", "major": 508, "minor": 0}
            ]}
        });
        assert_eq!(
            spec_nvidia_devices(&spec),
            [
                "/dev/nvidia-caps",
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/nvidiactl"
            ]
        );
        assert!(spec_nvidia_devices(&json!({"ociVersion": "1.0.2"})).is_empty());
        assert!(spec_nvidia_devices(&json!({"linux": {"devices": null}, "mounts": 3})).is_empty());
    }

    #[test]
    fn the_containers_gpus_are_its_device_nodes() {
        let proc = tempfile::tempdir().unwrap();
        for (bus, minor, uuid) in [
            (
                "0000:18:00.0",
                0,
                "GPU-aaaaaaaa-0000-1111-2222-333344445555",
            ),
            (
                "0000:2a:00.0",
                1,
                "GPU-bbbbbbbb-0000-1111-2222-333344445555",
            ),
        ] {
            let dir = proc.path().join("driver/nvidia/gpus").join(bus);
            fs::create_dir_all(&dir).unwrap();
            fs::write(
                dir.join("information"),
                format!("Model: \t\t NVIDIA H200\nIRQ:   \t\t 240\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\nBus Location: \t {bus}\n"),
            )
            .unwrap();
        }
        let host = parse_gpus(
            "NVIDIA H200, GPU-aaaaaaaa-0000-1111-2222-333344445555, 570.124.06\n\
             NVIDIA H200, GPU-bbbbbbbb-0000-1111-2222-333344445555, 570.124.06",
        )
        .unwrap();
        let devices = vec![
            "/dev/nvidia-uvm".to_string(),
            "/dev/nvidia1".into(),
            "/dev/nvidiactl".into(),
        ];
        let mine = container_gpus(&host, &devices, proc.path()).unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].uuid, "GPU-bbbbbbbb-0000-1111-2222-333344445555");
        assert_eq!(
            container_gpus(&host, &["/dev/nvidiactl".into()], proc.path())
                .unwrap()
                .len(),
            2
        );
        let e = container_gpus(&host, &["/dev/nvidia7".into()], proc.path()).unwrap_err();
        assert!(
            e.starts_with("/dev/nvidia7: no GPU with device minor 7"),
            "{e}"
        );
    }
}
