//! The private barrier of released vLLM (no control dir): the engine writes a ready file
//! holding its canary answer and waits for a release file that either tells it where to
//! listen or aborts it. There is no challenge and no status file.

use std::path::Path;
use std::thread;
use std::time::Instant;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{ProtocolError, Result};
use crate::file::{read_json, to_canonical_json, write_atomic_for, Received};
use crate::identity::Identity;
use crate::messages::{Oracle, Schema};
use crate::wait::CAPTURER_POLL_INTERVAL;

/// The ready file: the engine's canary answer, the same fields as an [`Oracle`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadyFile {
    pub sampled_token_logprob: f64,
    pub text: String,
    pub token_ids: Vec<u32>,
}

impl ReadyFile {
    pub fn oracle(&self) -> Oracle {
        Oracle {
            sampled_token_logprob: self.sampled_token_logprob,
            text: self.text.clone(),
            token_ids: self.token_ids.clone(),
        }
    }
}

impl From<&Oracle> for ReadyFile {
    fn from(oracle: &Oracle) -> Self {
        ReadyFile {
            sampled_token_logprob: oracle.sampled_token_logprob,
            text: oracle.text.clone(),
            token_ids: oracle.token_ids.clone(),
        }
    }
}

impl Schema for ReadyFile {
    fn check(&self) -> std::result::Result<(), String> {
        self.oracle().check()
    }
}

/// The release file: `{"host": str|null, "port": int, "release": true}` or the abort marker
/// `{"release": false}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireRelease", into = "WireRelease")]
pub enum ReleaseFile {
    /// Recover and listen on `host` (all interfaces when `None`) and `port`;
    /// after the canary, become `identity` (identity.rs) where one is given.
    Release {
        host: Option<String>,
        port: u16,
        identity: Option<Identity>,
    },
    /// Do not recover; the engine exits without binding.
    Abort,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireRelease {
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    host: Option<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity: Option<Identity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    release: bool,
}

/// Tells a present `"host": null` (Some(None)) from a missing key (None).
fn present<'de, D: Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl TryFrom<WireRelease> for ReleaseFile {
    type Error = String;

    fn try_from(wire: WireRelease) -> std::result::Result<Self, String> {
        if !wire.release {
            return Ok(ReleaseFile::Abort);
        }
        match wire.port {
            Some(port) => Ok(ReleaseFile::Release {
                host: wire.host.flatten(),
                port,
                identity: wire.identity,
            }),
            None => Err("a release (\"release\": true) needs a port".into()),
        }
    }
}

impl From<ReleaseFile> for WireRelease {
    fn from(release: ReleaseFile) -> Self {
        match release {
            ReleaseFile::Release {
                host,
                port,
                identity,
            } => WireRelease {
                host: Some(host),
                identity,
                port: Some(port),
                release: true,
            },
            ReleaseFile::Abort => WireRelease {
                host: None,
                identity: None,
                port: None,
                release: false,
            },
        }
    }
}

impl Schema for ReleaseFile {
    fn check(&self) -> std::result::Result<(), String> {
        match self {
            ReleaseFile::Release { port: 0, .. } => Err("port 0 is out of range (1-65535)".into()),
            ReleaseFile::Release {
                identity: Some(identity),
                ..
            } => identity.check().map_err(|e| format!("identity: {e}")),
            _ => Ok(()),
        }
    }
}

/// Capturer side: waits for the ready file; fails when the engine exits first.
pub fn wait_ready(
    path: &Path,
    deadline: Instant,
    is_alive: &mut dyn FnMut() -> bool,
) -> Result<Received<ReadyFile>> {
    let started = Instant::now();
    loop {
        if let Some(ready) = read_json::<ReadyFile>(path)? {
            return Ok(ready);
        }
        if !is_alive() {
            return Err(ProtocolError::EngineExitedBeforeFile { path: path.into() });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ProtocolError::Timeout {
                path: path.into(),
                waited: now - started,
            });
        }
        thread::sleep(CAPTURER_POLL_INTERVAL.min(deadline - now));
    }
}

/// Capturer side: releases the engine to listen on `host`:`port`.
pub fn release(path: &Path, host: Option<String>, port: u16) -> Result<()> {
    release_for(path, host, port, None, None)
}

/// [`release`] for an engine running as `owner` (a uid other than the capturer's): the
/// file is the engine's to read (see [`write_atomic_for`]); with `identity`, the
/// engine's own after its canary.
pub fn release_for(
    path: &Path,
    host: Option<String>,
    port: u16,
    identity: Option<Identity>,
    owner: Option<u32>,
) -> Result<()> {
    let release = ReleaseFile::Release {
        host,
        port,
        identity,
    };
    let bytes = to_canonical_json(path, &release)?;
    write_atomic_for(path, &bytes, owner)
}

/// Capturer side: tells the engine not to recover.
pub fn abort_release(path: &Path) -> Result<()> {
    abort_release_for(path, None)
}

/// [`abort_release`] for an engine running as `owner`.
pub fn abort_release_for(path: &Path, owner: Option<u32>) -> Result<()> {
    let bytes = to_canonical_json(path, &ReleaseFile::Abort)?;
    write_atomic_for(path, &bytes, owner)
}
