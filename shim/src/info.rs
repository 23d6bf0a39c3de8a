//! `-info`: what containerd learns about this runtime before any shim runs.
//!
//! containerd (`TaskManager.PluginInfo`) runs `<shim> -info` with the
//! runtime options on stdin and reads a `RuntimeInfo` protobuf from stdout.
//! Its CRI plugin turns `features` into the RuntimeClass's handler features
//! (recursive read-only mounts, user namespaces) and its task manager checks
//! idmap mounts against them. Every container of this shim is run by runc
//! (a restore too, through CRIU), so the features are runc's own: we answer
//! what `<runc> features` prints, as containerd's runc-v2 shim does.

use std::process::Command;

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};

/// The type containerd registers for runtime-spec's `features.Features`;
/// the value is JSON (typeurl's encoding for non-protobuf types).
pub const FEATURES_TYPE_URL: &str =
    "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

pub fn runtime_info(runtime_id: &str, options: Option<&Any>) -> RuntimeInfo {
    // The runc binary the options name (a broken config is reported when a
    // container is created, where containerd shows it; here it means runc).
    let runc = crate::options::from_any(options)
        .map(|c| c.runc_binary)
        .unwrap_or_else(|_| "runc".into());
    let mut info = RuntimeInfo {
        name: runtime_id.to_string(),
        version: MessageField::some(RuntimeVersion {
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: String::new(),
            ..Default::default()
        }),
        options: MessageField::from_option(options.cloned()),
        ..Default::default()
    };
    match runc_features(&runc) {
        Ok(json) => {
            info.features = MessageField::some(Any {
                type_url: FEATURES_TYPE_URL.to_string(),
                value: json,
                ..Default::default()
            })
        }
        // As runc-v2 does for a runc without `features`: no features, which
        // containerd treats as "nothing known", never as an error.
        Err(e) => eprintln!("{runtime_id} -info: {e}"),
    }
    info
}

/// `<runc> features`, checked to be a JSON object.
fn runc_features(runc: &std::path::Path) -> Result<Vec<u8>, String> {
    let out = Command::new(runc)
        .arg("features")
        .output()
        .map_err(|e| format!("run {} features: {e}", runc.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} features failed ({}): {}",
            runc.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    match serde_json::from_slice::<serde_json::Value>(&out.stdout) {
        Ok(v) if v.is_object() => Ok(out.stdout),
        _ => Err(format!("{} features: not a JSON object", runc.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_carries_runc_features_and_echoes_options() {
        let runc = std::env::var("VSNAP_TEST_RUNC").unwrap_or_else(|_| "runc".into());
        if Command::new(&runc).arg("features").output().is_err() {
            eprintln!("skipped: no {runc} on PATH");
            return;
        }
        let opts = Any {
            type_url: "containerd.runc.v1.Options".into(),
            ..Default::default()
        };
        let info = runtime_info("io.vsnap.v1", Some(&opts));
        assert_eq!(info.name, "io.vsnap.v1");
        assert_eq!(info.options.type_url, opts.type_url);
        let f = info.features.as_ref().expect("features");
        assert_eq!(f.type_url, FEATURES_TYPE_URL);
        let v: serde_json::Value = serde_json::from_slice(&f.value).unwrap();
        assert!(v["mountOptions"].is_array(), "{v}");
    }
}
