//! The manifest: schema-versioned JSON, strict (unknown fields refused),
//! MAC'd with the host key over its canonical form without the `mac` field.

use std::path::Path;

use serde::{Deserialize, Serialize};
use vsnap_protocol::Oracle;

use crate::error::{ArtifactError, Result};
use crate::fingerprint::{HostIdentity, Workload};
use crate::key::HostKey;
use crate::layout::check_layout;

pub const MANIFEST: &str = "manifest.json";
pub const SCHEMA_VERSION: u32 = 1;
const MAX_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema_version: u32,
    pub name: String,
    pub created_at: String,
    pub capture_id: String,
    pub oracle: Oracle,
    /// The container the capture was taken from.
    pub source_container: String,
    /// Bytes of the CRIU images.
    pub image_bytes: u64,
    pub timings_ms: Timings,
    /// The host the artifact is valid on.
    pub host: HostIdentity,
    /// What was captured (secrets redacted, env as fingerprints only).
    pub workload: Workload,
    /// HMAC-SHA256 with the host key over the manifest without this field.
    #[serde(default)]
    pub mac: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Timings {
    pub cold_start_to_capture_ready: u64,
    pub inventory: u64,
    pub checkpoint: u64,
}

impl Manifest {
    /// The bytes the MAC covers: canonical JSON (sorted keys) without `mac`.
    fn mac_input(&self) -> Vec<u8> {
        let mut v = serde_json::to_value(self).expect("a manifest serializes");
        v.as_object_mut().expect("an object").remove("mac");
        serde_json::to_vec(&v).expect("a value serializes")
    }

    pub fn seal(&mut self, key: &HostKey) {
        self.mac = key.mac(&self.mac_input());
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        bytes.push(b'\n');
        bytes
    }

    /// Parses strictly: one JSON object of this schema version, nothing more.
    pub fn parse(bytes: &[u8], origin: &Path) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| ArtifactError::Invalid(format!("{}: {e}", origin.display())))?;
        if m.schema_version != SCHEMA_VERSION {
            return Err(ArtifactError::Invalid(format!(
                "{}: schema_version {} is not {SCHEMA_VERSION}",
                origin.display(),
                m.schema_version
            )));
        }
        Ok(m)
    }

    /// Checks the layout, reads the manifest strictly and verifies its MAC
    /// with this host's key: the artifact is one this host made, unedited.
    pub fn load_verified(root: &Path, name: &str) -> Result<Self> {
        let m = Self::load_unverified(root, name)?;
        let path = root.join(name).join(MANIFEST);
        let key = HostKey::load(root)?;
        if m.mac.is_empty() || !key.verify(&m.mac_input(), &m.mac) {
            return Err(ArtifactError::Invalid(format!(
                "{}: MAC does not verify with this host's key (edited, or made on another host)",
                path.display()
            )));
        }
        Ok(m)
    }

    /// As [`Manifest::load_verified`] without the MAC check: for inspection.
    pub fn load_unverified(root: &Path, name: &str) -> Result<Self> {
        let dir = check_layout(root, name)?;
        let path = dir.join(MANIFEST);
        let len = std::fs::symlink_metadata(&path)
            .map_err(|e| ArtifactError::io(&path, "stat", e))?
            .len();
        if len > MAX_BYTES {
            return Err(ArtifactError::Invalid(format!(
                "{}: {len} bytes is too large",
                path.display()
            )));
        }
        let bytes = std::fs::read(&path).map_err(|e| ArtifactError::io(&path, "read", e))?;
        let m = Self::parse(&bytes, &path)?;
        if m.name != name {
            return Err(ArtifactError::Invalid(format!(
                "{}: names artifact {:?}, not {name:?}",
                path.display(),
                m.name
            )));
        }
        Ok(m)
    }
}
