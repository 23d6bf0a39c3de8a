//! The control-dir messages. Struct fields are declared in sorted order (the wire form
//! sorts keys anyway) and every message the protocol calls strict rejects unknown keys.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use crate::files;
use crate::ids::{is_activation_id, is_uuid4_hex};

/// The only protocol version there is.
pub const PROTOCOL_VERSION: u32 = 1;

/// A JSON document of the protocol: its shape is the serde type, its values are checked by
/// [`Schema::check`] after parsing and before writing.
pub trait Schema: Serialize + DeserializeOwned {
    /// Describes the first value that breaks the protocol, if any.
    fn check(&self) -> Result<(), String>;
}

/// A document with a fixed name in the control dir.
pub trait Message: Schema {
    const FILE: &'static str;
}

/// The answer to the canary prompt, recorded before capture and expected again after every
/// recovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Oracle {
    pub sampled_token_logprob: f64,
    pub text: String,
    pub token_ids: Vec<u32>,
}

/// capture-ready.json: the engine is initialized, has released its memory and waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureReady {
    pub capture_id: String,
    pub oracle: Oracle,
    /// The engine's pid as the engine itself sees it (1 inside a container).
    pub pid: u32,
    pub version: u32,
}

/// Whether the activated process is the one that was captured or a restored copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationKind {
    /// The original process continues after the checkpoint.
    Donor,
    /// A process restored from the checkpoint.
    Copy,
}

/// activation.json: the capturer wakes one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activation {
    pub activation_id: String,
    pub capture_id: String,
    /// Address to bind HTTP on; `None` (JSON null) means all interfaces. The key itself is
    /// required.
    #[serde(deserialize_with = "nullable")]
    pub host: Option<String>,
    pub kind: ActivationKind,
    /// Device state was restored too (always true for a CPU-only engine).
    pub native_complete: bool,
    pub port: u16,
    pub version: u32,
}

/// challenge.json: the engine accepted an activation and asks for proof that the capturer
/// saw it, with a nonce no checkpoint image can contain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Challenge {
    pub activation_id: String,
    pub capture_id: String,
    pub nonce: String,
    pub version: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatusPhase {
    Recovering,
    /// Recovery passed the canary. The HTTP listener may not be up yet.
    Validated,
}

/// status.json: progress of recovery after the release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    pub activation_id: String,
    pub capture_id: String,
    pub phase: StatusPhase,
}

/// error.json: the engine failed; terminal for that process.
///
/// Unlike the other messages this one tolerates unknown keys: it is a diagnostic, and
/// refusing an engine's extra field would hide the engine's own explanation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorRecord {
    /// `None` when the failure happened before any activation.
    #[serde(default)]
    pub activation_id: Option<String>,
    pub capture_id: String,
    pub error: String,
    pub error_type: String,
    pub phase: String,
}

/// Reads an `Option` whose key must be present (`null` allowed). serde treats a missing
/// `Option` field as `None` unless a custom deserializer is used.
fn nullable<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}

fn check_version(version: u32) -> Result<(), String> {
    if version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(format!(
            "version {version} is not supported (expected {PROTOCOL_VERSION})"
        ))
    }
}

fn check_uuid(field: &str, value: &str) -> Result<(), String> {
    if is_uuid4_hex(value) {
        Ok(())
    } else {
        Err(format!(
            "{field} {value:?} is not a uuid4 hex string (32 lowercase hex digits)"
        ))
    }
}

fn check_activation_id(value: &str) -> Result<(), String> {
    if is_activation_id(value) {
        Ok(())
    } else {
        Err(format!(
            "activation_id {value:?} must be 1-128 characters of [A-Za-z0-9_.-]"
        ))
    }
}

impl Schema for CaptureReady {
    fn check(&self) -> Result<(), String> {
        check_version(self.version)?;
        check_uuid("capture_id", &self.capture_id)?;
        if self.pid == 0 {
            return Err("pid 0 is not a process".into());
        }
        self.oracle.check()
    }
}

impl Message for CaptureReady {
    const FILE: &'static str = files::CAPTURE_READY;
}

impl Activation {
    /// An activation of `capture` with the protocol version filled in and
    /// `native_complete` set (device state restored, or no device at all).
    pub fn new(
        capture: &CaptureReady,
        activation_id: impl Into<String>,
        kind: ActivationKind,
        host: Option<String>,
        port: u16,
    ) -> Self {
        Activation {
            activation_id: activation_id.into(),
            capture_id: capture.capture_id.clone(),
            host,
            kind,
            native_complete: true,
            port,
            version: PROTOCOL_VERSION,
        }
    }
}

impl Schema for Activation {
    fn check(&self) -> Result<(), String> {
        check_version(self.version)?;
        check_uuid("capture_id", &self.capture_id)?;
        check_activation_id(&self.activation_id)?;
        if self.port == 0 {
            return Err("port 0 is out of range (1-65535)".into());
        }
        if let Some(host) = &self.host {
            if host.is_empty() || host.len() > 255 || host.contains(char::is_whitespace) {
                return Err(format!("host {host:?} is not a host name or address"));
            }
        }
        Ok(())
    }
}

impl Message for Activation {
    const FILE: &'static str = files::ACTIVATION;
}

impl Schema for Challenge {
    fn check(&self) -> Result<(), String> {
        check_version(self.version)?;
        check_uuid("capture_id", &self.capture_id)?;
        check_activation_id(&self.activation_id)?;
        check_uuid("nonce", &self.nonce)
    }
}

impl Message for Challenge {
    const FILE: &'static str = files::CHALLENGE;
}

impl Schema for Status {
    fn check(&self) -> Result<(), String> {
        check_uuid("capture_id", &self.capture_id)?;
        check_activation_id(&self.activation_id)
    }
}

impl Message for Status {
    const FILE: &'static str = files::STATUS;
}

impl Schema for ErrorRecord {
    fn check(&self) -> Result<(), String> {
        // A diagnostic: accept whatever the engine could say.
        Ok(())
    }
}

impl Message for ErrorRecord {
    const FILE: &'static str = files::ERROR;
}

impl fmt::Display for ActivationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActivationKind::Donor => "donor",
            ActivationKind::Copy => "copy",
        })
    }
}

impl fmt::Display for StatusPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StatusPhase::Recovering => "recovering",
            StatusPhase::Validated => "validated",
        })
    }
}
