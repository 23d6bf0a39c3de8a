//! The captured workload, read from its OCI spec: argv, environment (keyed),
//! root filesystem, image and the security-relevant spec fields; and how a
//! live one differs from it.

use std::collections::BTreeMap;

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
            fingerprint_key: key.id().to_string(),
        }
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
        let bytes = serde_json::to_vec(self).expect("a workload serializes");
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
        let live = &Workload {
            namespace: self.namespace.clone(),
            kubernetes_namespace: self.kubernetes_namespace.clone(),
            ..live.clone()
        };
        if self.fingerprint_key == live.fingerprint_key {
            return compare(self, live);
        }
        let mut out = vec![format!(
            "workload.fingerprint_key: captured {:?}, live {:?} (environment and secret flags were fingerprinted with another key: every host of a fleet needs the same fleet_fingerprint_key)",
            self.fingerprint_key, live.fingerprint_key
        )];
        let (a, b) = (self.without_keyed_values(), live.without_keyed_values());
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

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{fleet_key, test_key};
    use super::*;
    use serde_json::json;

    #[test]
    fn a_shared_fleet_key_fingerprints_alike_on_every_host() {
        let spec = json!({"process": {"args": ["serve", "--api-key", "k1"], "env": ["HF_TOKEN=hf_secret", "MODEL=m"]}, "root": {"path": "rootfs"}});
        // Two hosts: each its own host key, both the fleet's key.
        let (a, host_a) = test_key();
        let (b, host_b) = test_key();
        let on_a = Workload::from_spec(&spec, "/run/vsnap/control", &host_a);
        let on_b = Workload::from_spec(&spec, "/run/vsnap/control", &host_b);
        assert_eq!(on_a.fingerprint_key, "host");
        assert!(!on_a.diff(&on_b).is_empty(), "host keys differ per host");
        let fleet_a = Workload::from_spec(&spec, "/run/vsnap/control", &fleet_key(a.path(), 5));
        let fleet_b = Workload::from_spec(&spec, "/run/vsnap/control", &fleet_key(b.path(), 5));
        assert!(fleet_a.fingerprint_key.starts_with("fleet:"));
        assert_eq!(fleet_a.diff(&fleet_b), Vec::<String>::new());
        assert_eq!(fleet_a.key(), fleet_b.key(), "auto names agree");
        assert_ne!(fleet_a.key(), on_a.key());
        // One host's manifest JSON is as before fleets.
        let text = serde_json::to_string(&on_a).unwrap();
        assert!(!text.contains("fingerprint_key"), "{text}");
        let back: Workload = serde_json::from_str(&text).unwrap();
        assert_eq!(back, on_a);
    }

    #[test]
    fn another_fingerprint_key_is_named_not_every_value() {
        let spec = json!({"process": {"args": ["serve", "--api-key", "k1"], "env": ["HF_TOKEN=hf_secret", "MODEL=m"]}, "root": {"path": "rootfs"}});
        let (dir, host) = test_key();
        let fleet = fleet_key(dir.path(), 5);
        let captured = Workload::from_spec(&spec, "/run/vsnap/control", &fleet);
        let live = Workload::from_spec(&spec, "/run/vsnap/control", &host);
        let diff = captured.diff(&live);
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert!(
            diff[0].starts_with(&format!(
                "workload.fingerprint_key: captured \"{}\", live \"host\"",
                captured.fingerprint_key
            )),
            "{diff:?}"
        );
        assert!(diff[0].contains("fleet_fingerprint_key"), "{diff:?}");
        // Another fleet key, and a real difference beside it: both named.
        let mut other = spec.clone();
        other["process"]["env"] = json!(["HF_TOKEN=hf_secret", "MODEL=m", "EXTRA=1"]);
        other["root"]["path"] = json!("/elsewhere");
        let live = Workload::from_spec(&other, "/run/vsnap/control", &fleet_key(dir.path(), 6));
        let fields: Vec<&str> = captured
            .diff(&live)
            .iter()
            .map(|d| d.split(':').next().unwrap())
            .map(|f| match f {
                "workload.fingerprint_key" => "key",
                "workload.env.EXTRA" => "env",
                "workload.rootfs" => "rootfs",
                _ => "other",
            })
            .collect();
        assert_eq!(fields, ["key", "env", "rootfs"]);
    }

    #[test]
    fn env_is_fingerprinted_never_stored() {
        let spec = json!({"process": {"args": ["x"], "env": ["HF_TOKEN=hf_secret", "VSNAP_SNAPSHOT_CONFIG={}"]}, "root": {"path": "rootfs"}});
        let (_d, key) = test_key();
        let w = Workload::from_spec(&spec, "/run/vsnap/control", &key);
        let text = serde_json::to_string(&w).unwrap();
        assert!(!text.contains("hf_secret"), "{text}");
        assert_eq!(w.env.len(), 1, "vsnap's own variable is not identity");
        assert_eq!(
            w.env["HF_TOKEN"],
            env_fingerprint(&key, "HF_TOKEN", "hf_secret")
        );
        let mut unkeyed = <Sha256 as Digest>::new();
        unkeyed.update(b"HF_TOKEN\0hf_secret");
        assert_ne!(
            w.env["HF_TOKEN"],
            hex(&unkeyed.finalize()),
            "keyed, not a bare sha256"
        );
    }

    #[test]
    fn every_security_field_change_is_named() {
        let (_d, key) = test_key();
        let base = json!({
            "process": {"args": ["x"], "user": {"uid": 1000, "gid": 1000}, "capabilities": {"bounding": []}, "noNewPrivileges": true},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/run/vsnap/control", "source": "/a"}],
            "linux": {"namespaces": [{"type": "pid"}]},
        });
        let captured = Workload::from_spec(&base, "/run/vsnap/control", &key);
        let mut same = base.clone();
        same["mounts"][0]["source"] = json!("/b");
        assert!(
            captured
                .diff(&Workload::from_spec(&same, "/run/vsnap/control", &key))
                .is_empty(),
            "the control mount is not identity"
        );
        // A bind's source may differ; its destination, type and options may not.
        let mut with_shm = base.clone();
        with_shm["mounts"] = json!([{"destination": "/dev/shm", "type": "bind", "source": "/pod-a", "options": ["rbind", "rw"]}]);
        let shm = Workload::from_spec(&with_shm, "/run/vsnap/control", &key);
        let mut other_pod = with_shm.clone();
        other_pod["mounts"][0]["source"] = json!("/pod-b");
        assert!(shm
            .diff(&Workload::from_spec(&other_pod, "/run/vsnap/control", &key))
            .is_empty());
        let mut read_only = with_shm.clone();
        read_only["mounts"][0]["options"] = json!(["rbind", "ro"]);
        let diff = shm.diff(&Workload::from_spec(&read_only, "/run/vsnap/control", &key));
        assert_eq!(diff, ["workload.security.mounts: /dev/shm: rw -> ro"]);
        for (path, value, field) in [
            (
                &["process", "user"][..],
                json!({"uid": 0, "gid": 1000}),
                "workload.security.user",
            ),
            (
                &["process", "capabilities"],
                json!({"bounding": ["CAP_SYS_ADMIN"]}),
                "workload.security.capabilities",
            ),
            (
                &["process", "noNewPrivileges"],
                json!(false),
                "workload.security.no_new_privileges",
            ),
            (
                &["linux", "seccomp"],
                json!({"defaultAction": "SCMP_ACT_ALLOW"}),
                "workload.security.seccomp",
            ),
            (&["process", "args"], json!(["y"]), "workload.argv"),
            (&["root", "path"], json!("/other"), "workload.rootfs"),
        ] {
            let mut live = base.clone();
            let mut slot = &mut live;
            for p in &path[..path.len() - 1] {
                slot = &mut slot[*p];
            }
            slot[path[path.len() - 1]] = value;
            let diff = captured.diff(&Workload::from_spec(&live, "/run/vsnap/control", &key));
            assert_eq!(diff.len(), 1, "{field}: {diff:?}");
            assert!(diff[0].starts_with(field), "{field}: {diff:?}");
        }
        // What changed is readable (the seccomp profile is a digest).
        let mut live = base.clone();
        live["process"]["user"]["uid"] = json!(0);
        let diff = captured.diff(&Workload::from_spec(&live, "/run/vsnap/control", &key));
        assert_eq!(diff, ["workload.security.user.uid: captured 1000, live 0"]);
        assert!(captured.security["seccomp"].starts_with("sha256:"));
    }

    /// A spec as containerd's defaults make one, with ctr's default
    /// capabilities, its usual mounts, and `extra` set at `path`.
    fn spec_with(path: &[&str], extra: Value) -> Value {
        let caps = json!([
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FSETID",
            "CAP_FOWNER",
            "CAP_MKNOD",
            "CAP_NET_RAW",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETFCAP",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_KILL",
            "CAP_AUDIT_WRITE"
        ]);
        let mut spec = json!({
            "process": {"args": ["serve", "--api-key", "k1"], "capabilities": {"bounding": caps, "effective": caps, "permitted": caps}},
            "root": {"path": "rootfs"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
                {"destination": "/data", "type": "bind", "source": "/host/data", "options": ["rbind", "rw"]},
                {"destination": "/run/vsnap/control", "type": "bind", "source": "/x", "options": ["rbind", "ro"]},
            ],
            "linux": {
                "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                "resources": {"devices": [{"allow": false, "access": "rwm"}]},
                "maskedPaths": ["/proc/kcore", "/proc/keys"],
                "readonlyPaths": ["/proc/sys"],
            },
        });
        let mut slot = &mut spec;
        for p in path {
            slot = &mut slot[*p];
        }
        *slot = extra;
        spec
    }

    #[test]
    fn list_differences_are_named_by_element_whole() {
        let (_d, key) = test_key();
        let from = |spec: &Value| Workload::from_spec(spec, "/run/vsnap/control", &key);
        let captured = from(&spec_with(&["annotations"], json!({})));
        let mut live = spec_with(&["annotations"], json!({}));
        for set in ["bounding", "effective", "permitted"] {
            live["process"]["capabilities"][set]
                .as_array_mut()
                .unwrap()
                .push(json!("CAP_NET_ADMIN"));
        }
        live["process"]["capabilities"]["effective"]
            .as_array_mut()
            .unwrap()
            .retain(|c| c != "CAP_KILL");
        live["mounts"][2]["options"] = json!(["rbind", "ro"]);
        live["mounts"][2]["source"] = json!("/elsewhere");
        live["mounts"]
            .as_array_mut()
            .unwrap()
            .push(json!({"destination": "/models", "type": "bind", "source": "/m", "options": ["rbind", "ro"]}));
        live["linux"]["devices"]
            .as_array_mut()
            .unwrap()
            .push(json!({"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}));
        live["linux"]["resources"]["devices"] = json!([]);
        live["linux"]["maskedPaths"] = json!(["/proc/kcore"]);
        live["linux"]["readonlyPaths"] = json!(["/proc/sys", "/proc/bus"]);
        assert_eq!(
            captured.diff(&from(&live)),
            [
                "workload.security.capabilities.bounding: live adds CAP_NET_ADMIN",
                "workload.security.capabilities.effective: live adds CAP_NET_ADMIN and drops CAP_KILL",
                "workload.security.capabilities.permitted: live adds CAP_NET_ADMIN",
                "workload.security.devices.cgroup: live drops {access: rwm, allow: false}",
                "workload.security.devices.nodes: live adds /dev/nvidia1 (major 195, minor 1, type c)",
                "workload.security.masked_paths.masked: live drops /proc/keys",
                "workload.security.masked_paths.readonly: live adds /proc/bus",
                "workload.security.mounts: /data: rw -> ro",
                "workload.security.mounts: live adds /models (options [rbind, ro], type bind)",
            ]
        );
        // Taken away whole, a field is named with its whole value.
        let no_caps = spec_with(&["process", "capabilities"], Value::Null);
        let diff = captured.diff(&from(&no_caps));
        assert_eq!(diff.len(), 1, "{diff:?}");
        assert!(
            diff[0].starts_with(
                "workload.security.capabilities: captured {\"bounding\":[\"CAP_CHOWN\""
            ) && diff[0].ends_with("\"CAP_AUDIT_WRITE\"]}, live null"),
            "{diff:?}"
        );
    }

    #[test]
    fn a_difference_never_shows_a_secret() {
        let (_d, key) = test_key();
        let from = |spec: &Value| Workload::from_spec(spec, "/run/vsnap/control", &key);
        let captured = from(&spec_with(&["process", "env"], json!(["HF_TOKEN=hf_one"])));
        let mut live = spec_with(&["process", "env"], json!(["HF_TOKEN=hf_two"]));
        live["process"]["args"] = json!(["serve", "--api-key", "k2", "--port", "8001"]);
        let diff = captured.diff(&from(&live));
        assert_eq!(diff.len(), 2, "{diff:?}");
        let text = diff.join("; ");
        for secret in ["hf_one", "hf_two", "k1", "k2"] {
            assert!(!text.contains(secret), "{secret}: {text}");
        }
        // argv whole, its secret as the keyed tag; env by its fingerprints.
        let tag = |v: &str| format!("***:{}", &key.mac(v.as_bytes())[..16]);
        assert_eq!(
            diff[0],
            format!(
                "workload.argv: captured [\"serve\",\"--api-key\",\"{}\"], live [\"serve\",\"--api-key\",\"{}\",\"--port\",\"8001\"]",
                tag("k1"),
                tag("k2")
            )
        );
        assert_eq!(
            diff[1],
            format!(
                "workload.env.HF_TOKEN: captured \"{}\", live \"{}\"",
                env_fingerprint(&key, "HF_TOKEN", "hf_one"),
                env_fingerprint(&key, "HF_TOKEN", "hf_two")
            )
        );
    }

    #[test]
    fn a_field_recorded_as_a_digest_is_named_by_its_digests() {
        let (_d, key) = test_key();
        let from = |spec: &Value| Workload::from_spec(spec, "/run/vsnap/control", &key);
        let seccomp =
            |action: &str| spec_with(&["linux", "seccomp"], json!({"defaultAction": action}));
        let (a, b) = (
            from(&seccomp("SCMP_ACT_ERRNO")),
            from(&seccomp("SCMP_ACT_ALLOW")),
        );
        assert_eq!(
            a.diff(&b),
            [format!(
                "workload.security.seccomp: captured \"{}\", live \"{}\"",
                a.security["seccomp"], b.security["seccomp"]
            )]
        );
    }

    #[test]
    fn the_tenant_keys_auto_names_and_is_left_to_the_policy_in_a_diff() {
        let (_d, key) = test_key();
        let spec = json!({"process": {"args": ["x"]}, "root": {"path": "rootfs"}});
        let base = Workload::from_spec(&spec, "/run/vsnap/control", &key);
        let tenant = |t: &str| base.clone().with_tenant(&Tenant::parse(t).unwrap());
        let (a, b, plain) = (
            tenant("k8s.io/team-a"),
            tenant("k8s.io/team-b"),
            tenant("k8s.io"),
        );
        assert_eq!(a.tenant().to_string(), "k8s.io/team-a");
        assert_ne!(a.key(), b.key(), "two tenants' auto names never meet");
        assert_ne!(a.key(), plain.key());
        assert!(a.diff(&b).is_empty(), "the tenant policy compares owners");
        // A container without CRI serializes as before tenants: its auto
        // name is the one it had.
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("kubernetes_namespace").is_none(), "{json}");
        assert_eq!(json["namespace"], "k8s.io");
        // A manifest from before tenants: the containerd namespace alone.
        let old: Workload = serde_json::from_value(json).unwrap();
        assert_eq!(old.tenant(), Tenant::parse("k8s.io").unwrap());
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["kubernetes_namespace"], "team-a");
    }
}
