//! containerd's runtime options (the `options` Any of CreateTask) turned into
//! the shim's [`RuntimeConfig`]. This is the edge: protobuf stays here.
//!
//! Accepted: nothing (the default config file, if present), containerd's
//! `runtimeoptions.v1.Options` (`ConfigPath` / `ConfigBody`, what containerd
//! and `ctr --runtime-config-path` send to non-runc runtimes), and
//! `containerd.runc.v1.Options` (so a runc runtime entry can be pointed at
//! vsnap unchanged). Anything else is refused by name.

use std::path::Path;

use containerd_shim_protos::protobuf::{well_known_types::any::Any, CodedInputStream, Message};
use containerd_shim_protos::shim::oci::Options as RuncOptions;
use vsnap_config::{ConfigSource, RuntimeConfig, DEFAULT_CONFIG_PATH};

use crate::error::{Error, Result};

const RUNC_OPTIONS: &str = "containerd.runc.v1.Options";
const RUNTIME_OPTIONS: &str = "runtimeoptions.v1.Options";

/// The runtime config for one container.
pub fn from_any(any: Option<&Any>) -> Result<RuntimeConfig> {
    let invalid = |m: String| Error::InvalidArgument(format!("create: runtime options: {m}"));
    let Some(any) = any.filter(|a| !a.type_url.is_empty() || !a.value.is_empty()) else {
        return default_config().map_err(invalid);
    };
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    match name {
        RUNTIME_OPTIONS => {
            let (path, body) = decode_runtime_options(&any.value)
                .map_err(|e| invalid(format!("malformed {RUNTIME_OPTIONS}: {e}")))?;
            if !body.is_empty() {
                let body = String::from_utf8(body)
                    .map_err(|_| invalid("ConfigBody is not UTF-8".into()))?;
                let mut config = RuntimeConfig::parse(&body, "ConfigBody")
                    .map_err(|e| invalid(e.to_string()))?;
                config.source = ConfigSource::Body(body);
                Ok(config)
            } else if !path.is_empty() {
                RuntimeConfig::load(Path::new(&path)).map_err(|e| invalid(e.to_string()))
            } else {
                default_config().map_err(invalid)
            }
        }
        RUNC_OPTIONS => {
            let o = RuncOptions::parse_from_bytes(&any.value)
                .map_err(|e| invalid(format!("malformed {RUNC_OPTIONS}: {e}")))?;
            let mut config = default_config().map_err(invalid)?;
            if !o.binary_name.is_empty() {
                config.runc_binary = o.binary_name.into();
            }
            if !o.root.is_empty() {
                config.runc_root = Some(o.root.into());
            }
            config.systemd_cgroup |= o.systemd_cgroup;
            config.no_pivot_root |= o.no_pivot_root;
            Ok(config)
        }
        other => Err(invalid(format!(
            "unsupported type {other:?}: expected {RUNTIME_OPTIONS} or {RUNC_OPTIONS}"
        ))),
    }
}

fn default_config() -> std::result::Result<RuntimeConfig, String> {
    let path = Path::new(DEFAULT_CONFIG_PATH);
    if path.exists() {
        RuntimeConfig::load(path).map_err(|e| e.to_string())
    } else {
        Ok(RuntimeConfig::default())
    }
}

/// Decodes containerd's `runtimeoptions.v1.Options { type_url = 1;
/// config_path = 2; config_body = 3 }` (no generated type exists for it).
fn decode_runtime_options(bytes: &[u8]) -> std::result::Result<(String, Vec<u8>), String> {
    let mut input = CodedInputStream::from_bytes(bytes);
    let (mut path, mut body) = (String::new(), Vec::new());
    while let Some(tag) = input.read_raw_tag_or_eof().map_err(|e| e.to_string())? {
        let (field, wire) = (tag >> 3, tag & 7);
        match (field, wire) {
            (1, 2) => {
                input.read_string().map_err(|e| e.to_string())?;
            }
            (2, 2) => path = input.read_string().map_err(|e| e.to_string())?,
            (3, 2) => body = input.read_bytes().map_err(|e| e.to_string())?,
            _ => return Err(format!("unknown field {field} (wire type {wire})")),
        }
    }
    Ok((path, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime_options(path: &str, body: &str) -> Any {
        // Hand-encoded: tag 2 (path) and tag 3 (body), both length-delimited.
        let mut value = Vec::new();
        for (tag, s) in [(0x12u8, path), (0x1a, body)] {
            if !s.is_empty() {
                value.push(tag);
                value.push(s.len() as u8);
                value.extend_from_slice(s.as_bytes());
            }
        }
        Any {
            type_url: format!("type.googleapis.com/{RUNTIME_OPTIONS}"),
            value,
            ..Default::default()
        }
    }

    #[test]
    fn inline_body_is_parsed() {
        let c = from_any(Some(&runtime_options("", "runc_binary = \"/x/runc\""))).unwrap();
        assert_eq!(c.runc_binary, std::path::PathBuf::from("/x/runc"));
    }

    #[test]
    fn config_path_is_loaded_and_errors_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "bogus_key = 1\n").unwrap();
        let err = from_any(Some(&runtime_options(p.to_str().unwrap(), "")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("bogus_key") && err.contains("c.toml"), "{err}");
    }

    #[test]
    fn unknown_type_is_refused_by_name() {
        let any = Any {
            type_url: "example.com/Bogus".into(),
            ..Default::default()
        };
        let err = from_any(Some(&any)).unwrap_err().to_string();
        assert!(err.contains("Bogus"), "{err}");
    }

    #[test]
    fn malformed_bytes_are_refused() {
        let any = Any {
            type_url: RUNTIME_OPTIONS.into(),
            value: vec![0x12, 0x40, b'x'],
            ..Default::default()
        };
        let err = from_any(Some(&any)).unwrap_err().to_string();
        assert!(err.contains("malformed"), "{err}");
    }

    #[test]
    fn runc_options_override_the_binary() {
        let o = RuncOptions {
            binary_name: "/opt/runc".into(),
            ..Default::default()
        };
        let any = Any {
            type_url: RUNC_OPTIONS.into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        };
        assert_eq!(
            from_any(Some(&any)).unwrap().runc_binary,
            std::path::PathBuf::from("/opt/runc")
        );
    }
}
