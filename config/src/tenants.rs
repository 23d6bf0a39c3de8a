//! `[tenants]`: the operator's policy over tenants. A tenant is a containerd
//! namespace (`default`), or for a pod's container the containerd namespace
//! and the pod's Kubernetes namespace (`k8s.io/team-a`). By default each
//! tenant creates and restores its own artifacts only, nothing is shared,
//! and a Kubernetes tenant's `vsnap.io/artifact-ref` names nothing (no
//! registry configured for it). This file holds the rules as text; the shim
//! applies them to the tenant it resolved.
//!
//! A tenant pattern is a tenant (`k8s.io/team-a`, `default`), every pod of
//! a containerd namespace (`k8s.io/*`, which does not match `k8s.io`
//! itself), or everyone (`*`).

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TenantPolicy {
    /// Tenant patterns that may create (capture) artifacts. Unset: every
    /// tenant may; `[]`: none.
    pub create: Option<Vec<String>>,
    /// Artifacts shared on purpose (`[[tenants.share]]`).
    pub share: Vec<Share>,
    /// Per tenant pattern, the registries and repositories its
    /// `vsnap.io/artifact-ref` may name: `host[:port]` (the whole
    /// registry), `host[:port]/repository` (that repository) or
    /// `host[:port]/prefix*` (repositories whose path starts so). A
    /// Kubernetes tenant that no pattern matches may name none; a plain
    /// containerd namespace that none matches may name any (as before
    /// tenants: only the host's operator runs containers there).
    pub artifact_refs: BTreeMap<String, Vec<String>>,
}

/// Artifacts of one tenant that others may restore (never replace).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// The tenant that owns the artifacts (exact, no pattern).
    pub owner: String,
    /// Artifact names, or name prefixes ending in `*`.
    pub artifacts: Vec<String>,
    /// Tenant patterns that may restore them.
    pub to: Vec<String>,
}

impl TenantPolicy {
    /// Whether `tenant` may create artifacts.
    pub fn may_create(&self, tenant: &str) -> bool {
        self.create
            .as_ref()
            .is_none_or(|list| list.iter().any(|p| tenant_matches(p, tenant)))
    }

    /// The share that lets `tenant` restore `owner`'s artifact `name`, if
    /// one does.
    pub fn share_for(&self, tenant: &str, owner: &str, name: &str) -> Option<&Share> {
        self.share.iter().find(|s| {
            s.owner == owner
                && s.to.iter().any(|p| tenant_matches(p, tenant))
                && s.artifacts.iter().any(|a| name_matches(a, name))
        })
    }

    /// The registries and repositories `tenant`'s `artifact-ref` may name,
    /// from every pattern that matches it; None when no pattern does.
    pub fn artifact_refs_for(&self, tenant: &str) -> Option<Vec<&str>> {
        let mut matched = false;
        let mut out = Vec::new();
        for (pattern, entries) in &self.artifact_refs {
            if tenant_matches(pattern, tenant) {
                matched = true;
                out.extend(entries.iter().map(String::as_str));
            }
        }
        matched.then_some(out)
    }

    /// Every pattern and entry well formed; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        for p in self.create.iter().flatten() {
            check_tenant_pattern(p).map_err(|e| format!("tenants.create: {e}"))?;
        }
        for (i, s) in self.share.iter().enumerate() {
            let at = format!("tenants.share[{i}]");
            check_tenant(&s.owner).map_err(|e| format!("{at}.owner: {e}"))?;
            if s.artifacts.is_empty() || s.to.is_empty() {
                return Err(format!("{at}: artifacts and to must not be empty"));
            }
            for a in &s.artifacts {
                let bare = a.strip_suffix('*').unwrap_or(a);
                if bare.contains('*') || bare.contains('/') {
                    return Err(format!(
                        "{at}.artifacts: {a:?}: a name, or a prefix ending in '*'"
                    ));
                }
            }
            for p in &s.to {
                check_tenant_pattern(p).map_err(|e| format!("{at}.to: {e}"))?;
            }
        }
        for (p, entries) in &self.artifact_refs {
            check_tenant_pattern(p).map_err(|e| format!("tenants.artifact_refs: {e}"))?;
            for entry in entries {
                check_ref_entry(entry)
                    .map_err(|e| format!("tenants.artifact_refs.{p:?}: {entry:?}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// Whether `entry` of [`TenantPolicy::artifact_refs`] allows repository
/// `repository` of registry `registry` (`host[:port]`).
pub fn ref_allowed(entry: &str, registry: &str, repository: &str) -> bool {
    let (host, path) = entry.split_once('/').unwrap_or((entry, ""));
    if host != registry {
        return false;
    }
    match (path, path.strip_suffix('*')) {
        ("", _) => true,
        (_, Some(prefix)) => repository.starts_with(prefix),
        (exact, None) => repository == exact,
    }
}

fn tenant_matches(pattern: &str, tenant: &str) -> bool {
    match pattern.strip_suffix("/*") {
        _ if pattern == "*" => true,
        Some(ns) => tenant
            .split_once('/')
            .is_some_and(|(c, k)| c == ns && !k.is_empty()),
        None => pattern == tenant,
    }
}

fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// `namespace` or `namespace/kubernetes-namespace`.
fn check_tenant(t: &str) -> Result<(), String> {
    let ok = match t.split_once('/') {
        Some((c, k)) => !c.is_empty() && !k.is_empty() && !k.contains('/'),
        None => !t.is_empty(),
    };
    if !ok || t.contains('*') || t.contains(char::is_whitespace) {
        return Err(format!(
            "{t:?}: a tenant is `namespace` or `namespace/kubernetes-namespace`"
        ));
    }
    Ok(())
}

fn check_tenant_pattern(p: &str) -> Result<(), String> {
    if p == "*" {
        return Ok(());
    }
    check_tenant(p.strip_suffix("/*").unwrap_or(p)).map_err(|_| {
        format!(
            "{p:?}: a tenant (`namespace`, `namespace/kubernetes-namespace`), `namespace/*` or `*`"
        )
    })
}

fn check_ref_entry(entry: &str) -> Result<(), String> {
    let (host, path) = entry.split_once('/').unwrap_or((entry, ""));
    let bare = path.strip_suffix('*').unwrap_or(path);
    if host.is_empty()
        || host.contains(['@', '*'])
        || bare.contains(['*', ':', '@'])
        || entry.contains(char::is_whitespace)
    {
        return Err(
            "`host[:port]`, `host[:port]/repository` or `host[:port]/prefix*` (no tag or digest)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(toml_text: &str) -> Result<TenantPolicy, String> {
        let p: TenantPolicy = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        p.validate()?;
        Ok(p)
    }

    #[test]
    fn by_default_every_tenant_creates_and_nothing_is_shared_or_pullable() {
        let p = TenantPolicy::default();
        assert!(p.may_create("k8s.io/team-a") && p.may_create("default"));
        assert!(p.share_for("k8s.io/team-b", "k8s.io/team-a", "x").is_none());
        assert_eq!(p.artifact_refs_for("k8s.io/team-a"), None);
    }

    #[test]
    fn create_is_limited_to_the_listed_tenants() {
        let p = policy(r#"create = ["k8s.io/builders", "default"]"#).unwrap();
        assert!(p.may_create("k8s.io/builders") && p.may_create("default"));
        assert!(!p.may_create("k8s.io/team-a") && !p.may_create("k8s.io"));
        let p = policy(r#"create = ["k8s.io/*"]"#).unwrap();
        assert!(p.may_create("k8s.io/team-a"));
        assert!(!p.may_create("k8s.io"), "k8s.io/* is a pod's tenant only");
        assert!(!p.may_create("k8s.iox/a"));
        assert!(!policy("create = []").unwrap().may_create("default"));
    }

    #[test]
    fn a_share_names_its_owner_its_artifacts_and_who_may_restore_them() {
        let p = policy(
            r#"
            [[share]]
            owner = "k8s.io/models"
            artifacts = ["llama-*", "qwen"]
            to = ["k8s.io/team-a"]
            "#,
        )
        .unwrap();
        let may = |t: &str, o: &str, n: &str| p.share_for(t, o, n).is_some();
        assert!(may("k8s.io/team-a", "k8s.io/models", "llama-8b"));
        assert!(may("k8s.io/team-a", "k8s.io/models", "qwen"));
        assert!(!may("k8s.io/team-a", "k8s.io/models", "qwen-2"));
        assert!(
            !may("k8s.io/team-a", "k8s.io/team-c", "llama-8b"),
            "another owner"
        );
        assert!(
            !may("k8s.io/team-b", "k8s.io/models", "llama-8b"),
            "not shared to b"
        );
        // The upgrade share of docs/kubernetes.md: pods' artifacts from
        // before tenants (owner k8s.io) to every pod, and to no plain tenant.
        let p = policy("[[share]]\nowner = \"k8s.io\"\nartifacts = [\"*\"]\nto = [\"k8s.io/*\"]")
            .unwrap();
        assert!(p
            .share_for("k8s.io/team-b", "k8s.io", "auto-0123")
            .is_some());
        assert!(p.share_for("default", "k8s.io", "auto-0123").is_none());
        assert!(p.share_for("k8s.io/team-b", "k8s.io/team-a", "x").is_none());
    }

    #[test]
    fn artifact_refs_allow_registries_repositories_and_prefixes() {
        let p = policy(
            r#"
            [artifact_refs]
            "k8s.io/team-a" = ["reg.internal:5000/team-a/*", "mirror.internal/shared"]
            "k8s.io/*" = ["cache.internal:5000"]
            "#,
        )
        .unwrap();
        let a = p.artifact_refs_for("k8s.io/team-a").unwrap();
        let allowed = |reg: &str, repo: &str| a.iter().any(|e| ref_allowed(e, reg, repo));
        assert!(allowed("reg.internal:5000", "team-a/llama"));
        assert!(!allowed("reg.internal:5000", "team-b/llama"));
        assert!(
            !allowed("reg.internal", "team-a/llama"),
            "the port is part of the host"
        );
        assert!(allowed("mirror.internal", "shared"));
        assert!(!allowed("mirror.internal", "shared-x"));
        assert!(allowed("cache.internal:5000", "anything/here"));
        assert_eq!(
            p.artifact_refs_for("k8s.io/team-b").unwrap(),
            ["cache.internal:5000"]
        );
        assert_eq!(p.artifact_refs_for("default"), None);
    }

    #[test]
    fn malformed_entries_are_refused_naming_the_key() {
        for (text, key) in [
            (r#"create = ["k8s.io/a/b"]"#, "tenants.create"),
            (r#"create = ["*/team-a"]"#, "tenants.create"),
            (
                "[[share]]\nowner = \"k8s.io/*\"\nartifacts = [\"x\"]\nto = [\"*\"]",
                "tenants.share[0].owner",
            ),
            (
                "[[share]]\nowner = \"k8s.io/a\"\nartifacts = [\"x*y\"]\nto = [\"*\"]",
                "tenants.share[0].artifacts",
            ),
            (
                "[[share]]\nowner = \"k8s.io/a\"\nartifacts = []\nto = [\"*\"]",
                "tenants.share[0]",
            ),
            (
                "[artifact_refs]\n\"k8s.io/a\" = [\"reg:5000/repo:tag\"]",
                "tenants.artifact_refs",
            ),
            (
                "[artifact_refs]\n\"k8s.io/a\" = [\"user@reg:5000/repo\"]",
                "tenants.artifact_refs",
            ),
        ] {
            let e = policy(text).unwrap_err();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        let e = policy("shares = []").unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
    }
}
