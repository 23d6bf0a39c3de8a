//! Edits the bundle's OCI spec for a snapshot container: the control dir
//! bind-mounted at [`CONTROL_MOUNT`], the engine told where it is, and the
//! `vsnap-hook` preflight checks as `createRuntime` hooks.
//! Unknown spec fields are kept as they are (the spec is edited as JSON).
//! The spec is read once at create (`crate::bundle_spec::BundleSpec`),
//! edited in memory by the `add_*` functions and written once.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::snapshot::criu;
use crate::snapshot::{CONTROL_MOUNT, SNAPSHOT_CONFIG_ENV};

/// Adds the control dir mount and, for the startup profile (`timeout_s`
/// given), the engine's snapshot config in its environment.
pub fn add_control_dir(spec: &mut Value, control_dir: &Path, timeout_s: Option<u64>) -> Result<()> {
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
        return Ok(());
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
    Ok(())
}

/// Who the container's process runs as, as the host sees it: `process.user`'s
/// uid and gid (root when absent), through `linux.uidMappings` /
/// `gidMappings` when the container has a user namespace. The control dir
/// and what vsnap writes into it belong to this user.
pub fn process_owner(spec: &Value) -> Result<(u32, u32)> {
    let user = &spec["process"]["user"];
    let id = |key: &str| -> Result<u32> {
        match &user[key] {
            Value::Null => Ok(0),
            v => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("create: process.user.{key} {v} is not an id"))
                }),
        }
    };
    let host = |id: u32, mappings: &str| -> Result<u32> {
        let Some(list) = spec["linux"][mappings].as_array() else {
            return Ok(id);
        };
        list.iter()
            .find_map(|m| {
                let field = |k: &str| m[k].as_u64();
                let (inside, outside, size) =
                    (field("containerID")?, field("hostID")?, field("size")?);
                let id = u64::from(id);
                (inside <= id && id < inside + size)
                    .then(|| u32::try_from(outside + (id - inside)).ok())
                    .flatten()
            })
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "create: process.user id {id} is not in linux.{mappings}"
                ))
            })
    };
    Ok((
        host(id("uid")?, "uidMappings")?,
        host(id("gid")?, "gidMappings")?,
    ))
}

/// runc passes the CRIU config file named by this annotation to CRIU.
pub const CRIU_CONFIG_ANNOTATION: &str = "org.criu.config";

/// Gives runc one CRIU config for this container: what the spec's own
/// `org.criu.config` file (or, without one, `base_default`: runc's
/// `/etc/criu/runc.conf`) held, then vsnap's options (criu.rs), and points
/// the annotation at it. runc reads one file or the other, never both, so
/// nothing the operator configured is lost and vsnap's options always hold.
/// The config is written to `file` in the bundle; the spec names the
/// bundle's `criu::BUNDLE_CONFIG`, which it is moved to if it is another
/// (a capture's config kept beside a restore's until it is needed).
pub fn add_criu_config(
    spec: &mut Value,
    bundle: &Path,
    file: &str,
    base_default: &Path,
    plugin_dir: &Path,
    options: criu::options::Options,
) -> Result<()> {
    let script = match options.keep_link_remaps_in.as_deref() {
        Some(host_shm) => {
            use std::os::unix::fs::OpenOptionsExt;
            let path = bundle.join(criu::POST_DUMP_SCRIPT);
            let text = criu::post_dump_script(host_shm)?;
            let _ = std::fs::remove_file(&path);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o700)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
                .map_err(|e| Error::io(format!("create: write {}", path.display()), e))?;
            Some(path)
        }
        None => None,
    };
    let (path, named_path) = (bundle.join(file), bundle.join(criu::BUNDLE_CONFIG));
    let named = spec["annotations"][CRIU_CONFIG_ANNOTATION]
        .as_str()
        .map(str::to_string)
        // A create retried on the same bundle: the spec already names ours.
        .filter(|p| Path::new(p) != named_path);
    let base = criu::options::base_config(named.as_deref(), base_default)?;
    let body = options.config_text(
        base.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
        plugin_dir,
        script.as_deref(),
    );
    std::fs::write(&path, body)
        .map_err(|e| Error::io(format!("create: write {}", path.display()), e))?;
    if !spec["annotations"].is_object() {
        spec["annotations"] = json!({});
    }
    spec["annotations"][CRIU_CONFIG_ANNOTATION] = Value::String(named_path.display().to_string());
    Ok(())
}

/// The host folder bind-mounted at `/dev/shm`, when the container has one
/// (Kubernetes: an emptyDir of medium Memory). Its files are not in CRIU's
/// image (external mount), so vsnap carries them itself.
pub fn host_dev_shm(spec: &Value) -> Option<std::path::PathBuf> {
    spec["mounts"].as_array()?.iter().find_map(|m| {
        let bind = m["type"] == "bind"
            || m["options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"));
        (m["destination"] == "/dev/shm" && bind)
            .then(|| m["source"].as_str().map(std::path::PathBuf::from))
            .flatten()
    })
}

/// Appends `--snapshot-config <json>` to the argv (stock vLLM reads its
/// snapshot config from its arguments).
pub fn add_snapshot_config_arg(spec: &mut Value, timeout_s: u64) -> Result<()> {
    let config =
        json!({"mode": "startup", "control_dir": CONTROL_MOUNT, "timeout_s": timeout_s as f64});
    let args = spec["process"]["args"]
        .as_array_mut()
        .ok_or_else(|| Error::InvalidArgument("create: spec process.args is not a list".into()))?;
    args.push(Value::String("--snapshot-config".into()));
    args.push(Value::String(config.to_string()));
    Ok(())
}

/// The OCI hook binary shipped beside the shim (package vsnap-oci-hooks).
pub const HOOK_BINARY: &str = "vsnap-hook";
/// Seconds the runtime gives each hook before it fails the container.
pub const HOOK_TIMEOUT_S: u64 = 30;

/// `vsnap-hook` in the shim binary's own folder, when it is installed there.
pub fn hook_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let hook = exe.parent()?.join(HOOK_BINARY);
    hook.is_file().then_some(hook)
}

/// Appends one `createRuntime` hook per check (`{path: hook, args:
/// ["vsnap-hook", check...], timeout: 30}`), after the hooks the spec already
/// has. Idempotent: a hook already there with the same path and args is not
/// added again.
pub fn add_hooks(spec: &mut Value, hook: &Path, checks: &[Vec<String>]) -> Result<()> {
    let invalid = |what: &str| Error::InvalidArgument(format!("create: spec {what}"));
    let hook = hook
        .to_str()
        .ok_or_else(|| invalid(&format!("hook path {} is not UTF-8", hook.display())))?;
    let object = spec
        .as_object_mut()
        .ok_or_else(|| invalid("is not a JSON object"))?;
    let hooks = object.entry("hooks").or_insert_with(|| json!({}));
    if hooks.is_null() {
        *hooks = json!({});
    }
    let hooks = hooks
        .as_object_mut()
        .ok_or_else(|| invalid("hooks is not an object"))?;
    let list = hooks.entry("createRuntime").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    let list = list
        .as_array_mut()
        .ok_or_else(|| invalid("hooks.createRuntime is not a list"))?;
    for check in checks {
        let args: Vec<&str> = std::iter::once(HOOK_BINARY)
            .chain(check.iter().map(String::as_str))
            .collect();
        let entry = json!({"path": hook, "args": args, "timeout": HOOK_TIMEOUT_S});
        if !list.contains(&entry) {
            list.push(entry);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle_spec::BundleSpec;

    /// The bundle holds config.json and no temporary file beside it.
    fn assert_only_config_json(bundle: &Path) {
        let names: Vec<_> = std::fs::read_dir(bundle)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["config.json"], "no temporary file is left");
    }

    #[test]
    fn the_control_dir_is_mounted_and_announced_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","process":{"args":["x"],"env":["A=1"],"cwd":"/"},"root":{"path":"r"},"x-custom":1}"#,
        )
        .unwrap();
        let mut spec = BundleSpec::read(dir.path()).unwrap();
        for _ in 0..2 {
            add_control_dir(spec.value_mut(), Path::new("/var/lib/vsnap/c1"), Some(60)).unwrap();
        }
        spec.write(dir.path()).unwrap();
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
        assert_only_config_json(dir.path());
    }

    #[test]
    fn the_process_owner_is_the_spec_user_as_the_host_sees_it() {
        assert_eq!(process_owner(&json!({"process": {}})).unwrap(), (0, 0));
        let plain = json!({"process": {"user": {"uid": 1000, "gid": 100}}});
        assert_eq!(process_owner(&plain).unwrap(), (1000, 100));
        let userns = json!({
            "process": {"user": {"uid": 1000, "gid": 100}},
            "linux": {
                "uidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
                "gidMappings": [{"containerID": 0, "hostID": 300000, "size": 1000},
                                {"containerID": 1000, "hostID": 5, "size": 1}]
            }
        });
        assert_eq!(process_owner(&userns).unwrap(), (201000, 300100));
        let unmapped = json!({
            "process": {"user": {"uid": 70000}},
            "linux": {"uidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}]}
        });
        let e = process_owner(&unmapped).unwrap_err().to_string();
        assert!(e.contains("70000 is not in linux.uidMappings"), "{e}");
        let e = process_owner(&json!({"process": {"user": {"uid": -1}}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("process.user.uid -1"), "{e}");
    }

    #[test]
    fn hooks_are_appended_once_after_existing_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","process":{"args":["x"]},"hooks":{"createRuntime":[{"path":"/usr/bin/nvidia-ctk","args":["nvidia-ctk","hook"]}],"poststop":[{"path":"/bin/true"}]},"x-custom":1}"#,
        )
        .unwrap();
        let checks = vec![
            vec!["ownership".to_string(), "--control-dir".into(), "/c".into()],
            vec!["io-uring".to_string()],
        ];
        let mut spec = BundleSpec::read(dir.path()).unwrap().value().clone();
        for _ in 0..2 {
            add_hooks(&mut spec, Path::new("/opt/vsnap/vsnap-hook"), &checks).unwrap();
        }
        let hooks = spec["hooks"]["createRuntime"].as_array().unwrap();
        assert_eq!(hooks.len(), 3, "{hooks:?}");
        assert_eq!(
            hooks[0]["path"], "/usr/bin/nvidia-ctk",
            "existing hooks first"
        );
        assert_eq!(
            hooks[1],
            json!({"path": "/opt/vsnap/vsnap-hook", "args": ["vsnap-hook", "ownership", "--control-dir", "/c"], "timeout": 30})
        );
        assert_eq!(hooks[2]["args"], json!(["vsnap-hook", "io-uring"]));
        assert_eq!(spec["hooks"]["poststop"].as_array().unwrap().len(), 1);
        assert_eq!(spec["x-custom"], 1, "unknown fields survive");
        assert_only_config_json(dir.path());
    }

    #[test]
    fn a_spec_without_hooks_gets_them_and_a_bad_one_is_refused() {
        let mut spec = json!({"process":{"args":["x"]},"hooks":null});
        add_hooks(&mut spec, Path::new("/h"), &[vec!["io-uring".into()]]).unwrap();
        assert_eq!(spec["hooks"]["createRuntime"][0]["path"], "/h");
        let mut spec = json!({"process":{"args":["x"]},"hooks":[]});
        let err = add_hooks(&mut spec, Path::new("/h"), &[vec!["io-uring".into()]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("hooks is not an object"), "{err}");
    }

    #[test]
    fn the_hook_binary_is_looked_for_beside_the_running_binary() {
        let exe = std::env::current_exe().unwrap();
        let expected = exe.parent().unwrap().join(HOOK_BINARY);
        assert_eq!(hook_binary(), expected.is_file().then_some(expected));
    }
}
