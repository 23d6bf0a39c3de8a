//! Edits the bundle's OCI spec for a snapshot container: the control dir
//! bind-mounted at [`CONTROL_MOUNT`] and the engine told where it is.
//! Unknown spec fields are kept as they are (the spec is edited as JSON).

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use super::{CONTROL_MOUNT, SNAPSHOT_CONFIG_ENV};
use crate::error::{Error, Result};

/// The spec's annotations (empty when it has none).
pub fn annotations(bundle: &Path) -> Result<HashMap<String, String>> {
    let spec = read(bundle)?;
    Ok(spec
        .get("annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default())
}

pub fn read(bundle: &Path) -> Result<Value> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path)
        .map_err(|e| Error::io(format!("create: read {}", path.display()), e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::InvalidArgument(format!("create: bundle {}: {e}", path.display())))
}

/// Adds the control dir mount and, for the startup profile (`timeout_s`
/// given), the engine's snapshot config in its environment.
pub fn add_control_dir(bundle: &Path, control_dir: &Path, timeout_s: Option<u64>) -> Result<()> {
    let mut spec = read(bundle)?;
    let mount = json!({
        "destination": CONTROL_MOUNT,
        "type": "bind",
        "source": control_dir,
        "options": ["rbind", "rw", "nosuid", "nodev"],
    });
    match spec.get_mut("mounts").and_then(Value::as_array_mut) {
        Some(mounts) => {
            mounts.retain(|m| m.get("destination").and_then(Value::as_str) != Some(CONTROL_MOUNT));
            mounts.push(mount);
        }
        None => spec["mounts"] = json!([mount]),
    }
    let Some(timeout_s) = timeout_s else {
        return write(bundle, &spec);
    };
    let config =
        json!({"mode": "startup", "control_dir": CONTROL_MOUNT, "timeout_s": timeout_s as f64});
    let entry = format!("{SNAPSHOT_CONFIG_ENV}={config}");
    let process = spec
        .get_mut("process")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| Error::InvalidArgument("create: spec has no process".into()))?;
    let env = process.entry("env").or_insert_with(|| json!([]));
    let env = env
        .as_array_mut()
        .ok_or_else(|| Error::InvalidArgument("create: spec process.env is not a list".into()))?;
    env.retain(|e| {
        !e.as_str()
            .is_some_and(|s| s.starts_with(&format!("{SNAPSHOT_CONFIG_ENV}=")))
    });
    env.push(Value::String(entry));
    write(bundle, &spec)
}

/// The process's argv.
pub fn args(spec: &Value) -> Vec<String> {
    spec["process"]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Appends `--snapshot-config <json>` to the argv (stock vLLM reads its
/// snapshot config from its arguments).
pub fn add_snapshot_config_arg(bundle: &Path, timeout_s: u64) -> Result<()> {
    let mut spec = read(bundle)?;
    let config =
        json!({"mode": "startup", "control_dir": CONTROL_MOUNT, "timeout_s": timeout_s as f64});
    let args = spec["process"]["args"]
        .as_array_mut()
        .ok_or_else(|| Error::InvalidArgument("create: spec process.args is not a list".into()))?;
    args.push(Value::String("--snapshot-config".into()));
    args.push(Value::String(config.to_string()));
    write(bundle, &spec)
}

/// Replaces the bundle's config.json (write a temporary file, rename).
pub fn write(bundle: &Path, spec: &Value) -> Result<()> {
    let path = bundle.join("config.json");
    let tmp = bundle.join(".config.json.vsnap");
    let bytes = serde_json::to_vec(spec).map_err(|e| Error::Other(format!("create: spec: {e}")))?;
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, &path))
        .map_err(|e| Error::io(format!("create: write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_dir_is_mounted_and_announced_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","process":{"args":["x"],"env":["A=1"],"cwd":"/"},"root":{"path":"r"},"x-custom":1}"#,
        )
        .unwrap();
        for _ in 0..2 {
            add_control_dir(dir.path(), Path::new("/var/lib/vsnap/c1"), Some(60)).unwrap();
        }
        let spec: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap())
                .unwrap();
        assert_eq!(spec["mounts"].as_array().unwrap().len(), 1);
        assert_eq!(spec["mounts"][0]["source"], "/var/lib/vsnap/c1");
        let env = spec["process"]["env"].as_array().unwrap();
        assert_eq!(env.len(), 2, "{env:?}");
        assert!(env[1]
            .as_str()
            .unwrap()
            .contains("\"control_dir\":\"/run/vsnap/control\""));
        assert_eq!(spec["x-custom"], 1, "unknown fields survive");
    }
}
