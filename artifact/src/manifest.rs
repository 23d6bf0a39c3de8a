//! The manifest: schema-versioned JSON, strict (unknown fields refused),
//! MAC'd with the host key over its canonical form without the `mac` field.

use std::path::Path;

use serde::{Deserialize, Serialize};
use vsnap_protocol::Oracle;

use crate::clocks::Clocks;
use crate::criu_options::CriuOptions;
use crate::error::{ArtifactError, Result};
use crate::fingerprint::{HostIdentity, Workload};
use crate::key::HostKey;
use crate::layout::{check_layout, check_path_safe};

pub use crate::layout::MANIFEST;
/// The artifact format this vsnap writes.
///
/// - 3: content digests, host identity with CPU flags (compat.rs).
/// - 4: CRIU's pagemaps may leave all-zero pages of private anonymous
///   memory out (holes a restore maps as zeros), and the manifest says how
///   much was left out. A format 3 artifact is a format 4 one without holes.
/// - 5: runc's masked folders under `/proc` and `/sys` may be external
///   mounts in CRIU's images (key `vsnap-empty`), which a restore binds
///   from the host's empty read-only tmpfs; a shim of format 4 has no such
///   mapping, and its CRIU would fail. A format 4 artifact is a format 5
///   one whose masks CRIU stored.
/// - 6: the workload names the variables each pod is given as its own
///   (`per_pod_env`: `HOSTNAME` and what the operator names), whose values
///   a restore does not compare; a shim of format 5 would refuse the field.
///   A format 5 artifact is a format 6 one without the list: every
///   variable is compared, as its vsnap did.
/// - 7: the CRIU options the dump used (`criu`, criu_options.rs), which a
///   restore repeats by reading them; a shim of format 6 would refuse the
///   field. A format 5 or 6 artifact was dumped with the options every
///   vsnap of those formats used ([`CriuOptions::before_recorded`]).
/// - 8: the pages files may be sealed at rest with the host's key
///   (`sealed`, at_rest.rs), which a restore opens as it reads them; a
///   shim of format 7 would refuse the field (and could not open them).
///   A format 6 or 7 artifact is a format 8 one in clear.
pub const SCHEMA_VERSION: u32 = 8;
/// Every artifact format this vsnap restores: the current and the two
/// before it, so that an upgrade of vsnap keeps the artifacts its
/// predecessors made (6 and 7 differ from 8 by one recorded field each).
pub const READABLE_SCHEMA_VERSIONS: [u32; 3] = [6, 7, SCHEMA_VERSION];
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
    /// sha256 per 64 MiB chunk of every file under images/, control/ and
    /// dev-shm/ (content.rs), checked before a restore reads them.
    pub contents: crate::content::Contents,
    pub timings_ms: Timings,
    /// The host the artifact is valid on.
    pub host: HostIdentity,
    /// What was captured (secrets redacted, env as fingerprints only).
    pub workload: Workload,
    /// The capturing host's boot id and clocks right before the dump
    /// (clocks.rs): information, not a compatibility field; what a restore
    /// on a kernel without time namespaces is checked against. Absent in
    /// manifests made before it was recorded (their MAC stays valid: an
    /// absent field is not serialized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clocks: Option<Clocks>,
    /// Where a pulled artifact came from and who signed it; absent for one
    /// captured on this host. Covered by the MAC like every other field, so
    /// it cannot be changed after the pull re-sealed the manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// How the container's writable layer travels and which volume files
    /// the tree held open (rootfs.rs); absent in artifacts made before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<crate::rootfs::Rootfs>,
    /// What the captured tree held in memory (memory.rs): what a restore
    /// charges to the container's memory cgroup, held against its limit
    /// before CRIU runs. Absent in artifacts made before it was recorded:
    /// unknown, and no restore of them is held to a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::memory::Memory>,
    /// The all-zero pages the capture left out of its page images (holes
    /// a restore maps without copying). Absent when the capture elided
    /// none by configuration (`elide_zero_pages = false`) or was made
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_pages: Option<crate::memory::ZeroPages>,
    /// The CRIU options the dump used, which its restores repeat; absent
    /// in formats 5 and 6 ([`Manifest::criu_options`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criu: Option<CriuOptions>,
    /// How the pages files are sealed at rest with this host's key
    /// (at_rest.rs): the cipher and the artifact's salt. Absent: in clear
    /// (`seal_at_rest = false`, or made before format 8). A pull records
    /// its own (its copy is sealed with its host's key); a push leaves it
    /// out (a registry's chunks are of the plaintext).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<crate::at_rest::Sealed>,
    /// HMAC-SHA256 with the host key over the manifest without this field.
    #[serde(default)]
    pub mac: String,
}

/// The provenance of an artifact pulled from a registry, recorded when the
/// pull verified it and re-sealed its manifest with this host's key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Origin {
    /// The reference it was pulled by (`registry/repository:tag`).
    pub reference: String,
    /// The digest of the OCI manifest pulled (`sha256:...`).
    pub manifest_digest: String,
    /// The key id of the trusted fleet key whose signature verified
    /// ([`crate::signature::TrustedKeys::verify`]); absent when pulled
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// When it was pulled (RFC 3339).
    #[serde(default)]
    pub pulled_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Timings {
    pub cold_start_to_capture_ready: u64,
    pub inventory: u64,
    pub checkpoint: u64,
    /// Packing the writable layer (inside `checkpoint`).
    #[serde(default)]
    pub rootfs: u64,
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

    /// Whether the MAC verifies with `key`: the manifest was sealed with this
    /// key and not edited since. For reports; [`Manifest::load_verified`]
    /// is what gates a restore.
    pub fn mac_verifies(&self, key: &HostKey) -> bool {
        !self.mac.is_empty() && key.verify(&self.mac_input(), &self.mac)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        bytes.push(b'\n');
        bytes
    }

    /// Parses strictly: one JSON object of a schema version this vsnap
    /// reads ([`READABLE_SCHEMA_VERSIONS`]), nothing more. The version is
    /// read first, so a manifest of another format (whose fields this vsnap
    /// may not know) is refused for its version ([`ArtifactError::Format`]),
    /// naming `schema_version`, its version and the versions read, not for
    /// a field. A manifest keeps the version it was made with: its MAC
    /// covers it.
    pub fn parse(bytes: &[u8], origin: &Path) -> Result<Self> {
        #[derive(Deserialize)]
        struct Version {
            schema_version: u32,
        }
        let invalid =
            |e: serde_json::Error| ArtifactError::Invalid(format!("{}: {e}", origin.display()));
        if let Ok(Version { schema_version }) = serde_json::from_slice::<Version>(bytes) {
            if !READABLE_SCHEMA_VERSIONS.contains(&schema_version) {
                let read: Vec<String> = READABLE_SCHEMA_VERSIONS
                    .iter()
                    .map(u32::to_string)
                    .collect();
                return Err(ArtifactError::Format(format!(
                    "{}: schema_version {schema_version} is not an artifact format this vsnap reads ({})",
                    origin.display(),
                    read.join(", "),
                )));
            }
        }
        serde_json::from_slice(bytes).map_err(invalid)
    }

    /// Checks the layout, reads the manifest strictly and verifies its MAC
    /// with this host's key: the artifact is one this host made, unedited.
    /// The CRIU options the dump used: recorded (format 7), or those every
    /// vsnap of formats 5 and 6 used (their session had a terminal where
    /// the restoring container has one: `shell_job`).
    pub fn criu_options(&self, shell_job: bool) -> CriuOptions {
        self.criu
            .clone()
            .unwrap_or_else(|| CriuOptions::before_recorded(shell_job))
    }

    pub fn load_verified(root: &Path, name: &str) -> Result<Self> {
        let m = Self::load_unverified(root, name)?;
        Self::check_mac(m, root, &root.join(name).join(MANIFEST))
    }

    /// As [`Manifest::load_verified`], of the artifact `name` of `root`
    /// whose files are in `dir` for now: the tree of a pull under way,
    /// which a streamed restore reads before it is published.
    pub fn load_verified_in(root: &Path, name: &str, dir: &Path) -> Result<Self> {
        check_path_safe(dir)?;
        let m = Self::load_file(&dir.join(MANIFEST), name)?;
        Self::check_mac(m, root, &dir.join(MANIFEST))
    }

    /// `m` (read from `path`), when its MAC verifies with `root`'s key.
    fn check_mac(m: Self, root: &Path, path: &Path) -> Result<Self> {
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
        Self::load_file(&dir.join(MANIFEST), name)
    }

    /// The manifest at `path`, which must name artifact `name`.
    fn load_file(path: &Path, name: &str) -> Result<Self> {
        let path = path.to_path_buf();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::Tools;

    /// An unsealed manifest whose workload was fingerprinted with the key
    /// of the artifact root `dir`.
    fn sample(dir: &Path) -> Manifest {
        Manifest {
            schema_version: SCHEMA_VERSION,
            name: "a".into(),
            created_at: "2025-01-01T00:00:00Z".into(),
            capture_id: "c".into(),
            oracle: Oracle {
                sampled_token_logprob: -0.5,
                text: "t".into(),
                token_ids: vec![1],
            },
            source_container: "s".into(),
            image_bytes: 1,
            contents: Default::default(),
            timings_ms: Timings::default(),
            host: HostIdentity::probe(&Tools::default(), "test"),
            workload: Workload::from_spec(
                &serde_json::json!({}),
                "/run/vsnap/control",
                &crate::key::FingerprintKey::load(dir, None).unwrap(),
            ),
            clocks: None,
            origin: None,
            rootfs: None,
            memory: None,
            zero_pages: None,
            criu: None,
            sealed: None,
            mac: String::new(),
        }
    }

    #[test]
    fn the_mac_verifies_only_the_sealed_content_under_the_sealing_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(dir.path()).unwrap();
        let mut m = sample(dir.path());
        assert!(!m.mac_verifies(&key), "an unsealed manifest");
        m.seal(&key);
        assert!(m.mac_verifies(&key));
        let other = tempfile::tempdir().unwrap();
        assert!(!m.mac_verifies(&HostKey::load_or_create(other.path()).unwrap()));
        m.source_container = "edited".into();
        assert!(!m.mac_verifies(&key));
        m.seal(&key);
        // No origin: the JSON is as before origins.
        let text = String::from_utf8(m.to_bytes()).unwrap();
        assert!(!text.contains("origin"), "{text}");
        // A pulled artifact's origin is sealed with the rest.
        m.origin = Some(Origin {
            reference: "registry.example/engines/qwen:7b".into(),
            manifest_digest: format!("sha256:{}", "ab".repeat(32)),
            signed_by: Some("ed25519:0123456789abcdef".into()),
            pulled_at: "2026-12-01T00:00:00Z".into(),
        });
        assert!(!m.mac_verifies(&key), "the origin is covered");
        m.seal(&key);
        let back = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(back, m);
        assert!(back.mac_verifies(&key));
        if let Some(o) = m.origin.as_mut() {
            o.signed_by = Some("ed25519:ffffffffffffffff".into());
        }
        assert!(!m.mac_verifies(&key), "who signed it cannot be edited");
    }

    #[test]
    fn the_capture_clocks_are_sealed_and_a_manifest_without_them_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(dir.path()).unwrap();
        let mut m = sample(dir.path());
        // A manifest sealed before clocks were recorded: no `clocks` key in
        // its JSON, and it parses and verifies as it did.
        m.seal(&key);
        let old = String::from_utf8(m.to_bytes()).unwrap();
        assert!(!old.contains("clocks"), "{old}");
        let back = Manifest::parse(old.as_bytes(), Path::new("m")).unwrap();
        assert_eq!(back.clocks, None);
        assert!(back.mac_verifies(&key));
        // Recorded, they are sealed with the rest.
        m.clocks = Some(Clocks {
            boot_id: "aee2904a-36f4-4c08-b9c8-3b3bdf64c4a2".into(),
            monotonic_ns: 1_000_219_100_000_000,
            boottime_ns: 1_000_219_200_000_000,
        });
        assert!(!m.mac_verifies(&key), "the clocks are covered");
        m.seal(&key);
        let back = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(back, m);
        assert!(back.mac_verifies(&key));
        if let Some(c) = m.clocks.as_mut() {
            c.monotonic_ns = 1;
        }
        assert!(!m.mac_verifies(&key), "a captured clock cannot be edited");
    }

    #[test]
    fn the_memory_need_is_sealed_and_a_manifest_without_it_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(dir.path()).unwrap();
        let mut m = sample(dir.path());
        m.seal(&key);
        let old = String::from_utf8(m.to_bytes()).unwrap();
        assert!(!old.contains("memory"), "{old}");
        let back = Manifest::parse(old.as_bytes(), Path::new("m")).unwrap();
        assert_eq!(back.memory, None);
        assert!(back.mac_verifies(&key));
        m.memory = Some(crate::memory::Memory {
            pages_bytes: 1 << 30,
            dev_shm_bytes: 7 << 20,
        });
        assert!(!m.mac_verifies(&key), "the need is covered");
        m.seal(&key);
        let back = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(back, m);
        assert!(back.mac_verifies(&key));
        if let Some(memory) = m.memory.as_mut() {
            memory.pages_bytes = 1;
        }
        assert!(!m.mac_verifies(&key), "a smaller need cannot be edited in");
    }

    #[test]
    fn the_owner_is_sealed_and_a_manifest_without_a_kubernetes_namespace_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(dir.path()).unwrap();
        let mut m = sample(dir.path());
        m.workload.namespace = "k8s.io".into();
        m.seal(&key);
        let old = String::from_utf8(m.to_bytes()).unwrap();
        assert!(!old.contains("kubernetes_namespace"), "{old}");
        let back = Manifest::parse(old.as_bytes(), Path::new("m")).unwrap();
        assert!(back.mac_verifies(&key));
        assert_eq!(back.workload.tenant().to_string(), "k8s.io");
        m.workload.kubernetes_namespace = Some("team-a".into());
        assert!(!m.mac_verifies(&key), "the owner is covered");
        m.seal(&key);
        let back = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert!(back.mac_verifies(&key));
        assert_eq!(back.workload.tenant().to_string(), "k8s.io/team-a");
        m.workload.kubernetes_namespace = Some("team-b".into());
        assert!(!m.mac_verifies(&key), "the owner cannot be edited");
    }

    #[test]
    fn the_previous_format_is_read_as_it_was_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(dir.path()).unwrap();
        let mut m = sample(dir.path());
        // What the previous vsnap wrote: the same fields, its version.
        m.schema_version = READABLE_SCHEMA_VERSIONS[0];
        assert!(m.schema_version < SCHEMA_VERSION);
        m.seal(&key);
        let back = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(back.schema_version, READABLE_SCHEMA_VERSIONS[0], "kept");
        assert!(back.mac_verifies(&key), "its MAC covers the version it has");
        assert_eq!(back, m);
    }

    #[test]
    fn a_format_this_vsnap_does_not_read_is_refused_naming_the_versions() {
        let dir = tempfile::tempdir().unwrap();
        HostKey::load_or_create(dir.path()).unwrap();
        let m = sample(dir.path());
        for (version, extra) in [
            (SCHEMA_VERSION + 1, true),
            (5, false),
            (4, false),
            (3, false),
            (0, false),
        ] {
            let mut v = serde_json::to_value(&m).unwrap();
            v["schema_version"] = version.into();
            if extra {
                // A later format's field this vsnap does not know.
                v["format_of_the_future"] = true.into();
            }
            let bytes = serde_json::to_vec(&v).unwrap();
            let e = Manifest::parse(&bytes, Path::new("x/manifest.json")).unwrap_err();
            assert!(matches!(e, ArtifactError::Format(_)), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "x/manifest.json: schema_version {version} is not an artifact format this vsnap reads (6, 7, {SCHEMA_VERSION})"
                ),
            );
        }
        // Not JSON at all: the parser's own error.
        let e = Manifest::parse(b"{", Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("m: EOF"), "{e}");
    }
}
