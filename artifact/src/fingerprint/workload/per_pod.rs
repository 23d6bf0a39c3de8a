//! What each pod (or container) is given as its own and is not the
//! workload: the variables whose values differ between two pods of one
//! Deployment by design. containerd's CRI and dockerd put the pod's or the
//! container's hostname into `HOSTNAME`; an operator names the others
//! (downward API variables such as `POD_NAME`, `POD_IP`, `POD_UID`,
//! `NODE_NAME`) in the runtime config's `per_pod_env` or a pod's
//! `vsnap.io/per-pod-env` annotation.

use serde_json::Value;

/// Always the pod's own: the hostname containerd's CRI and dockerd set.
pub const ALWAYS: &[&str] = &["HOSTNAME"];

/// The annotation naming more per-pod variables (comma or space separated).
pub const ANNOTATION: &str = "vsnap.io/per-pod-env";

/// The names an annotation value lists: split at commas and white space,
/// empty parts dropped. A name holding `=` is an error naming it.
pub fn parse(value: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for name in value
        .split([',', ' ', '\t', '\n'])
        .filter(|n| !n.is_empty())
    {
        if name.contains('=') {
            return Err(format!(
                "{ANNOTATION}: {name:?} is not a variable name (it holds '=')"
            ));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// The names the spec's own annotation lists; a malformed value lists
/// none here (the shim refuses it at create, naming it).
pub fn of_spec(spec: &Value) -> Vec<String> {
    spec["annotations"][ANNOTATION]
        .as_str()
        .and_then(|v| parse(v).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_annotation_lists_names_at_commas_and_spaces() {
        assert_eq!(
            parse("POD_NAME, POD_IP,,NODE_NAME\tPOD_UID").unwrap(),
            ["POD_NAME", "POD_IP", "NODE_NAME", "POD_UID"]
        );
        assert!(parse("").unwrap().is_empty());
        assert!(parse("POD_NAME=x").unwrap_err().contains("\"POD_NAME=x\""));
        let spec = serde_json::json!({"annotations": {ANNOTATION: "POD_IP"}});
        assert_eq!(of_spec(&spec), ["POD_IP"]);
        assert!(of_spec(&serde_json::json!({})).is_empty());
    }
}
