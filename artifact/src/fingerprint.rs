//! What an artifact is valid for: the host it was made on and the workload
//! it captured. At restore both are taken again and compared field by field;
//! every difference is named with its captured and live value (or digest).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::key::hex;

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
    #[serde(default)]
    pub gpus: Vec<String>,
}

impl HostIdentity {
    /// Reads this host's identity now.
    pub fn probe(tools: &Tools, shim_version: &str) -> Self {
        let runc = which(&tools.runc);
        let criu = which(&tools.criu);
        HostIdentity {
            machine_id: read_trimmed("/etc/machine-id"),
            kernel_release: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu_model: std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|c| {
                    c.lines()
                        .find(|l| l.starts_with("model name"))
                        .and_then(|l| l.split_once(':'))
                        .map(|(_, v)| v.trim().to_string())
                })
                .unwrap_or_default(),
            runc_version: first_line(&runc, "--version"),
            runc_sha256: file_sha256(&runc),
            criu_version: first_line(&criu, "--version"),
            criu_sha256: file_sha256(&criu),
            cuda_plugin_sha256: file_sha256(&tools.cuda_plugin),
            cuda_checkpoint_sha256: file_sha256(&which(&tools.cuda_checkpoint)),
            shim_version: shim_version.to_string(),
            gpus: Vec::new(),
        }
    }

    /// The fields that differ, as `field: captured X, live Y`.
    pub fn diff(&self, live: &HostIdentity) -> Vec<String> {
        diff_json("host", &to_map(self), &to_map(live))
    }
}

/// The captured workload: argv with secrets redacted, environment as
/// name-bound fingerprints (never values), the root filesystem, and one
/// digest per security-relevant part of the OCI spec.
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
    pub security: BTreeMap<String, String>,
}

/// Environment variables vsnap itself sets: not part of the identity.
const OWN_ENV: &[&str] = &["VSNAP_SNAPSHOT_CONFIG"];

impl Workload {
    /// From an OCI spec (as JSON). `ignore_mount` is vsnap's own control-dir
    /// mount, whose source differs per container.
    pub fn from_spec(spec: &Value, ignore_mount: &str) -> Self {
        let process = &spec["process"];
        let argv = redact_argv(
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
                    env.insert(name.to_string(), env_fingerprint(name, value));
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
            security.insert(
                field.to_string(),
                sha256_hex(&serde_json::to_vec(&value).unwrap_or_default()),
            );
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
            security,
        }
    }

    /// A short stable key of this identity, to name an artifact by.
    pub fn key(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("a workload serializes");
        sha256_hex(&bytes)[..24].to_string()
    }

    pub fn diff(&self, live: &Workload) -> Vec<String> {
        diff_json("workload", &to_map(self), &to_map(live))
    }
}

/// sha256(name NUL value), hex: equal values give equal fingerprints, and the
/// value itself is never stored.
pub fn env_fingerprint(name: &str, value: &str) -> String {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0u8]);
    h.update(value.as_bytes());
    hex(&h.finalize())
}

const SECRET_FLAGS: &[&str] = &["--api-key", "--hf-token"];

/// Replaces the values of `--api-key` / `--hf-token` (and unambiguous
/// abbreviations such as `--api-k`, as argparse accepts) with `***`.
pub fn redact_argv(argv: Vec<String>) -> Vec<String> {
    let is_secret = |flag: &str| {
        SECRET_FLAGS
            .iter()
            .any(|s| flag.len() >= s.len() - 3 && s.starts_with(flag) && flag.len() > 5)
    };
    let mut out = Vec::with_capacity(argv.len());
    let mut redact_next = false;
    for arg in argv {
        if redact_next {
            out.push("***".to_string());
            redact_next = false;
            continue;
        }
        match arg.split_once('=') {
            Some((flag, _)) if flag.starts_with("--") && is_secret(flag) => {
                out.push(format!("{flag}=***"))
            }
            None if arg.starts_with("--") && is_secret(&arg) => {
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

fn first_line(bin: &Path, arg: &str) -> String {
    let run = || -> Option<String> {
        let mut child = Command::new(bin)
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut out = String::new();
        child.stdout.take()?.read_to_string(&mut out).ok()?;
        // Only what it printed counts: a subreaper (the shim reaps every
        // child) may have collected its exit status already.
        let _ = child.wait();
        out.lines().next().map(str::to_string)
    };
    run().unwrap_or_else(|| "absent".to_string())
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

    #[test]
    fn secrets_in_argv_are_redacted() {
        let argv = [
            "serve",
            "--api-key",
            "s3cret",
            "--hf-token=hf_x",
            "--api-k",
            "abbr",
            "--port",
            "8000",
        ]
        .map(String::from)
        .to_vec();
        let r = redact_argv(argv);
        assert_eq!(
            r,
            [
                "serve",
                "--api-key",
                "***",
                "--hf-token=***",
                "--api-k",
                "***",
                "--port",
                "8000"
            ]
        );
        assert!(!r
            .iter()
            .any(|a| a.contains("s3cret") || a.contains("hf_x") || a.contains("abbr")));
    }

    #[test]
    fn env_is_fingerprinted_never_stored() {
        let spec = json!({"process": {"args": ["x"], "env": ["HF_TOKEN=hf_secret", "VSNAP_SNAPSHOT_CONFIG={}"]}, "root": {"path": "rootfs"}});
        let w = Workload::from_spec(&spec, "/run/vsnap/control");
        let text = serde_json::to_string(&w).unwrap();
        assert!(!text.contains("hf_secret"), "{text}");
        assert_eq!(w.env.len(), 1, "vsnap's own variable is not identity");
        assert_eq!(w.env["HF_TOKEN"], env_fingerprint("HF_TOKEN", "hf_secret"));
    }

    #[test]
    fn every_security_field_change_is_named() {
        let base = json!({
            "process": {"args": ["x"], "user": {"uid": 1000, "gid": 1000}, "capabilities": {"bounding": []}, "noNewPrivileges": true},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/run/vsnap/control", "source": "/a"}],
            "linux": {"namespaces": [{"type": "pid"}]},
        });
        let captured = Workload::from_spec(&base, "/run/vsnap/control");
        let mut same = base.clone();
        same["mounts"][0]["source"] = json!("/b");
        assert!(
            captured
                .diff(&Workload::from_spec(&same, "/run/vsnap/control"))
                .is_empty(),
            "the control mount is not identity"
        );
        // A bind's source may differ; its destination, type and options may not.
        let mut with_shm = base.clone();
        with_shm["mounts"] = json!([{"destination": "/dev/shm", "type": "bind", "source": "/pod-a", "options": ["rbind", "rw"]}]);
        let shm = Workload::from_spec(&with_shm, "/run/vsnap/control");
        let mut other_pod = with_shm.clone();
        other_pod["mounts"][0]["source"] = json!("/pod-b");
        assert!(shm
            .diff(&Workload::from_spec(&other_pod, "/run/vsnap/control"))
            .is_empty());
        let mut read_only = with_shm.clone();
        read_only["mounts"][0]["options"] = json!(["rbind", "ro"]);
        let diff = shm.diff(&Workload::from_spec(&read_only, "/run/vsnap/control"));
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
            let diff = captured.diff(&Workload::from_spec(&live, "/run/vsnap/control"));
            assert_eq!(diff.len(), 1, "{field}: {diff:?}");
            assert!(diff[0].starts_with(field), "{field}: {diff:?}");
        }
    }

    #[test]
    fn host_differences_name_field_and_values() {
        let a = HostIdentity::probe(&Tools::default(), "0.1.0");
        let mut b = a.clone();
        b.kernel_release = "9.9.9".into();
        let d = a.diff(&b);
        assert_eq!(d.len(), 1);
        assert!(
            d[0].contains("host.kernel_release") && d[0].contains("9.9.9"),
            "{d:?}"
        );
    }
}
