//! The bundle's OCI spec (`config.json`), read once at create
//! ([`BundleSpec::read`]) and asked from then on instead of the file:
//! whether the container is a CRI pod sandbox, its cgroup path, its
//! annotations, its process. A snapshot plan's preparation edits this value
//! and writes it back once (snapshot/plan/bundle.rs); the container keeps
//! what it asks of it after create ([`BundleSpec::kept`]).
//!
//! The file is read again only where no container holds it: the `delete`
//! containerd runs after a shim died, and the shim's `start` (cleanup.rs,
//! bootstrap.rs, both through [`BundleSpec::read`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// CRI marks a pod's containers with their type under this annotation.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// [`CRI_CONTAINER_TYPE`] of a pod's sandbox (pause) container.
pub const CRI_SANDBOX: &str = "sandbox";

/// The file of a bundle that holds its spec.
const CONFIG_JSON: &str = "config.json";

/// An OCI spec as JSON: fields vsnap does not know are kept as they are.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BundleSpec(Value);

impl From<Value> for BundleSpec {
    fn from(spec: Value) -> Self {
        BundleSpec(spec)
    }
}

impl BundleSpec {
    /// The spec in `bundle`'s config.json.
    pub fn read(bundle: &Path) -> Result<Self> {
        let path = bundle.join(CONFIG_JSON);
        let bytes = std::fs::read(&path)
            .map_err(|e| Error::io(format!("create: read {}", path.display()), e))?;
        serde_json::from_slice(&bytes)
            .map(BundleSpec)
            .map_err(|e| Error::InvalidArgument(format!("create: bundle {}: {e}", path.display())))
    }

    /// The spec as JSON.
    pub fn value(&self) -> &Value {
        &self.0
    }

    /// The spec as JSON, to edit.
    pub fn value_mut(&mut self) -> &mut Value {
        &mut self.0
    }

    /// The spec's annotations (empty when it has none).
    pub fn annotations(&self) -> HashMap<String, String> {
        self.0
            .get("annotations")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The annotation `key`, when the spec has it as a string.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.0["annotations"][key].as_str()
    }

    /// Whether the container is a CRI pod's sandbox (pause) container.
    pub fn is_cri_sandbox(&self) -> bool {
        self.annotation(CRI_CONTAINER_TYPE) == Some(CRI_SANDBOX)
    }

    /// `linux.cgroupsPath` when it is a cgroupfs path (absolute); systemd's
    /// `slice:prefix:name` is none.
    pub fn cgroups_path(&self) -> Option<PathBuf> {
        let path = PathBuf::from(self.0["linux"]["cgroupsPath"].as_str()?);
        path.is_absolute().then_some(path)
    }

    /// `root.path`, as the spec gives it (relative to the bundle or absolute).
    pub fn root_path(&self) -> Option<&str> {
        self.0["root"]["path"].as_str()
    }

    /// Whether the init process has a terminal (`process.terminal`).
    pub fn terminal(&self) -> bool {
        self.0["process"]["terminal"].as_bool().unwrap_or(false)
    }

    /// The process's argv (`process.args`).
    pub fn args(&self) -> Vec<String> {
        strings(&self.0["process"]["args"])
    }

    /// The process's environment (`process.env`, `NAME=value` each).
    pub fn env(&self) -> Vec<String> {
        strings(&self.0["process"]["env"])
    }

    /// What the container keeps after create: its annotations and its
    /// cgroup and memory settings (`linux.cgroupsPath`,
    /// `linux.resources.memory`, which a restore reads at Start).
    pub fn kept(&self) -> BundleSpec {
        let linux = &self.0["linux"];
        BundleSpec(json!({
            "annotations": self.0["annotations"],
            "linux": {
                "cgroupsPath": linux["cgroupsPath"],
                "resources": {"memory": linux["resources"]["memory"]},
            }
        }))
    }

    /// Replaces the bundle's config.json whole (`write_atomic`).
    pub fn write(&self, bundle: &Path) -> Result<()> {
        self.write_to(&bundle.join(CONFIG_JSON))
    }

    /// Writes the spec to `path` whole (`write_atomic`).
    pub fn write_to(&self, path: &Path) -> Result<()> {
        let bytes =
            serde_json::to_vec(&self.0).map_err(|e| Error::Other(format!("create: spec: {e}")))?;
        vsnap_protocol::write_atomic(path, &bytes).map_err(|e| {
            Error::io(
                format!("create: write {}", path.display()),
                std::io::Error::other(e),
            )
        })
    }
}

/// The strings of a JSON list (none for anything else).
fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: Value) -> BundleSpec {
        BundleSpec::from(v)
    }

    #[test]
    fn a_cri_sandbox_is_told_by_its_container_type() {
        let sandbox = spec(json!({"annotations": {CRI_CONTAINER_TYPE: "sandbox"}}));
        assert!(sandbox.is_cri_sandbox());
        let container = spec(json!({"annotations": {CRI_CONTAINER_TYPE: "container"}}));
        assert!(!container.is_cri_sandbox());
        assert!(!spec(json!({"annotations": {}})).is_cri_sandbox());
        assert!(!spec(json!({"process": {"args": ["/pause"]}})).is_cri_sandbox());
        assert!(!spec(json!({"annotations": {CRI_CONTAINER_TYPE: 1}})).is_cri_sandbox());
        assert!(!BundleSpec::default().is_cri_sandbox());
        // What the container keeps still says so.
        assert!(sandbox.kept().is_cri_sandbox());
    }

    #[test]
    fn only_a_cgroupfs_path_is_a_cgroups_path() {
        let at = |p: &str| spec(json!({"linux": {"cgroupsPath": p}})).cgroups_path();
        assert_eq!(
            at("/kubepods/pod1/c1"),
            Some(PathBuf::from("/kubepods/pod1/c1"))
        );
        assert_eq!(at("system.slice:cri-containerd:c1"), None);
        assert_eq!(at("relative/c1"), None);
        assert_eq!(spec(json!({"linux": {}})).cgroups_path(), None);
        assert_eq!(spec(json!({})).cgroups_path(), None);
    }

    #[test]
    fn annotations_absent_are_none_and_present_are_read() {
        assert!(spec(json!({})).annotations().is_empty());
        assert!(spec(json!({"annotations": null})).annotations().is_empty());
        assert!(spec(json!({"annotations": []})).annotations().is_empty());
        let s = spec(json!({"annotations": {"vsnap.io/plan": "auto", "n": 1, "x": "y"}}));
        let a = s.annotations();
        assert_eq!(
            a.len(),
            2,
            "{a:?}: a value that is not a string is left out"
        );
        assert_eq!(a["vsnap.io/plan"], "auto");
        assert_eq!(s.annotation("x"), Some("y"));
        assert_eq!(s.annotation("n"), None);
        assert_eq!(s.annotation("missing"), None);
    }

    #[test]
    fn the_process_is_read_as_the_spec_gives_it() {
        let s = spec(json!({
            "process": {"terminal": true, "args": ["vllm", "serve", 3], "env": ["A=1"]},
            "root": {"path": "rootfs"},
        }));
        assert!(s.terminal());
        assert_eq!(s.args(), ["vllm", "serve"]);
        assert_eq!(s.env(), ["A=1"]);
        assert_eq!(s.root_path(), Some("rootfs"));
        let bare = spec(json!({}));
        assert!(!bare.terminal());
        assert!(bare.args().is_empty() && bare.env().is_empty());
        assert_eq!(bare.root_path(), None);
    }

    #[test]
    fn the_container_keeps_its_annotations_cgroup_and_memory_only() {
        let s = spec(json!({
            "process": {"args": ["x"]},
            "annotations": {"a": "b"},
            "linux": {
                "cgroupsPath": "/c1",
                "resources": {"memory": {"limit": 1024}, "cpu": {"shares": 2}},
                "namespaces": [{"type": "pid"}],
            },
        }));
        let kept = s.kept();
        assert_eq!(kept.cgroups_path(), Some(PathBuf::from("/c1")));
        assert_eq!(kept.annotation("a"), Some("b"));
        assert_eq!(kept.value()["linux"]["resources"]["memory"]["limit"], 1024);
        assert!(kept.value()["linux"]["resources"]["cpu"].is_null());
        assert!(kept.value()["linux"]["namespaces"].is_null());
        assert!(kept.args().is_empty());
    }

    #[test]
    fn the_spec_is_read_from_and_written_to_the_bundle_whole() {
        let dir = tempfile::tempdir().unwrap();
        let e = BundleSpec::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("config.json"), "{e}");
        std::fs::write(dir.path().join(CONFIG_JSON), "{not json").unwrap();
        let e = BundleSpec::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("create: bundle"), "{e}");
        let mut s = spec(json!({"ociVersion": "1.0.2", "x-custom": 1}));
        s.value_mut()["annotations"] = json!({"k": "v"});
        s.write(dir.path()).unwrap();
        let back = BundleSpec::read(dir.path()).unwrap();
        assert_eq!(back, s, "unknown fields survive");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [CONFIG_JSON], "no temporary file is left");
    }
}
