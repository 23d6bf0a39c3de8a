//! A copy lives in its own pod: what CRIU is told so that a restored tree
//! is in the namespaces its live spec names, not in copies of the donor's.
//!
//! * Network: runc hands CRIU the spec's network namespace as external
//!   (`extRootNetNS`), so the tree is restored into it. CRIU's network lock
//!   (iptables rules `-j CRIU` in that namespace) is removed only after a
//!   restore that succeeded (CRIU 4.2): a failed restore left the pod cut
//!   off. A namespace that exists is a pod's, with no peer of the donor's
//!   connections in it (they were made on another address or over its own
//!   loopback, frozen with the tree): the lock guards nothing there, so
//!   such a restore runs with `network-lock skip`.
//! * UTS and IPC: runc hands CRIU only network and PID namespaces; a
//!   container that joins its pod sandbox's UTS and IPC namespaces is told
//!   to CRIU as `join-ns`. CRIU 4.2.1 alone would still clone the tree into
//!   new namespaces of those kinds (writing the donor's hostname into the
//!   joined one): vsnap's CRIU carries a patch that leaves them out
//!   (scripts/criu-join-ns-root.patch). The pod's own SysV IPC objects are
//!   what the copy sees; the donor's are not restored.
//! * A UTS namespace of the container's own (`ctr run --hostname`, docker):
//!   CRIU restores the donor's hostname into it; the restore sets the
//!   spec's hostname before the tree runs (activation/identity.rs).

use serde_json::Value;

/// A namespace CRIU joins: its kind as `join-ns` names it and the path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinNs {
    pub kind: &'static str,
    pub path: String,
}

/// The UTS and IPC namespaces the spec joins (a pod's), as CRIU joins them.
/// A path CRIU's config cannot carry (white space, a newline) is an error
/// naming it.
pub fn joined(spec: &Value) -> Result<Vec<JoinNs>, String> {
    let mut out = Vec::new();
    for (spec_type, kind) in [("uts", "uts"), ("ipc", "ipc")] {
        if let Some(path) = namespace_path(spec, spec_type) {
            if path.is_empty() || path.contains(char::is_whitespace) {
                return Err(format!(
                    "linux.namespaces {spec_type}: path {path:?} cannot be given to CRIU"
                ));
            }
            out.push(JoinNs { kind, path });
        }
    }
    Ok(out)
}

/// Whether the spec joins a network namespace that exists.
pub fn joins_network(spec: &Value) -> bool {
    namespace_path(spec, "network").is_some()
}

/// The hostname a restore must set: the spec's, when the container has a
/// UTS namespace of its own (CRIU restored the donor's name into it).
pub fn hostname_to_set(spec: &Value) -> Option<String> {
    let own_uts = namespace(spec, "uts").is_some_and(|n| n.get("path").is_none());
    let hostname = spec["hostname"].as_str().filter(|h| !h.is_empty())?;
    own_uts.then(|| hostname.to_string())
}

/// The spec's namespace entry of `ns_type` (`network`, `uts`, ...), if any.
pub fn namespace<'a>(spec: &'a Value, ns_type: &str) -> Option<&'a Value> {
    spec["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["type"] == ns_type)
}

fn namespace_path(spec: &Value, ns_type: &str) -> Option<String> {
    namespace(spec, ns_type)?
        .get("path")?
        .as_str()
        .map(str::to_string)
}

/// What a CRIU built with vsnap's patch prints in its `--version`.
pub const PATCH_MARK: &str = "vsnap: join-ns-root";

/// Whether `criu` (as runc finds it) carries vsnap's join-ns patch: without
/// it a restore that joins a pod's UTS namespace writes the donor's hostname
/// into the pod's. A binary found patched is not asked again by this shim.
pub fn check_patched(criu: &std::path::Path) -> Result<(), String> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static PATCHED: Mutex<Option<HashSet<std::path::PathBuf>>> = Mutex::new(None);
    let mut patched = PATCHED.lock().unwrap_or_else(|e| e.into_inner());
    let known = patched.get_or_insert_with(HashSet::new);
    if known.contains(criu) {
        return Ok(());
    }
    // Through spawn.rs: the shim's reaper may take the exit status.
    let mut cmd = std::process::Command::new(criu);
    cmd.arg("--version");
    let ran = vsnap_artifact::spawn::run(&mut cmd, std::time::Duration::from_secs(10));
    if let Ok(ran) = &ran {
        if ran.stdout.lines().any(|l| l == PATCH_MARK) {
            known.insert(criu.to_path_buf());
            return Ok(());
        }
    }
    if let Err(e) = ran {
        return Err(format!("{} --version: {e:?}", criu.display()));
    }
    Err(format!(
        "{} lacks vsnap's join-ns patch (its --version has no {PATCH_MARK:?}; scripts/setup.sh builds it): \
         a copy would not live in its pod's UTS and IPC namespaces",
        criu.display()
    ))
}

/// The config lines for a restore's joined namespaces and network lock.
pub fn lines(join: &[JoinNs], skip_network_lock: bool) -> String {
    let mut out = String::new();
    for j in join {
        out.push_str(&format!("join-ns {}:{}\n", j.kind, j.path));
    }
    if skip_network_lock {
        out.push_str("network-lock skip\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cri_spec() -> Value {
        json!({"hostname": "vllm-7d9f8-xyz12", "linux": {"namespaces": [
            {"type": "pid"}, {"type": "ipc", "path": "/proc/42/ns/ipc"},
            {"type": "uts", "path": "/proc/42/ns/uts"}, {"type": "mount"},
            {"type": "network", "path": "/var/run/netns/cni-1"}]}})
    }

    #[test]
    fn a_pod_containers_namespaces_are_joined_and_its_network_not_locked() {
        let spec = cri_spec();
        let join = joined(&spec).unwrap();
        assert_eq!(
            lines(&join, joins_network(&spec)),
            "join-ns uts:/proc/42/ns/uts\njoin-ns ipc:/proc/42/ns/ipc\nnetwork-lock skip\n"
        );
        assert_eq!(hostname_to_set(&spec), None, "the pod's UTS names it");
    }

    #[test]
    fn a_container_with_its_own_namespaces_gets_its_hostname_set() {
        let spec = json!({"hostname": "copy-b", "linux": {"namespaces": [
            {"type": "uts"}, {"type": "ipc"}, {"type": "network"}]}});
        assert_eq!(joined(&spec).unwrap(), Vec::new());
        assert!(!joins_network(&spec));
        assert_eq!(lines(&[], false), "");
        assert_eq!(hostname_to_set(&spec).as_deref(), Some("copy-b"));
        let host_uts = json!({"hostname": "h", "linux": {"namespaces": [{"type": "pid"}]}});
        assert_eq!(
            hostname_to_set(&host_uts),
            None,
            "the host's UTS is not ours to name"
        );
    }

    #[test]
    fn only_a_criu_that_says_it_is_patched_joins_a_pods_namespaces() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tool = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\nprintf '{text}'\n")).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            path
        };
        let patched = tool("patched", "Version: 4.2.1\\nvsnap: join-ns-root\\n");
        check_patched(&patched).unwrap();
        check_patched(&patched).unwrap();
        let stock = tool("stock", "Version: 4.2.1\\n");
        let e = check_patched(&stock).unwrap_err();
        assert!(e.contains("lacks vsnap's join-ns patch"), "{e}");
        let e = check_patched(&dir.path().join("absent")).unwrap_err();
        assert!(e.contains("absent --version"), "{e}");
    }

    #[test]
    fn a_path_criu_cannot_read_is_named() {
        let mut spec = cri_spec();
        spec["linux"]["namespaces"][2]["path"] = json!("/proc/42/ns/uts x");
        assert!(joined(&spec).unwrap_err().contains("\"/proc/42/ns/uts x\""));
    }
}
