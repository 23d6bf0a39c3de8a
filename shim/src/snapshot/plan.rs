//! The `vsnap.io/` annotations, turned into a [`Plan`]. Invalid values fail
//! the create with an error naming the annotation.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::{Error, Result};

pub const PLAN: &str = "vsnap.io/plan";
pub const ARTIFACT: &str = "vsnap.io/artifact";
pub const LISTEN: &str = "vsnap.io/listen";
pub const AFTER_CAPTURE: &str = "vsnap.io/after-capture";
pub const CAPTURE_TIMEOUT: &str = "vsnap.io/capture-timeout";
pub const ACTIVATION_TIMEOUT: &str = "vsnap.io/activation-timeout";
/// `startup` (vLLM's control-dir protocol) or `barrier` (released vLLM).
pub const ENGINE_PROTOCOL: &str = "vsnap.io/engine-protocol";
/// CRI marks a pod's sandbox (pause) container with this; it always runs plain.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Create,
    Restore,
    /// Restore when the artifact exists, otherwise create.
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterCapture {
    /// Activate the original process (kind "donor") so it goes on serving.
    Serve,
    /// Stop the original process once the artifact is published.
    Exit,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub mode: Mode,
    /// `None` only with `auto`: the name is then derived from the workload.
    pub artifact: Option<String>,
    pub host: Option<String>,
    pub port: u16,
    pub after_capture: AfterCapture,
    pub capture_timeout: Option<Duration>,
    pub activation_timeout: Option<Duration>,
    /// The engine protocol annotation, resolved against the argv at create.
    pub engine_protocol: Option<String>,
}

/// `None` when the container runs plain (no plan, `off`, or a CRI sandbox).
pub fn from_annotations(a: &HashMap<String, String>) -> Result<Option<Plan>> {
    let invalid =
        |key: &str, msg: String| Error::InvalidArgument(format!("create: annotation {key}: {msg}"));
    if a.get(CRI_CONTAINER_TYPE).map(String::as_str) == Some("sandbox") {
        return Ok(None);
    }
    let mode = match a.get(PLAN).map(String::as_str) {
        None | Some("off") => return Ok(None),
        Some("create") => Mode::Create,
        Some("restore") => Mode::Restore,
        Some("auto") => Mode::Auto,
        Some(other) => {
            return Err(invalid(
                PLAN,
                format!("{other:?} is not one of off, create, restore, auto"),
            ))
        }
    };
    let artifact = match (a.get(ARTIFACT), mode) {
        (Some(name), _) => {
            check_artifact_name(name).map_err(|m| invalid(ARTIFACT, m))?;
            Some(name.clone())
        }
        (None, Mode::Auto) => None,
        (None, _) => {
            return Err(invalid(
                ARTIFACT,
                "required with the create and restore plans".into(),
            ))
        }
    };
    let listen = a
        .get(LISTEN)
        .ok_or_else(|| invalid(LISTEN, "required with a snapshot plan (HOST:PORT)".into()))?;
    let (host, port) = parse_listen(listen).map_err(|m| invalid(LISTEN, m))?;
    let after_capture = match a.get(AFTER_CAPTURE).map(String::as_str) {
        None | Some("serve") => AfterCapture::Serve,
        Some("exit") => AfterCapture::Exit,
        Some(other) => {
            return Err(invalid(
                AFTER_CAPTURE,
                format!("{other:?} is not one of serve, exit"),
            ))
        }
    };
    let seconds = |key: &str| -> Result<Option<Duration>> {
        match a.get(key) {
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(s) if s > 0 && s <= 86_400 => Ok(Some(Duration::from_secs(s))),
                _ => Err(invalid(
                    key,
                    format!("{v:?} is not a number of seconds in 1..=86400"),
                )),
            },
        }
    };
    Ok(Some(Plan {
        mode,
        artifact,
        host,
        port,
        after_capture,
        capture_timeout: seconds(CAPTURE_TIMEOUT)?,
        activation_timeout: seconds(ACTIVATION_TIMEOUT)?,
        engine_protocol: a.get(ENGINE_PROTOCOL).cloned(),
    }))
}

/// An artifact is a plain name under the artifact root: no paths, no dots first.
pub fn check_artifact_name(name: &str) -> std::result::Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > 128 {
        return Err(format!("{name:?} must be 1-128 characters"));
    }
    if name.starts_with('.') || !name.chars().all(ok_char) {
        return Err(format!(
            "{name:?} must be a name under the artifact root ([A-Za-z0-9_.-], not starting with '.'); paths are refused"
        ));
    }
    Ok(())
}

/// `HOST:PORT`, `[V6]:PORT` or `:PORT` (all interfaces, host null).
fn parse_listen(v: &str) -> std::result::Result<(Option<String>, u16), String> {
    let (host, port) = v
        .rsplit_once(':')
        .ok_or_else(|| format!("{v:?} is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{v:?}: port must be 1-65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.contains(char::is_whitespace) {
        return Err(format!("{v:?}: host has whitespace"));
    }
    Ok(((!host.is_empty()).then(|| host.to_string()), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_plan_or_off_runs_plain() {
        assert_eq!(from_annotations(&ann(&[])).unwrap(), None);
        assert_eq!(from_annotations(&ann(&[(PLAN, "off")])).unwrap(), None);
    }

    #[test]
    fn a_cri_sandbox_always_runs_plain() {
        let a = ann(&[(PLAN, "create"), (CRI_CONTAINER_TYPE, "sandbox")]);
        assert_eq!(from_annotations(&a).unwrap(), None);
    }

    #[test]
    fn a_full_plan_is_read() {
        let a = ann(&[
            (PLAN, "create"),
            (ARTIFACT, "qwen3-0.6b"),
            (LISTEN, "127.0.0.1:8000"),
            (AFTER_CAPTURE, "exit"),
            (CAPTURE_TIMEOUT, "60"),
        ]);
        let p = from_annotations(&a).unwrap().unwrap();
        assert_eq!(p.mode, Mode::Create);
        assert_eq!(p.host.as_deref(), Some("127.0.0.1"));
        assert_eq!(p.port, 8000);
        assert_eq!(p.after_capture, AfterCapture::Exit);
        assert_eq!(p.capture_timeout, Some(Duration::from_secs(60)));
    }

    #[test]
    fn bad_values_name_the_annotation() {
        let base = [(ARTIFACT, "a"), (LISTEN, ":8000")];
        for (key, value) in [
            (PLAN, "sometimes"),
            (ARTIFACT, "../etc"),
            (ARTIFACT, "/var/lib/other"),
            (ARTIFACT, ".hidden"),
            (LISTEN, "8000"),
            (LISTEN, "host:0"),
            (AFTER_CAPTURE, "linger"),
            (CAPTURE_TIMEOUT, "0"),
            (ACTIVATION_TIMEOUT, "soon"),
        ] {
            let mut a = ann(&base);
            a.insert(PLAN.into(), "create".into());
            a.insert(key.into(), value.into());
            let err = from_annotations(&a).unwrap_err().to_string();
            assert!(err.contains(key), "{key}={value}: {err}");
        }
    }

    #[test]
    fn only_auto_may_leave_the_artifact_unnamed() {
        let p = from_annotations(&ann(&[(PLAN, "auto"), (LISTEN, ":8000")]))
            .unwrap()
            .unwrap();
        assert_eq!(p.artifact, None);
        let err = from_annotations(&ann(&[(PLAN, "restore"), (LISTEN, ":8000")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(ARTIFACT), "{err}");
    }

    #[test]
    fn listen_without_host_means_all_interfaces() {
        assert_eq!(parse_listen(":8000").unwrap(), (None, 8000));
        assert_eq!(parse_listen("[::1]:80").unwrap(), (Some("::1".into()), 80));
    }
}
