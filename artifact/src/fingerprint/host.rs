//! This host's identity: machine id, kernel, CPU, and the digests and
//! versions of the tools a restore runs, probed now or from the tool cache.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
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
        .map(|b| hex(&Sha256::digest(b)))
        .unwrap_or_else(|_| "absent".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
