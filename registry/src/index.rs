//! The config blob of a vsnap artifact in a registry: the portable artifact
//! description. It holds the artifact's manifest without the host MAC (a
//! MAC only the capturing host can check means nothing elsewhere; the puller
//! checks the contents and seals with its own key) and the file index: for
//! every file a restore reads, its relative path, mode, size and ordered
//! chunk digests.
//!
//! Everything here comes from a registry, so [`ArtifactConfig::check`]
//! refuses any path that could leave the artifact folder, any chunk that is
//! not a layer of the manifest, and any file set or size that disagrees
//! with the artifact manifest's content digests.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use vsnap_artifact::content::COVERED;
use vsnap_artifact::Manifest;

use crate::chunking::Params;
use crate::error::{RegistryError, Result};

pub const CONFIG_SCHEMA: u32 = 1;
/// Most bytes a config blob may hold (a 1 TiB artifact in 2 MiB chunks
/// indexes in about 40 MiB; a larger blob is not ours).
pub const CONFIG_LIMIT: u64 = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ArtifactConfig {
    pub schema_version: u32,
    /// The artifact's manifest.json without `mac`.
    pub manifest: serde_json::Value,
    /// How the files were cut (for the record; a pull needs only digests).
    pub chunking: Params,
    /// Every file a restore reads, sorted by path.
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the artifact folder: `images/pages-1.img`.
    pub path: String,
    /// Permission bits (at most 0755 are applied).
    pub mode: u32,
    pub size: u64,
    /// sha256 digests of its chunks, in order; each is a layer.
    pub chunks: Vec<String>,
}

impl ArtifactConfig {
    /// The description of `manifest` with `files`.
    pub fn new(manifest: &Manifest, chunking: Params, files: Vec<FileEntry>) -> Self {
        let mut v = serde_json::to_value(manifest).expect("a manifest serializes");
        let v_mut = v.as_object_mut().expect("an object");
        v_mut.remove("mac");
        // This host's sealing at rest: a puller seals with its own.
        v_mut.remove("sealed");
        ArtifactConfig {
            schema_version: CONFIG_SCHEMA,
            manifest: v,
            chunking,
            files,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a config serializes")
    }

    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let c: ArtifactConfig = serde_json::from_slice(bytes)
            .map_err(|e| RegistryError::Invalid(format!("the artifact config: {e}")))?;
        if c.schema_version != CONFIG_SCHEMA {
            return Err(RegistryError::Invalid(format!(
                "the artifact config has schema_version {}, this vsnap reads {CONFIG_SCHEMA}",
                c.schema_version
            )));
        }
        Ok(c)
    }

    /// Checks the description against the OCI manifest's layers (digest to
    /// size; each layer `overhead` bytes larger than the chunk it carries:
    /// 0 in clear, [`crate::crypt::OVERHEAD`] sealed) and returns the
    /// artifact manifest it carries (unsealed).
    pub fn check(&self, layers: &BTreeMap<String, u64>, overhead: u64) -> Result<Manifest> {
        let invalid = |m: String| RegistryError::Invalid(format!("the artifact config: {m}"));
        let manifest = Manifest::parse(
            &serde_json::to_vec(&self.manifest).expect("a value serializes"),
            std::path::Path::new("the artifact config's manifest"),
        )?;
        if !manifest.mac.is_empty() {
            return Err(invalid("its manifest carries a host MAC".into()));
        }
        let mut seen = BTreeSet::new();
        let mut used = BTreeSet::new();
        for f in &self.files {
            check_path(&f.path).map_err(|m| invalid(format!("{:?}: {m}", f.path)))?;
            if !seen.insert(f.path.as_str()) {
                return Err(invalid(format!("{} is listed twice", f.path)));
            }
            let Some(recorded) = manifest.contents.get(&f.path) else {
                return Err(invalid(format!(
                    "{} is not in the manifest's contents",
                    f.path
                )));
            };
            if recorded.size != f.size {
                return Err(invalid(format!(
                    "{} holds {} bytes, the manifest says {}",
                    f.path, f.size, recorded.size
                )));
            }
            let mut total = 0u64;
            for c in &f.chunks {
                let Some(size) = layers.get(c) else {
                    return Err(invalid(format!("{}: chunk {c} is not a layer", f.path)));
                };
                let Some(plain) = size.checked_sub(overhead) else {
                    return Err(invalid(format!("{}: chunk {c} is too small", f.path)));
                };
                total = total.saturating_add(plain);
                used.insert(c.as_str());
            }
            if total != f.size {
                return Err(invalid(format!(
                    "{}: its chunks hold {total} bytes, the file {}",
                    f.path, f.size
                )));
            }
        }
        if let Some(missing) = manifest
            .contents
            .keys()
            .find(|p| !seen.contains(p.as_str()))
        {
            return Err(invalid(format!("{missing} of the manifest has no entry")));
        }
        if let Some(extra) = layers.keys().find(|d| !used.contains(d.as_str())) {
            return Err(invalid(format!("layer {extra} belongs to no file")));
        }
        Ok(manifest)
    }
}

/// A relative path inside one of the folders a restore reads, made only of
/// plain components: no `..`, no `.`, no empty part, no leading `/`.
pub fn check_path(path: &str) -> std::result::Result<(), String> {
    if path.starts_with('/') {
        return Err("is absolute".into());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 2 || path.len() > 4096 {
        return Err("not a file inside images/, control/ or dev-shm/".into());
    }
    if !COVERED.contains(&parts[0]) {
        return Err(format!("{} is not one of {COVERED:?}", parts[0]));
    }
    for p in &parts {
        if p.is_empty() || *p == "." || *p == ".." || p.contains('\0') {
            return Err("holds an empty, '.' or '..' component".into());
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use vsnap_artifact::FileDigest;

    pub(crate) fn manifest(files: &[(&str, u64)]) -> Manifest {
        let v = serde_json::json!({
            "schema_version": vsnap_artifact::SCHEMA_VERSION, "name": "a",
            "created_at": "2026-12-01T00:00:00Z", "capture_id": "c",
            "oracle": {"sampled_token_logprob": -0.5, "text": "t", "token_ids": [1]},
            "source_container": "s", "image_bytes": 1, "contents": {},
            "timings_ms": {"cold_start_to_capture_ready": 0, "inventory": 0, "checkpoint": 0},
            "host": {}, "workload": {}, "mac": "00"
        });
        // host and workload: whatever their defaults serialize to.
        let mut m: serde_json::Value = v;
        let key_dir = tempfile::tempdir().unwrap();
        vsnap_artifact::HostKey::load_or_create(key_dir.path()).unwrap();
        let key = vsnap_artifact::FingerprintKey::load(key_dir.path(), None).unwrap();
        m["host"] = serde_json::to_value(vsnap_artifact::HostIdentity::probe(
            &vsnap_artifact::Tools::default(),
            "test",
        ))
        .unwrap();
        m["workload"] = serde_json::to_value(vsnap_artifact::Workload::from_spec(
            &serde_json::json!({}),
            "/run/vsnap/control",
            &key,
        ))
        .unwrap();
        let mut m: Manifest = serde_json::from_value(m).unwrap();
        for (p, size) in files {
            m.contents.insert(
                p.to_string(),
                FileDigest {
                    size: *size,
                    chunks: vec![],
                },
            );
        }
        m
    }

    fn d(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn good() -> (ArtifactConfig, BTreeMap<String, u64>) {
        let m = manifest(&[("images/pages-1.img", 30), ("control/ready.json", 2)]);
        let files = vec![
            FileEntry {
                path: "control/ready.json".into(),
                mode: 0o600,
                size: 2,
                chunks: vec![d(3)],
            },
            FileEntry {
                path: "images/pages-1.img".into(),
                mode: 0o600,
                size: 30,
                chunks: vec![d(1), d(2), d(1)],
            },
        ];
        let layers = [(d(1), 10), (d(2), 10), (d(3), 2)].into_iter().collect();
        (
            ArtifactConfig::new(&m, crate::chunking::PARAMS, files),
            layers,
        )
    }

    #[test]
    fn the_description_drops_the_mac_and_round_trips() {
        let (c, layers) = good();
        assert!(c.manifest.get("mac").is_none());
        let back = ArtifactConfig::parse(&c.to_bytes()).unwrap();
        assert_eq!(back, c);
        let m = back.check(&layers, 0).unwrap();
        assert_eq!(m.name, "a");
        assert!(m.mac.is_empty());
        // Sealed layers are each an envelope larger than their chunk.
        let sealed: BTreeMap<String, u64> =
            layers.iter().map(|(d, n)| (d.clone(), n + 48)).collect();
        back.check(&sealed, 48).unwrap();
        let e = back.check(&layers, 48).unwrap_err().to_string();
        assert!(e.contains("too small") || e.contains("chunks hold"), "{e}");
        let e = back.check(&sealed, 0).unwrap_err().to_string();
        assert!(e.contains("chunks hold"), "{e}");
    }

    /// One damage done to a good description and its layers.
    type Edit = Box<dyn Fn(&mut ArtifactConfig, &mut BTreeMap<String, u64>)>;

    #[test]
    fn escaping_paths_foreign_chunks_and_wrong_sizes_are_refused() {
        let cases: Vec<(&str, Edit)> = vec![
            (
                "not one of",
                Box::new(|c, _| c.files[0].path = "work/x".into()),
            ),
            (
                "'..'",
                Box::new(|c, _| c.files[0].path = "control/../../etc".into()),
            ),
            (
                "is absolute",
                Box::new(|c, _| c.files[0].path = "/etc".into()),
            ),
            (
                "not a file inside",
                Box::new(|c, _| c.files[0].path = "images".into()),
            ),
            (
                "is not a layer",
                Box::new(|c, _| c.files[1].chunks[1] = d(9)),
            ),
            (
                "chunks hold 20 bytes",
                Box::new(|c, _| {
                    c.files[1].chunks.pop();
                }),
            ),
            (
                "belongs to no file",
                Box::new(|_, l| {
                    l.insert(d(7), 1);
                }),
            ),
            (
                "has no entry",
                Box::new(|c, _| {
                    c.files.remove(0);
                }),
            ),
            (
                "listed twice",
                Box::new(|c, _| {
                    let f = c.files[1].clone();
                    c.files.push(f);
                }),
            ),
            ("host MAC", Box::new(|c, _| c.manifest["mac"] = "ab".into())),
            (
                "the manifest says 30",
                Box::new(|c, _| c.files[1].size = 31),
            ),
        ];
        for (want, edit) in cases {
            let (mut c, mut layers) = good();
            edit(&mut c, &mut layers);
            let e = c.check(&layers, 0).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let (mut c, _) = good();
        c.schema_version = 9;
        assert!(ArtifactConfig::parse(&c.to_bytes())
            .unwrap_err()
            .to_string()
            .contains("schema_version 9"));
    }
}
