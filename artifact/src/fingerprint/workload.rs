//! The captured workload, read from its OCI spec: argv, environment (keyed),
//! root filesystem, image and the security-relevant spec fields; and how a
//! live one differs from it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::diff::{diff_json, to_map};
use super::secrets::{env_fingerprint, redact_argv, REDACTED};
use crate::key::{hex, FingerprintKey, HOST_FINGERPRINT_KEY};
use crate::tenant::Tenant;

/// The captured workload: argv with secrets redacted, environment as
/// name-bound keyed fingerprints (never values), the root filesystem, and
/// each security-relevant part of the OCI spec (its value, readable in a
/// mismatch; a digest for seccomp and large fields).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub rootfs: String,
    pub image: String,
    /// The image manifest's digest, from containerd, for image-based containers.
    #[serde(default)]
    pub image_digest: String,
    /// The containerd namespace the workload ran in; with
    /// `kubernetes_namespace`, the workload's [`Tenant`], the artifact's
    /// owner. Part of the identity (and so of `auto` names), but compared by
    /// the tenant policy, not by [`Workload::diff`].
    pub namespace: String,
    /// The pod's Kubernetes namespace, for a container CRI made
    /// ([`Tenant::of_spec`]). Absent for other containers, and in manifests
    /// from before tenants: those belong to their containerd namespace alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_namespace: Option<String>,
    pub security: BTreeMap<String, String>,
    /// The environment variables treated as the pod's own, not the
    /// workload's (per_pod.rs): their values (fingerprinted in `env`) are
    /// neither compared nor part of `auto`'s name, so two pods of one
    /// Deployment are one workload; the list itself is compared. Empty in
    /// manifests of format 5, from before per-pod names: every variable is
    /// compared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_pod_env: Vec<String>,
    /// Which key keyed `env` and the secret values of `argv`
    /// ([`FingerprintKey::id`]): `host` (left out of the JSON, as before
    /// fleets) or `fleet:<16 hex>`.
    #[serde(
        default = "host_fingerprint_key",
        skip_serializing_if = "is_host_fingerprint_key"
    )]
    pub fingerprint_key: String,
}

fn host_fingerprint_key() -> String {
    HOST_FINGERPRINT_KEY.to_string()
}

fn is_host_fingerprint_key(id: &str) -> bool {
    id == HOST_FINGERPRINT_KEY
}

/// How a security-relevant spec field is recorded: its compact JSON, so a
/// mismatch shows what changed (none of these fields is secret), or a
/// sha256 for the seccomp profile and anything over 2 KiB.
fn security_value(field: &str, value: &Value) -> String {
    let text = serde_json::to_string(value).unwrap_or_default();
    if field == "seccomp" || text.len() > 2048 {
        format!("sha256:{}", sha256_hex(text.as_bytes()))
    } else {
        text
    }
}

/// Environment variables vsnap itself sets: not part of the identity.
const OWN_ENV: &[&str] = &[vsnap_protocol::SNAPSHOT_CONFIG_ENV];

impl Workload {
    /// From an OCI spec (as JSON). `ignore_mount` is vsnap's own control-dir
    /// mount, whose source differs per container.
    /// Secret values (environment, secret flags) enter only as HMACs with
    /// `key` (this host's, or the fleet's shared fingerprint key): equal
    /// values compare equal, and a value cannot be confirmed from a manifest
    /// or an error message without the key.
    pub fn from_spec(spec: &Value, ignore_mount: &str, key: &FingerprintKey) -> Self {
        let process = &spec["process"];
        let args = process["args"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Workload {
            argv: redact_argv(key, args),
            env: env_fingerprints(process, key),
            rootfs: spec["root"]["path"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            image: image_name(&spec["annotations"]),
            image_digest: String::new(),
            namespace: String::new(),
            kubernetes_namespace: None,
            security: security(spec, ignore_mount),
            per_pod_env: Vec::new(),
            fingerprint_key: key.id().to_string(),
        }
        .with_per_pod_env(per_pod::of_spec(spec))
    }

    /// This identity with `names` (and [`per_pod::ALWAYS`]) treated as the
    /// pod's own: their names join `per_pod_env`, and their values (still
    /// fingerprinted in `env`, as a manifest from before per-pod names
    /// needs them) are neither compared nor part of [`Workload::key`].
    pub fn with_per_pod_env<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        let mut set: BTreeSet<String> = self.per_pod_env.drain(..).collect();
        set.extend(per_pod::ALWAYS.iter().map(|n| n.to_string()));
        set.extend(names.into_iter().map(|n| n.as_ref().to_string()));
        self.per_pod_env = set.into_iter().collect();
        self
    }

    /// This identity without the values of the pod's own variables.
    fn without_per_pod_values(&self, names: &[String]) -> Workload {
        let mut w = self.clone();
        w.env.retain(|name, _| !names.contains(name));
        w
    }

    /// Whose workload this is: the artifact's owner, as recorded.
    pub fn tenant(&self) -> Tenant {
        Tenant::recorded(&self.namespace, self.kubernetes_namespace.as_deref())
    }

    /// This identity as tenant `tenant`'s.
    pub fn with_tenant(self, tenant: &Tenant) -> Self {
        Workload {
            namespace: tenant.containerd().to_string(),
            kubernetes_namespace: tenant.kubernetes().map(str::to_string),
            ..self
        }
    }

    /// A short stable key of this identity, to name an artifact by. It
    /// includes the tenant: two tenants' `auto` names never meet.
    pub fn key(&self) -> String {
        let own = self.without_per_pod_values(&self.per_pod_env);
        let bytes = serde_json::to_vec(&own).expect("a workload serializes");
        sha256_hex(&bytes)[..24].to_string()
    }

    /// The fields that differ, as `workload.field: captured X, live Y`, a
    /// security field's lists by the elements that differ, whole
    /// ([`readable`]; `workload.security.mounts: /data: rw -> ro`).
    /// Keyed with different keys, the keyed values cannot be compared: the
    /// key is named first, and the rest compared without them (variable
    /// names and unkeyed argv words still are).
    /// The tenant is not compared here: whose artifact a workload may use
    /// is the tenant policy's to say.
    pub fn diff(&self, live: &Workload) -> Vec<String> {
        let mut live = Workload {
            namespace: self.namespace.clone(),
            kubernetes_namespace: self.kubernetes_namespace.clone(),
            ..live.without_per_pod_values(&self.per_pod_env)
        };
        // A variable the artifact holds as the pod's own is not compared by
        // value, whatever the live list says (the list itself still is). A
        // manifest from before per-pod names (format 5) has none: every
        // variable is compared, as its vsnap did, and the list is not.
        if self.per_pod_env.is_empty() {
            live.per_pod_env.clear();
        }
        let captured = &self.without_per_pod_values(&self.per_pod_env);
        let live = &live;
        if captured.fingerprint_key == live.fingerprint_key {
            return compare(captured, live);
        }
        let mut out = vec![format!(
            "workload.fingerprint_key: captured {:?}, live {:?} (environment and secret flags were fingerprinted with another key: every host of a fleet needs the same fleet_fingerprint_key)",
            captured.fingerprint_key, live.fingerprint_key
        )];
        let (a, b) = (captured.without_keyed_values(), live.without_keyed_values());
        out.extend(
            compare(&a, &b)
                .into_iter()
                .filter(|d| !d.starts_with("workload.fingerprint_key:")),
        );
        out
    }

    /// A copy with every keyed value blanked: environment values and the
    /// HMAC tags of secret argv values.
    fn without_keyed_values(&self) -> Workload {
        let mut w = self.clone();
        for v in w.env.values_mut() {
            *v = "(keyed)".into();
        }
        for a in &mut w.argv {
            if let Some(i) = a.find(REDACTED) {
                a.truncate(i + REDACTED.len());
            }
        }
        w
    }
}

/// Every difference of `live` from `captured`: argv whole (its order is its
/// meaning), every other field as [`diff_json`] names it in [`readable`].
fn compare(captured: &Workload, live: &Workload) -> Vec<String> {
    let mut out = Vec::new();
    if captured.argv != live.argv {
        out.push(format!(
            "workload.argv: captured {}, live {}",
            Value::from(captured.argv.clone()),
            Value::from(live.argv.clone())
        ));
    }
    out.extend(diff_json("workload", &readable(captured), &readable(live)));
    out
}

/// A workload as a difference names it: no argv ([`compare`] names it
/// whole), and each security field's recorded JSON as the value it holds
/// (a digest stays a string). The two lists `devices` and `masked_paths`
/// each record become named fields: `devices.nodes` (`linux.devices`, the
/// device nodes) and `devices.cgroup` (`linux.resources.devices`, the
/// cgroup rules); `masked_paths.masked` and `masked_paths.readonly`.
fn readable(w: &Workload) -> serde_json::Map<String, Value> {
    let mut map = to_map(w);
    map.remove("argv");
    let security = w
        .security
        .iter()
        .map(|(field, text)| {
            let value = match serde_json::from_str::<Value>(text) {
                Ok(v) if !text.starts_with("sha256:") => named_pair(field, v),
                _ => Value::String(text.clone()),
            };
            (field.clone(), value)
        })
        .collect();
    map.insert("security".into(), Value::Object(security));
    map
}

/// The names of the two lists a security field records as a pair.
fn named_pair(field: &str, value: Value) -> Value {
    let names = match field {
        "devices" => ["nodes", "cgroup"],
        "masked_paths" => ["masked", "readonly"],
        _ => return value,
    };
    match value {
        Value::Array(pair) if pair.len() == 2 => {
            let mut pair = pair.into_iter();
            serde_json::json!({names[0]: pair.next(), names[1]: pair.next()})
        }
        other => other,
    }
}

/// Each environment variable's keyed fingerprint by name, but vsnap's own.
fn env_fingerprints(process: &Value, key: &FingerprintKey) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in process["env"].as_array().into_iter().flatten() {
        if let Some((name, value)) = e.as_str().and_then(|s| s.split_once('=')) {
            if !OWN_ENV.contains(&name) {
                env.insert(name.to_string(), env_fingerprint(key, name, value));
            }
        }
    }
    env
}

/// The image name from the first annotation that has one (CRI, OCI,
/// containerd); empty without.
fn image_name(annotations: &Value) -> String {
    [
        "io.kubernetes.cri.image-name",
        "org.opencontainers.image.ref.name",
        "io.containerd.image.name",
    ]
    .iter()
    .find_map(|k| annotations[*k].as_str())
    .unwrap_or_default()
    .to_string()
}

/// Each security-relevant spec field by name, as [`security_value`]
/// records it.
fn security(spec: &Value, ignore_mount: &str) -> BTreeMap<String, String> {
    let (process, linux) = (&spec["process"], &spec["linux"]);
    let mut security = BTreeMap::new();
    for (field, value) in [
        ("user", process["user"].clone()),
        ("capabilities", process["capabilities"].clone()),
        ("no_new_privileges", process["noNewPrivileges"].clone()),
        ("apparmor", process["apparmorProfile"].clone()),
        ("selinux", process["selinuxLabel"].clone()),
        ("seccomp", linux["seccomp"].clone()),
        (
            "devices",
            serde_json::json!([linux["devices"], linux["resources"]["devices"]]),
        ),
        ("mounts", Value::Array(mounts(spec, ignore_mount))),
        ("namespaces", Value::Array(namespaces(linux))),
        (
            "masked_paths",
            serde_json::json!([linux["maskedPaths"], linux["readonlyPaths"]]),
        ),
        ("root_readonly", spec["root"]["readonly"].clone()),
    ] {
        security.insert(field.to_string(), security_value(field, &value));
    }
    security
}

/// The mounts but vsnap's control mount: where, what and how, not from
/// where: a bind source (an emptyDir, a per-pod path) legitimately differs
/// from one container to the next.
fn mounts(spec: &Value, ignore_mount: &str) -> Vec<Value> {
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["destination"].as_str() != Some(ignore_mount))
        .map(|m| serde_json::json!({"destination": m["destination"], "type": m["type"], "options": m["options"]}))
        .collect()
}

/// Each namespace's type and whether it joins an existing one (its path
/// differs per container).
fn namespaces(linux: &Value) -> Vec<Value> {
    linux["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| serde_json::json!({"type": n["type"], "joined": n.get("path").is_some()}))
        .collect()
}

pub mod per_pod;

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests;
