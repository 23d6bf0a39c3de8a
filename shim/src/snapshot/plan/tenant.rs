//! Whose a container is, and what its tenant may do with artifacts, by the
//! runtime config's `[tenants]` policy (vsnap_config::tenants): the tenant
//! read from the spec at create; a pull's reference checked before any
//! connection; a create allowed, and never over another tenant's artifact;
//! a restore of another tenant's artifact only where a share allows it.

use std::path::Path;

use serde_json::Value;
use vsnap_artifact::{Manifest, Tenant};
use vsnap_config::tenants::ref_allowed;
use vsnap_config::{RuntimeConfig, TenantPolicy};

use super::annotations as plan;
use crate::error::{Error, Result};

/// The container's tenant: its containerd namespace and, for a pod's
/// container, the pod's Kubernetes namespace, from the annotation CRI sets
/// on the spec after any a pod passes through (vsnap_artifact::tenant).
pub fn resolve(namespace: &str, spec: &Value) -> Result<Tenant> {
    Tenant::of_spec(namespace, spec)
        .map_err(|e| Error::InvalidArgument(format!("create: tenant: {e}")))
}

/// Before any connection to a registry: the reference the plan names
/// (`vsnap.io/artifact-ref`) must be one `tenants.artifact_refs` allows
/// `tenant`. A Kubernetes tenant without an entry may name none; a plain
/// containerd namespace without one may name any, as before tenants.
pub fn check_reference(config: &RuntimeConfig, tenant: &Tenant, plan: &plan::Plan) -> Result<()> {
    let Some(reference) = &plan.artifact_ref else {
        return Ok(());
    };
    let allowed = match config.tenants.artifact_refs_for(&tenant.to_string()) {
        None if tenant.kubernetes().is_none() => return Ok(()),
        None => Vec::new(),
        Some(list) => list,
    };
    let parsed = vsnap_config::reference::parse(reference)
        .map_err(|e| Error::InvalidArgument(format!("create: {}: {e}", plan::ARTIFACT_REF)))?;
    let (registry, repository) = (parsed.registry.as_str(), parsed.repository.as_str());
    if allowed.iter().any(|e| ref_allowed(e, registry, repository)) {
        return Ok(());
    }
    let configured = if allowed.is_empty() {
        "none is configured for it".to_string()
    } else {
        format!("it allows {}", allowed.join(", "))
    };
    Err(Error::FailedPrecondition(format!(
        "restore: pull {reference}: refused by the tenant policy: tenant {tenant} may not pull from \
         {registry}/{repository} (tenants.artifact_refs in the runtime config: {configured}); \
         nothing was fetched"
    )))
}

/// Whether `tenant` may create artifacts (`tenants.create`).
pub fn may_create(policy: &TenantPolicy, tenant: &Tenant) -> bool {
    policy.may_create(&tenant.to_string())
}

/// The refusal of a create by a tenant `tenants.create` leaves out.
pub fn create_refused(tenant: &Tenant, name: &str) -> Error {
    Error::FailedPrecondition(format!(
        "create: artifact {name}: tenant {tenant} may not create artifacts \
         (tenants.create in the runtime config does not list it)"
    ))
}

/// A restore by `live` of artifact `name`, owned by `owner`: its own, or
/// shared with it on purpose (`[[tenants.share]]`).
pub fn check_restore(
    policy: &TenantPolicy,
    live: &Tenant,
    owner: &Tenant,
    name: &str,
) -> Result<()> {
    if live == owner {
        return Ok(());
    }
    if policy
        .share_for(&live.to_string(), &owner.to_string(), name)
        .is_some()
    {
        log::info!(
            "artifact {name} of tenant {owner}: restored by tenant {live}, as tenants.share allows"
        );
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "restore: preflight: artifact {name} belongs to tenant {owner}, not {live}: a tenant \
         restores only its own artifacts unless the runtime config shares them \
         ([[tenants.share]] owner = \"{owner}\")"
    )))
}

/// A create may replace only its own tenant's artifact. With
/// `allow_artifact_replace`, also another plain containerd namespace's,
/// from a plain containerd namespace; never a Kubernetes tenant's, nor by
/// one. Called with the name's exclusive lock held.
pub fn check_replace(root: &Path, name: &str, tenant: &Tenant, allowed: bool) -> Result<()> {
    let Ok(existing) = Manifest::load_unverified(root, name) else {
        return Ok(());
    };
    check_owner_for_replace(name, &existing.workload.tenant(), tenant, allowed)
}

/// [`check_replace`] once the owner is known.
fn check_owner_for_replace(
    name: &str,
    owner: &Tenant,
    tenant: &Tenant,
    allowed: bool,
) -> Result<()> {
    if owner == tenant {
        return Ok(());
    }
    let plain = owner.kubernetes().is_none() && tenant.kubernetes().is_none();
    if allowed && plain {
        return Ok(());
    }
    let hint = if plain {
        "name another artifact, or set allow_artifact_replace = true in the runtime config"
    } else {
        "name another artifact"
    };
    Err(Error::FailedPrecondition(format!(
        "create: artifact {name} belongs to tenant {owner}, not {tenant}: a create replaces \
         only its own tenant's artifacts ({hint})"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn t(s: &str) -> Tenant {
        Tenant::parse(s).unwrap()
    }

    fn config(toml: &str) -> RuntimeConfig {
        RuntimeConfig::parse(toml, "inline").unwrap()
    }

    fn settings(reference: &str) -> plan::Plan {
        let settings: HashMap<String, String> = [
            ("vsnap.io/plan", "restore"),
            ("vsnap.io/artifact", "a"),
            ("vsnap.io/listen", "127.0.0.1:8000"),
            ("vsnap.io/artifact-ref", reference),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        plan::from_annotations(&settings).unwrap().unwrap()
    }

    #[test]
    fn the_tenant_is_the_spec_annotation_within_the_namespace() {
        let spec = json!({"annotations": {"io.kubernetes.cri.sandbox-namespace": "team-a"}});
        assert_eq!(resolve("k8s.io", &spec).unwrap(), t("k8s.io/team-a"));
        assert_eq!(resolve("default", &json!({})).unwrap(), t("default"));
        let bad = json!({"annotations": {"io.kubernetes.cri.sandbox-namespace": "A/B"}});
        let e = resolve("k8s.io", &bad).unwrap_err().to_string();
        assert!(e.starts_with("create: tenant:"), "{e}");
    }

    #[test]
    fn a_kubernetes_tenant_pulls_only_from_what_is_configured_for_it() {
        let none = RuntimeConfig::default();
        let e = check_reference(&none, &t("k8s.io/b"), &settings("127.0.0.1:1/x/y:v1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refused by the tenant policy")
                && e.contains("tenant k8s.io/b")
                && e.contains("127.0.0.1:1/x/y")
                && e.contains("none is configured"),
            "{e}"
        );
        // A plain containerd namespace keeps today's behaviour.
        check_reference(&none, &t("default"), &settings("127.0.0.1:1/x/y:v1")).unwrap();
        let c = config("[tenants.artifact_refs]\n\"k8s.io/b\" = [\"127.0.0.1:5000/b/*\"]\n");
        check_reference(&c, &t("k8s.io/b"), &settings("127.0.0.1:5000/b/m:v1")).unwrap();
        let e = check_reference(&c, &t("k8s.io/b"), &settings("127.0.0.1:5000/a/m:v1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("it allows 127.0.0.1:5000/b/*"), "{e}");
        // Configured for a plain namespace: limited there too.
        let c = config("[tenants.artifact_refs]\ndefault = []\n");
        assert!(check_reference(&c, &t("default"), &settings("127.0.0.1:1/x:v1")).is_err());
    }

    #[test]
    fn a_restore_across_tenants_needs_a_share_and_names_both() {
        let none = TenantPolicy::default();
        check_restore(&none, &t("k8s.io/a"), &t("k8s.io/a"), "m").unwrap();
        let e = check_restore(&none, &t("k8s.io/b"), &t("k8s.io/a"), "m")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("artifact m belongs to tenant k8s.io/a, not k8s.io/b"),
            "{e}"
        );
        let c = config(
            "[[tenants.share]]\nowner = \"k8s.io/a\"\nartifacts = [\"m\"]\nto = [\"k8s.io/b\"]\n",
        );
        check_restore(&c.tenants, &t("k8s.io/b"), &t("k8s.io/a"), "m").unwrap();
        assert!(check_restore(&c.tenants, &t("k8s.io/c"), &t("k8s.io/a"), "m").is_err());
        assert!(check_restore(&c.tenants, &t("k8s.io/b"), &t("k8s.io/a"), "n").is_err());
    }

    #[test]
    fn a_create_replaces_only_its_own_tenants_artifact() {
        let check = |owner: &str, tenant: &str, allowed: bool| {
            check_owner_for_replace("m", &t(owner), &t(tenant), allowed).map_err(|e| e.to_string())
        };
        check("k8s.io/a", "k8s.io/a", false).unwrap();
        let e = check("k8s.io/a", "k8s.io/b", false).unwrap_err();
        assert!(
            e.contains("create: artifact m belongs to tenant k8s.io/a, not k8s.io/b")
                && !e.contains("allow_artifact_replace"),
            "{e}"
        );
        // allow_artifact_replace: between plain containerd namespaces only.
        let e = check("default", "lab", false).unwrap_err();
        assert!(e.contains("allow_artifact_replace = true"), "{e}");
        check("default", "lab", true).unwrap();
        assert!(check("k8s.io/a", "k8s.io/b", true).is_err());
        assert!(check("k8s.io/a", "default", true).is_err());
        assert!(check("default", "k8s.io/b", true).is_err());
    }

    #[test]
    fn create_is_refused_for_tenants_the_policy_leaves_out() {
        let c = config("[tenants]\ncreate = [\"k8s.io/builders\"]\n");
        assert!(may_create(&c.tenants, &t("k8s.io/builders")));
        assert!(!may_create(&c.tenants, &t("k8s.io/a")));
        let e = create_refused(&t("k8s.io/a"), "m").to_string();
        assert!(e.contains("tenant k8s.io/a may not create"), "{e}");
    }
}
