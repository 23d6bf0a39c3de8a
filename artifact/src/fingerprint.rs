//! What an artifact is valid for: the host it was made on and the workload
//! it captured. At restore both are taken again and compared: the workload
//! field by field, the host by the compatibility rules of [`crate::compat`];
//! every difference that forbids the restore is named with its captured and
//! live value (or digest).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::key::{hex, FingerprintKey, HOST_FINGERPRINT_KEY};

/// The binaries whose identity an artifact depends on.
#[derive(Debug, Clone)]
pub struct Tools {
    pub runc: PathBuf,
    pub criu: PathBuf,
    pub cuda_plugin: PathBuf,
    /// NVIDIA's cuda-checkpoint (a name on PATH or a path).
    pub cuda_checkpoint: PathBuf,
}

impl Default for Tools {
    fn default() -> Self {
        Tools {
            runc: PathBuf::from("runc"),
            criu: PathBuf::from("criu"),
            cuda_plugin: PathBuf::from("/usr/lib/criu/cuda_plugin.so"),
            cuda_checkpoint: PathBuf::from("cuda-checkpoint"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HostIdentity {
    pub machine_id: String,
    pub kernel_release: String,
    pub cpu_model: String,
    /// The CPU flags a restored process can depend on
    /// ([`crate::cpu::RELEVANT_CPU_FLAGS`]), sorted.
    #[serde(default)]
    pub cpu_flags: Vec<String>,
    pub runc_version: String,
    pub runc_sha256: String,
    pub criu_version: String,
    pub criu_sha256: String,
    pub cuda_plugin_sha256: String,
    /// `absent` on hosts without it (no GPU).
    #[serde(default)]
    pub cuda_checkpoint_sha256: String,
    pub shim_version: String,
    /// `name uuid driver` of each GPU the container uses (empty without one);
    /// filled by the shim from nvidia-smi when the spec has NVIDIA devices.
    /// Each is a [`crate::Gpu`] as it displays ([`crate::gpu::entries`]).
    #[serde(default)]
    pub gpus: Vec<String>,
}

impl HostIdentity {
    /// Reads this host's identity now.
    pub fn probe(tools: &Tools, shim_version: &str) -> Self {
        Self::probe_cached(tools, shim_version, None)
    }

    /// As [`HostIdentity::probe`], reusing the tool binaries' digests and
    /// versions recorded under `cache_dir` (the artifact root) while their
    /// files are unchanged ([`crate::tool_cache`]).
    pub fn probe_cached(tools: &Tools, shim_version: &str, cache_dir: Option<&Path>) -> Self {
        let mut cache = crate::tool_cache::ToolCache::load(cache_dir);
        let runc = which(&tools.runc);
        let criu = which(&tools.criu);
        let (runc_sha256, runc_version) =
            cache.identity(&runc, Some("--version"), file_sha256, first_line);
        let (criu_sha256, criu_version) =
            cache.identity(&criu, Some("--version"), file_sha256, first_line);
        let (cuda_plugin_sha256, _) =
            cache.identity(&tools.cuda_plugin, None, file_sha256, first_line);
        let (cuda_checkpoint_sha256, _) = cache.identity(
            &which(&tools.cuda_checkpoint),
            None,
            file_sha256,
            first_line,
        );
        cache.save();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        HostIdentity {
            machine_id: read_trimmed("/etc/machine-id"),
            kernel_release: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default(),
            cpu_flags: crate::cpu::cpu_flags(&cpuinfo),
            runc_version,
            runc_sha256,
            criu_version,
            criu_sha256,
            cuda_plugin_sha256,
            cuda_checkpoint_sha256,
            shim_version: shim_version.to_string(),
            gpus: Vec::new(),
        }
    }
}

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
    /// The containerd namespace the workload ran in: an artifact serves its
    /// own namespace only (a tenant boundary).
    pub namespace: String,
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
        let argv = redact_argv(
            key,
            process["args"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        );
        let mut env = BTreeMap::new();
        for e in process["env"].as_array().into_iter().flatten() {
            if let Some((name, value)) = e.as_str().and_then(|s| s.split_once('=')) {
                if !OWN_ENV.contains(&name) {
                    env.insert(name.to_string(), env_fingerprint(key, name, value));
                }
            }
        }
        let annotations = &spec["annotations"];
        let image = [
            "io.kubernetes.cri.image-name",
            "org.opencontainers.image.ref.name",
            "io.containerd.image.name",
        ]
        .iter()
        .find_map(|k| annotations[*k].as_str())
        .unwrap_or_default()
        .to_string();
        // Where, what and how, not from where: a bind source (an emptyDir,
        // a per-pod path) legitimately differs from one container to the next.
        let mounts: Vec<Value> = spec["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["destination"].as_str() != Some(ignore_mount))
            .map(|m| serde_json::json!({"destination": m["destination"], "type": m["type"], "options": m["options"]}))
            .collect();
        let linux = &spec["linux"];
        let namespaces: Vec<Value> = linux["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| serde_json::json!({"type": n["type"], "joined": n.get("path").is_some()}))
            .collect();
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
            ("mounts", serde_json::json!(mounts)),
            ("namespaces", Value::Array(namespaces)),
            (
                "masked_paths",
                serde_json::json!([linux["maskedPaths"], linux["readonlyPaths"]]),
            ),
            ("root_readonly", spec["root"]["readonly"].clone()),
        ] {
            security.insert(field.to_string(), security_value(field, &value));
        }
        Workload {
            argv,
            env,
            rootfs: spec["root"]["path"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            image,
            image_digest: String::new(),
            namespace: String::new(),
            security,
            fingerprint_key: key.id().to_string(),
        }
    }

    /// A short stable key of this identity, to name an artifact by.
    pub fn key(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("a workload serializes");
        sha256_hex(&bytes)[..24].to_string()
    }

    /// The fields that differ, as `workload.field: captured X, live Y`.
    /// Keyed with different keys, the keyed values cannot be compared: the
    /// key is named first, and the rest compared without them (variable
    /// names and unkeyed argv words still are).
    pub fn diff(&self, live: &Workload) -> Vec<String> {
        if self.fingerprint_key == live.fingerprint_key {
            return diff_json("workload", &to_map(self), &to_map(live));
        }
        let mut out = vec![format!(
            "workload.fingerprint_key: captured {:?}, live {:?} (environment and secret flags were fingerprinted with another key: every host of a fleet needs the same fleet_fingerprint_key)",
            self.fingerprint_key, live.fingerprint_key
        )];
        let (a, b) = (self.without_keyed_values(), live.without_keyed_values());
        out.extend(
            diff_json("workload", &to_map(&a), &to_map(&b))
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

/// HMAC(fingerprint key, name NUL value), hex: equal values give equal
/// fingerprints under one key, the value is never stored, and a guess cannot
/// be checked against a manifest without the key.
pub fn env_fingerprint(key: &FingerprintKey, name: &str, value: &str) -> String {
    let mut bytes = Vec::with_capacity(name.len() + value.len() + 1);
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(value.as_bytes());
    key.mac(&bytes)
}

/// Words that make a flag secret when they are a whole part of its name
/// (`--api-key`, `--hf-token`, `--db-password`, `--client_secret`), but not
/// `--max-num-batched-tokens` or `--ssl-keyfile`.
const SECRET_WORDS: &[&str] = &[
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
];
/// Flags argparse lets users abbreviate (`--api-k`): their prefixes count.
const ABBREVIATED: &[&str] = &["--api-key", "--hf-token"];

fn is_secret_flag(flag: &str) -> bool {
    let name = flag.trim_start_matches('-').to_ascii_lowercase();
    name.split(['-', '_'])
        .any(|part| SECRET_WORDS.contains(&part))
        || ABBREVIATED
            .iter()
            .any(|s| flag.len() > 5 && flag.len() >= s.len() - 3 && s.starts_with(flag))
}

/// What a redacted secret value starts with; its HMAC tag follows.
const REDACTED: &str = "***:";

/// Replaces the value of every secret flag (`--x VALUE` or `--x=VALUE`)
/// with `***:` and the first 16 hex digits of its HMAC with the
/// fingerprint key: a changed secret still changes the identity, and none
/// is stored.
pub fn redact_argv(key: &FingerprintKey, argv: Vec<String>) -> Vec<String> {
    let hide = |v: &str| format!("{REDACTED}{}", &key.mac(v.as_bytes())[..16]);
    let mut out = Vec::with_capacity(argv.len());
    let mut redact_next = false;
    for arg in argv {
        if redact_next {
            out.push(hide(&arg));
            redact_next = false;
            continue;
        }
        match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") && is_secret_flag(flag) => {
                out.push(format!("{flag}={}", hide(value)))
            }
            None if arg.starts_with("--") && is_secret_flag(&arg) => {
                redact_next = true;
                out.push(arg);
            }
            _ => out.push(arg),
        }
    }
    out
}

fn to_map<T: Serialize>(v: &T) -> serde_json::Map<String, Value> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

fn diff_json(
    prefix: &str,
    captured: &serde_json::Map<String, Value>,
    live: &serde_json::Map<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = captured.keys().chain(live.keys()).collect();
    for k in keys {
        let (a, b) = (
            captured.get(k).unwrap_or(&Value::Null),
            live.get(k).unwrap_or(&Value::Null),
        );
        if a == b {
            continue;
        }
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                out.extend(diff_json(&format!("{prefix}.{k}"), a, b))
            }
            _ => out.push(format!(
                "{prefix}.{k}: captured {}, live {}",
                short(a),
                short(b)
            )),
        }
    }
    out
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 120 {
        format!("{}...", &s[..117])
    } else {
        s
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn which(bin: &Path) -> PathBuf {
    if bin.is_absolute() {
        return bin.to_path_buf();
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| bin.to_path_buf())
}

/// How long a tool's `--version` may take: a wedged binary costs a capture
/// or the `fingerprint` hook this much, its version `absent` (never cached).
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

fn first_line(bin: &Path, arg: &str) -> String {
    // Only what it printed counts: a subreaper (the shim reaps every
    // child) may have collected its exit status already.
    crate::spawn::run(Command::new(bin).arg(arg), VERSION_TIMEOUT)
        .ok()
        .and_then(|ran| ran.stdout.lines().next().map(str::to_string))
        .unwrap_or_else(|| "absent".to_string())
}

fn file_sha256(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| sha256_hex(&b))
        .unwrap_or_else(|_| "absent".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn test_key() -> (tempfile::TempDir, FingerprintKey) {
        let dir = tempfile::tempdir().unwrap();
        let key = FingerprintKey::load_or_create(dir.path(), None).unwrap();
        (dir, key)
    }

    fn fleet_key(dir: &Path, byte: u8) -> FingerprintKey {
        let path = dir.join(format!("fleet-{byte}.key"));
        crate::layout::write_synced(&path, &[byte; 32]).unwrap();
        FingerprintKey::fleet(&path).unwrap()
    }

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
    fn secrets_in_argv_are_redacted_by_name_and_keyed() {
        let (_d, key) = test_key();
        let argv = [
            "serve",
            "--api-key",
            "s3cret",
            "--hf-token=hf_x",
            "--api-k",
            "abbr",
            "--db_password",
            "pw",
            "--client-secret=cs",
            "--max-num-batched-tokens",
            "8192",
            "--ssl-keyfile",
            "/k.pem",
            "--port",
            "8000",
        ]
        .map(String::from)
        .to_vec();
        let r = redact_argv(&key, argv.clone());
        let hidden = |v: &str| format!("***:{}", &key.mac(v.as_bytes())[..16]);
        assert_eq!(
            r,
            [
                "serve".to_string(),
                "--api-key".into(),
                hidden("s3cret"),
                format!("--hf-token={}", hidden("hf_x")),
                "--api-k".into(),
                hidden("abbr"),
                "--db_password".into(),
                hidden("pw"),
                format!("--client-secret={}", hidden("cs")),
                "--max-num-batched-tokens".into(),
                "8192".into(),
                "--ssl-keyfile".into(),
                "/k.pem".into(),
                "--port".into(),
                "8000".into(),
            ]
        );
        for secret in ["s3cret", "hf_x", "abbr", "pw", "cs"] {
            assert!(!r.iter().any(|a| a.ends_with(secret)), "{secret}: {r:?}");
        }
        // Another host's key gives other tags: nothing to compare offline.
        let (_d2, other) = test_key();
        assert_ne!(redact_argv(&other, argv), r);
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
        assert!(
            diff.len() == 1 && diff[0].starts_with("workload.security.mounts"),
            "{diff:?}"
        );
        for (path, value, field) in [
            (
                &["process", "user"][..],
                json!({"uid": 0, "gid": 0}),
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
        assert!(
            diff[0].contains("1000") && diff[0].contains("\"uid\\\":0"),
            "{diff:?}"
        );
        assert!(captured.security["seccomp"].starts_with("sha256:"));
    }

    #[test]
    fn host_differences_name_field_and_values() {
        let a = HostIdentity::probe(&Tools::default(), "0.1.0");
        assert!(!a.cpu_flags.is_empty(), "this host's CPU has flags");
        let mut b = a.clone();
        b.kernel_release = "9.9.9".into();
        let d = crate::compat::incompatibilities(&a, &b);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].contains("host.kernel_release") && d[0].contains("9.9.9"),
            "{d:?}"
        );
    }
}
