//! Who a workload, and the artifact captured from it, belongs to: the
//! containerd namespace and, for a container that containerd's CRI plugin
//! made, the pod's Kubernetes namespace. Under Kubernetes every pod runs in
//! the one containerd namespace `k8s.io`: the Kubernetes namespace is what
//! tells tenants apart there.
//!
//! The Kubernetes namespace is read from the annotation CRI puts on every
//! container's and sandbox's spec ([`SANDBOX_NAMESPACE`], from the
//! `PodSandboxConfig` metadata kubelet fills in with the pod's namespace).
//! containerd 2.1 adds it after the pod and container annotations its
//! `pod_annotations`/`container_annotations` allowlists pass through
//! (`annotations.DefaultCRIAnnotations`, last in the spec options of
//! internal/cri/server/container_create.go and podsandbox/sandbox_run_linux.go),
//! so a pod that sets it itself is overwritten, even where an allowlist lets
//! it through.

use std::fmt;

use serde_json::Value;

/// The annotation with the pod's Kubernetes namespace, set by containerd's
/// CRI plugin on every container and sandbox.
pub const SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";

/// The owner of a workload and of its artifacts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant {
    containerd: String,
    kubernetes: Option<String>,
}

impl Tenant {
    /// A tenant of containerd namespace `containerd`, in Kubernetes
    /// namespace `kubernetes` where the container is a pod's. Either name
    /// must be one its system allows (a Kubernetes namespace is a DNS
    /// label; a containerd namespace has no `/`).
    pub fn new(containerd: &str, kubernetes: Option<&str>) -> Result<Self, String> {
        if containerd.is_empty() || containerd.contains('/') {
            return Err(format!(
                "containerd namespace {containerd:?}: empty or with a '/'"
            ));
        }
        if let Some(k) = kubernetes {
            if !is_dns_label(k) {
                return Err(format!(
                    "Kubernetes namespace {k:?}: not a DNS label (lowercase letters, digits and '-', at most 63)"
                ));
            }
        }
        Ok(Tenant {
            containerd: containerd.to_string(),
            kubernetes: kubernetes.map(str::to_string),
        })
    }

    /// As a manifest records it, unchecked (an edited manifest fails its
    /// MAC; an owner that matches no policy entry is refused anyway).
    pub(crate) fn recorded(containerd: &str, kubernetes: Option<&str>) -> Self {
        Tenant {
            containerd: containerd.to_string(),
            kubernetes: kubernetes.map(str::to_string),
        }
    }

    /// The tenant of a container in containerd namespace `namespace` with
    /// OCI spec `spec`: the Kubernetes namespace from CRI's annotation, if
    /// the spec has one (an empty value counts as none).
    pub fn of_spec(namespace: &str, spec: &Value) -> Result<Self, String> {
        let kubernetes = spec["annotations"][SANDBOX_NAMESPACE]
            .as_str()
            .filter(|k| !k.is_empty());
        Tenant::new(namespace, kubernetes)
    }

    /// `namespace` or `namespace/kubernetes-namespace`, as [`fmt::Display`]
    /// writes it.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once('/') {
            Some((c, k)) => Tenant::new(c, Some(k)),
            None => Tenant::new(text, None),
        }
    }

    pub fn containerd(&self) -> &str {
        &self.containerd
    }

    pub fn kubernetes(&self) -> Option<&str> {
        self.kubernetes.as_deref()
    }
}

/// `k8s.io/team-a` for a pod's container, `default` for a container of
/// containerd namespace `default` made without CRI.
impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kubernetes {
            Some(k) => write!(f, "{}/{k}", self.containerd),
            None => f.write_str(&self.containerd),
        }
    }
}

/// RFC 1123 label, as Kubernetes requires of a namespace's name.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pods_tenant_is_cris_sandbox_namespace_within_the_containerd_namespace() {
        let spec = json!({"annotations": {
            SANDBOX_NAMESPACE: "team-a",
            "io.kubernetes.cri.container-type": "container",
        }});
        let t = Tenant::of_spec("k8s.io", &spec).unwrap();
        assert_eq!(t.to_string(), "k8s.io/team-a");
        assert_eq!((t.containerd(), t.kubernetes()), ("k8s.io", Some("team-a")));
        assert_eq!(Tenant::parse("k8s.io/team-a").unwrap(), t);
    }

    #[test]
    fn a_container_without_cri_is_its_containerd_namespace_alone() {
        for spec in [
            json!({}),
            json!({"annotations": {"vsnap.io/plan": "create"}}),
            json!({"annotations": {SANDBOX_NAMESPACE: ""}}),
        ] {
            let t = Tenant::of_spec("default", &spec).unwrap();
            assert_eq!(t.to_string(), "default");
            assert_eq!(t.kubernetes(), None);
        }
        // The same containerd namespace with and without a pod: two tenants.
        assert_ne!(
            Tenant::parse("k8s.io").unwrap(),
            Tenant::parse("k8s.io/default").unwrap()
        );
    }

    #[test]
    fn names_neither_system_allows_are_refused() {
        let spec = json!({"annotations": {SANDBOX_NAMESPACE: "../Team A"}});
        let e = Tenant::of_spec("k8s.io", &spec).unwrap_err();
        assert!(e.contains("not a DNS label"), "{e}");
        assert!(Tenant::parse("a/b/c").is_err());
        assert!(Tenant::parse("").is_err());
        assert!(Tenant::parse("k8s.io/").is_err());
        assert!(Tenant::new("k8s.io", Some(&"a".repeat(64))).is_err());
    }
}
