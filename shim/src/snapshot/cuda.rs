//! CUDA preflight for snapshot plans on GPU hosts.
//!
//! A container that uses an NVIDIA GPU can only be captured and restored
//! when CRIU has its CUDA plugin, NVIDIA's `cuda-checkpoint` utility is there
//! for the plugin to call, and the driver is new enough. This module checks
//! those conditions and says exactly which one is missing, before CRIU runs
//! and fails with a less helpful message deep in a dump log.
//!
//! It also answers three questions about a container:
//! * does its OCI spec give it NVIDIA devices ([`spec_nvidia_devices`]);
//! * which of its processes hold NVIDIA device files open ([`cuda_holders`]);
//! * do they, together, use more than one GPU ([`check_single_gpu`]), which
//!   vsnap refuses (multi-process NCCL cannot be checkpointed).
//!
//! Driver requirements (NVIDIA's cuda-checkpoint): a driver of major version
//! [`MIN_DRIVER_SINGLE_PROCESS`] (555) or newer checkpoints one CUDA process;
//! a tree of several CUDA processes (an engine with worker processes) needs
//! [`MIN_DRIVER_PROCESS_TREE`] (570). The caller picks the minimum.
//!
//! Pure checks: nothing here changes the host or the container.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The file CRIU loads from its plugin folder for CUDA support.
pub const PLUGIN_FILE: &str = "cuda_plugin.so";
/// CRIU's compiled-in plugin folder (where `scripts/setup.sh` installs the plugin).
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/criu";
/// Oldest driver major version whose cuda-checkpoint handles one process.
pub const MIN_DRIVER_SINGLE_PROCESS: u32 = 555;
/// Oldest driver major version whose cuda-checkpoint handles process trees.
pub const MIN_DRIVER_PROCESS_TREE: u32 = 570;
/// What nvidia-smi is asked for (one CSV line per GPU).
pub const NVIDIA_SMI_ARGS: [&str; 2] = [
    "--query-gpu=name,uuid,driver_version",
    "--format=csv,noheader",
];
/// How long nvidia-smi may take (it can hang on a wedged driver).
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the CUDA tooling lives. A path without a `/` is looked up on PATH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaTools {
    /// CRIU's plugin folder; must hold [`PLUGIN_FILE`].
    pub plugin_dir: PathBuf,
    /// NVIDIA's cuda-checkpoint. CRIU's plugin runs it from CRIU's PATH, so
    /// the default (a bare name) checks the same PATH the shim passes on.
    pub cuda_checkpoint: PathBuf,
    pub nvidia_smi: PathBuf,
}

impl Default for CudaTools {
    fn default() -> Self {
        Self {
            plugin_dir: PathBuf::from(DEFAULT_PLUGIN_DIR),
            cuda_checkpoint: PathBuf::from("cuda-checkpoint"),
            nvidia_smi: PathBuf::from("nvidia-smi"),
        }
    }
}

/// The host's GPUs as nvidia-smi reports them, for the manifest's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuIdentity {
    pub gpus: Vec<Gpu>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// e.g. `NVIDIA H200`.
    pub name: String,
    /// e.g. `GPU-5f1c...`.
    pub uuid: String,
    /// The driver version, e.g. `570.124.06`.
    pub driver: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("preflight: CUDA plugin not found: {} does not exist (set cuda_plugin_dir in the runtime config)", .path.display())]
    PluginNotFound { path: PathBuf },
    #[error("preflight: CUDA plugin {} is not a regular file", .path.display())]
    PluginNotAFile { path: PathBuf },
    #[error("preflight: cuda-checkpoint not found at {} (install NVIDIA's cuda-checkpoint, or set cuda_checkpoint in the runtime config)", .path.display())]
    CudaCheckpointNotFound { path: PathBuf },
    #[error("preflight: cuda-checkpoint not found on PATH (searched {searched}; install NVIDIA's cuda-checkpoint into one of these folders, or set cuda_checkpoint in the runtime config)")]
    CudaCheckpointNotOnPath { searched: String },
    #[error("preflight: cuda-checkpoint at {} is not an executable file (mode {mode:04o})", .path.display())]
    CudaCheckpointNotExecutable { path: PathBuf, mode: u32 },
    #[error("preflight: nvidia-smi could not be run as {}: {source} (is the NVIDIA driver installed?)", .path.display())]
    NvidiaSmiNotRunnable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("preflight: nvidia-smi did not answer within {}s (the driver may be wedged)", .timeout.as_secs())]
    NvidiaSmiTimeout { timeout: Duration },
    #[error("preflight: nvidia-smi failed ({status}): {output}")]
    NvidiaSmiFailed { status: String, output: String },
    #[error("preflight: nvidia-smi output line {line:?} is not `name, uuid, driver_version`")]
    NvidiaSmiOutput { line: String },
    #[error("preflight: nvidia-smi lists no GPU")]
    NoGpu,
    #[error("preflight: NVIDIA driver {version} is older than {min} (cuda-checkpoint needs >= {MIN_DRIVER_SINGLE_PROCESS}; process trees need >= {MIN_DRIVER_PROCESS_TREE})")]
    DriverTooOld { version: String, min: u32 },
    #[error("preflight: the container's processes use more than one GPU ({}): {}; vsnap captures single-GPU engines only (cuda-checkpoint does not support multi-process NCCL)", .devices.join(", "), describe_holders(.holders))]
    MultipleGpus {
        devices: Vec<String>,
        holders: Vec<(i32, Vec<String>)>,
    },
}

impl From<CudaError> for crate::error::Error {
    fn from(e: CudaError) -> Self {
        crate::error::Error::FailedPrecondition(e.to_string())
    }
}

fn describe_holders(holders: &[(i32, Vec<String>)]) -> String {
    holders
        .iter()
        .map(|(pid, devs)| format!("pid {pid} holds {}", devs.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks that the CUDA plugin, cuda-checkpoint and a driver of at least
/// `min_driver_major` are there, and returns the GPUs nvidia-smi lists.
/// Pass [`MIN_DRIVER_SINGLE_PROCESS`] for a single CUDA process and
/// [`MIN_DRIVER_PROCESS_TREE`] when several processes of the tree use CUDA.
pub fn preflight(tools: &CudaTools, min_driver_major: u32) -> Result<GpuIdentity, CudaError> {
    preflight_with_timeout(tools, min_driver_major, NVIDIA_SMI_TIMEOUT)
}

fn preflight_with_timeout(
    tools: &CudaTools,
    min_driver_major: u32,
    timeout: Duration,
) -> Result<GpuIdentity, CudaError> {
    check_plugin(&tools.plugin_dir)?;
    check_cuda_checkpoint(&tools.cuda_checkpoint)?;
    let output = run_nvidia_smi(&tools.nvidia_smi, timeout)?;
    let identity = parse_gpus(&output)?;
    for gpu in &identity.gpus {
        match driver_major(&gpu.driver) {
            Some(major) if major >= min_driver_major => {}
            _ => {
                return Err(CudaError::DriverTooOld {
                    version: gpu.driver.clone(),
                    min: min_driver_major,
                })
            }
        }
    }
    Ok(identity)
}

fn check_plugin(dir: &Path) -> Result<(), CudaError> {
    let path = dir.join(PLUGIN_FILE);
    match std::fs::metadata(&path) {
        Err(_) => Err(CudaError::PluginNotFound { path }),
        Ok(m) if !m.is_file() => Err(CudaError::PluginNotAFile { path }),
        Ok(_) => Ok(()),
    }
}

fn check_cuda_checkpoint(path: &Path) -> Result<(), CudaError> {
    let is_bare_name = path.components().count() == 1 && !path.is_absolute();
    if !is_bare_name {
        let m = std::fs::metadata(path).map_err(|_| CudaError::CudaCheckpointNotFound {
            path: path.to_path_buf(),
        })?;
        let mode = m.permissions().mode() & 0o7777;
        if !m.is_file() || mode & 0o111 == 0 {
            return Err(CudaError::CudaCheckpointNotExecutable {
                path: path.to_path_buf(),
                mode,
            });
        }
        return Ok(());
    }
    let search = std::env::var("PATH").unwrap_or_default();
    let mut not_executable = None;
    for dir in search.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(path);
        if let Ok(m) = std::fs::metadata(&candidate) {
            let mode = m.permissions().mode() & 0o7777;
            if m.is_file() && mode & 0o111 != 0 {
                return Ok(());
            }
            not_executable.get_or_insert((candidate, mode));
        }
    }
    match not_executable {
        Some((path, mode)) => Err(CudaError::CudaCheckpointNotExecutable { path, mode }),
        None => Err(CudaError::CudaCheckpointNotOnPath {
            searched: if search.is_empty() {
                "an empty PATH".to_string()
            } else {
                search
            },
        }),
    }
}

/// Runs nvidia-smi's GPU query; its stdout on success.
fn run_nvidia_smi(path: &Path, timeout: Duration) -> Result<String, CudaError> {
    let ran = run_tool(path, &NVIDIA_SMI_ARGS, timeout).map_err(|e| match e {
        ToolError::Spawn(source) | ToolError::Wait(source) => CudaError::NvidiaSmiNotRunnable {
            path: path.to_path_buf(),
            source,
        },
        ToolError::Timeout => CudaError::NvidiaSmiTimeout { timeout },
    })?;
    match ran.failure() {
        Some((status, output)) => Err(CudaError::NvidiaSmiFailed { status, output }),
        None => Ok(ran.stdout),
    }
}

/// What a tool printed, and its status unless the shim's reaper took it.
struct Ran {
    status: Option<std::process::ExitStatus>,
    stdout: String,
    stderr: String,
}

enum ToolError {
    Spawn(std::io::Error),
    Wait(std::io::Error),
    Timeout,
}

impl Ran {
    /// `(status, last line of its output)` when it failed. With the status
    /// lost (reaped by the shim), output on stderr or none at all counts as
    /// a failure.
    fn failure(&self) -> Option<(String, String)> {
        let status = match self.status {
            Some(status) => (!status.success()).then(|| status.to_string()),
            None => (self.stdout.trim().is_empty() || !self.stderr.trim().is_empty())
                .then(|| "unknown (reaped by the shim)".to_string()),
        }?;
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let output = text
            .trim()
            .lines()
            .last()
            .unwrap_or("no output")
            .to_string();
        Some((status, output))
    }
}

/// Runs `path args` with its output captured, killed past `timeout`.
fn run_tool(path: &Path, args: &[&str], timeout: Duration) -> Result<Ran, ToolError> {
    let mut child = spawn_retrying(
        Command::new(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .map_err(ToolError::Spawn)?;
    // Readers on threads, so a chatty child never blocks on a full pipe.
    let readers = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .map(|stream| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(s) = stream {
                let _ = s.take(1 << 20).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::Timeout);
            }
            // The shim's reaper (waitpid(-1)) collected it first: it has
            // exited, its status is lost, its output tells.
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => break None,
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::Wait(source));
            }
        }
    };
    let [stdout, stderr] = readers.map(|r| r.join().unwrap_or_default());
    Ok(Ran {
        status,
        stdout,
        stderr,
    })
}

/// How long one cuda-checkpoint query may take.
pub const CUDA_CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(30);

/// Asks cuda-checkpoint whether `pid` is a CUDA process: its restore
/// thread's id when it is, else cuda-checkpoint's own message (what the CUDA
/// plugin asks first of every process it would checkpoint).
pub fn cuda_restore_tid(cuda_checkpoint: &Path, pid: i32) -> Result<i32, String> {
    let pid_text = pid.to_string();
    let args = ["--get-restore-tid", "--pid", pid_text.as_str()];
    let ran = run_tool(cuda_checkpoint, &args, CUDA_CHECKPOINT_TIMEOUT).map_err(|e| match e {
        ToolError::Spawn(e) | ToolError::Wait(e) => {
            format!("{}: {e}", cuda_checkpoint.display())
        }
        ToolError::Timeout => format!(
            "{} did not answer within {}s",
            cuda_checkpoint.display(),
            CUDA_CHECKPOINT_TIMEOUT.as_secs()
        ),
    })?;
    if let Some((status, output)) = ran.failure() {
        return Err(format!("{output} ({status})"));
    }
    ran.stdout
        .trim()
        .parse()
        .map_err(|_| format!("unexpected answer {:?}", ran.stdout.trim()))
}

/// The state cuda-checkpoint reports for `pid` (running, locked,
/// checkpointed), or why it could not tell.
pub fn cuda_state(cuda_checkpoint: &Path, pid: i32) -> Result<String, String> {
    let pid_text = pid.to_string();
    let args = ["--get-state", "--pid", pid_text.as_str()];
    let ran = run_tool(cuda_checkpoint, &args, CUDA_CHECKPOINT_TIMEOUT)
        .map_err(|_| format!("{} --get-state failed to run", cuda_checkpoint.display()))?;
    match ran.failure() {
        Some((status, output)) => Err(format!("{output} ({status})")),
        None => Ok(ran.stdout.trim().to_string()),
    }
}

/// Best effort after a dump that failed or was killed: every process of
/// `pids` that cuda-checkpoint reports locked or checkpointed is restored
/// and unlocked, so the engine's GPU work goes on. Returns what it did.
pub fn resume_gpu_best_effort(cuda_checkpoint: &Path, pids: &[i32]) -> Vec<String> {
    let mut done = Vec::new();
    for &pid in pids {
        let Ok(state) = cuda_state(cuda_checkpoint, pid) else {
            continue;
        };
        let actions: &[&str] = match state.as_str() {
            s if s.starts_with("checkpointed") => &["restore", "unlock"],
            s if s.starts_with("locked") => &["unlock"],
            _ => &[],
        };
        for action in actions {
            let pid_text = pid.to_string();
            let args = ["--action", action, "--pid", pid_text.as_str()];
            let ok = run_tool(cuda_checkpoint, &args, CUDA_CHECKPOINT_TIMEOUT)
                .is_ok_and(|r| r.failure().is_none());
            done.push(format!(
                "pid {pid}: {action} {}",
                if ok { "done" } else { "failed" }
            ));
        }
    }
    done
}

/// Spawns, retrying briefly on ETXTBSY (an executable just written by this
/// process may still be open for writing in a child forked meanwhile).
fn spawn_retrying(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Parses `name, uuid, driver_version` lines (empty lines ignored). The name
/// is everything before the last two commas.
pub fn parse_gpus(output: &str) -> Result<GpuIdentity, CudaError> {
    let mut gpus = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || CudaError::NvidiaSmiOutput {
            line: line.to_string(),
        };
        let mut fields = line.rsplitn(3, ',').map(str::trim);
        let (Some(driver), Some(uuid), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(bad());
        };
        if name.is_empty() || !uuid.starts_with("GPU-") || driver_major(driver).is_none() {
            return Err(bad());
        }
        gpus.push(Gpu {
            name: name.to_string(),
            uuid: uuid.to_string(),
            driver: driver.to_string(),
        });
    }
    if gpus.is_empty() {
        return Err(CudaError::NoGpu);
    }
    Ok(GpuIdentity { gpus })
}

/// The major version of a driver version string: `570` for `570.124.06`.
pub fn driver_major(version: &str) -> Option<u32> {
    let major = version.split('.').next()?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    major.parse().ok()
}

fn is_nvidia_path(p: &str) -> bool {
    p.starts_with("/dev/nvidia")
}

/// The NVIDIA device paths an OCI spec gives its container: entries of
/// `linux.devices` and the destinations of mounts whose source or
/// destination is a `/dev/nvidia*` path (how CDI and device plugins add
/// GPUs). Sorted, without duplicates; empty: no NVIDIA device in the spec.
///
/// A prestart hook of the legacy NVIDIA container runtime adds devices only
/// when the container is created and they do not show here; see
/// [`spec_nvidia_hook`].
pub fn spec_nvidia_devices(spec: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let devices = spec
        .pointer("/linux/devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for d in devices {
        if let Some(p) = d.get("path").and_then(Value::as_str) {
            if is_nvidia_path(p) {
                out.push(p.to_string());
            }
        }
    }
    let mounts = spec
        .get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for m in mounts {
        let dest = m.get("destination").and_then(Value::as_str);
        let src = m.get("source").and_then(Value::as_str);
        if dest.is_some_and(is_nvidia_path) || src.is_some_and(is_nvidia_path) {
            if let Some(dest) = dest {
                out.push(dest.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// An OCI hook in the spec that gives the container GPUs, if any, as
/// `stage hook path args...`: the NVIDIA container runtime hook, or the
/// prestart hook `ctr run --gpus` adds (the containerd binary running
/// `containerd oci-hook -- nvidia-container-cli ... configure`). Such a hook
/// adds devices and mounts at create time, invisible to
/// [`spec_nvidia_devices`], unknown to CRIU, and runc runs it again at
/// restore.
pub fn spec_nvidia_hook(spec: &Value) -> Option<String> {
    let hooks = spec.get("hooks")?.as_object()?;
    let is_nvidia = |p: &str| {
        Path::new(p)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("nvidia-container"))
    };
    for (stage, list) in hooks {
        for hook in list.as_array().into_iter().flatten() {
            let path = hook.get("path").and_then(Value::as_str).unwrap_or("");
            let args: Vec<&str> = hook
                .get("args")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if is_nvidia(path) || args.iter().any(|a| is_nvidia(a)) {
                let shown: Vec<&str> = args.iter().skip(1).take(3).copied().collect();
                return Some(
                    format!("{stage} hook {path} {}", shown.join(" "))
                        .trim()
                        .to_string(),
                );
            }
        }
    }
    None
}

/// Refuses a snapshot container whose GPUs come from an OCI hook
/// ([`spec_nvidia_hook`]), pointing at CDI, which puts the devices and
/// mounts in the spec itself where CRIU and runc see them.
pub fn check_no_gpu_hook(spec: &Value) -> Result<(), String> {
    match spec_nvidia_hook(spec) {
        None => Ok(()),
        Some(hook) => Err(format!(
            "the container gets its GPUs from an OCI hook ({hook}; `ctr run --gpus` and the legacy NVIDIA runtime add one): \
             the devices and mounts it makes are unknown to CRIU and runc would run it again at restore; \
             give the container its GPUs through CDI instead (`nvidia-ctk cdi generate`, then a CDI device \
             such as nvidia.com/gpu=0; docs/gpu-hosts.md)"
        )),
    }
}

/// The GPUs the container was given, of those nvidia-smi lists: its spec's
/// `/dev/nvidiaN` devices are matched to GPU UUIDs through the driver's
/// `<proc_root>/driver/nvidia/gpus/*/information` ("Device Minor",
/// "GPU UUID"). A spec without a GPU device node keeps the whole list.
pub fn container_gpus(
    host: &GpuIdentity,
    devices: &[String],
    proc_root: &Path,
) -> Result<Vec<Gpu>, String> {
    let minors: Vec<u32> = devices.iter().filter_map(|d| gpu_device_index(d)).collect();
    if minors.is_empty() {
        return Ok(host.gpus.clone());
    }
    let mut by_minor: Vec<(u32, String)> = Vec::new();
    let dir = proc_root.join("driver/nvidia/gpus");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path().join("information")) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim_start().strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        if let (Some(minor), Some(uuid)) = (field("Device Minor"), field("GPU UUID")) {
            if let Ok(minor) = minor.parse() {
                by_minor.push((minor, uuid));
            }
        }
    }
    let mut out = Vec::new();
    for minor in minors {
        let uuid = by_minor
            .iter()
            .find(|(m, _)| *m == minor)
            .map(|(_, u)| u)
            .ok_or_else(|| {
                format!(
                    "/dev/nvidia{minor}: no GPU with device minor {minor} under {}",
                    dir.display()
                )
            })?;
        let gpu = host.gpus.iter().find(|g| &g.uuid == uuid).ok_or_else(|| {
            format!("/dev/nvidia{minor} is GPU {uuid}, which nvidia-smi does not list")
        })?;
        if !out.contains(gpu) {
            out.push(gpu.clone());
        }
    }
    Ok(out)
}

/// The processes of `pids` that hold `/dev/nvidia*` files open (read from
/// `/proc/PID/fd`), each with its sorted device paths as the process sees
/// them. Processes that exited meanwhile or hold none are left out.
pub fn cuda_holders(pids: &[i32]) -> Vec<(i32, Vec<String>)> {
    holders_in(Path::new("/proc"), pids)
}

fn holders_in(proc_root: &Path, pids: &[i32]) -> Vec<(i32, Vec<String>)> {
    let mut out = Vec::new();
    for &pid in pids {
        let Ok(entries) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else {
            continue;
        };
        let mut devices: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let target = std::fs::read_link(e.path()).ok()?;
                let target = target.to_str()?;
                is_nvidia_path(target).then(|| target.to_string())
            })
            .collect();
        if devices.is_empty() {
            continue;
        }
        devices.sort();
        devices.dedup();
        out.push((pid, devices));
    }
    out
}

/// `Some(N)` for a GPU device node `/dev/nvidiaN` (not nvidiactl, nvidia-uvm,
/// nvidia-modeset or nvidia-caps).
pub fn gpu_device_index(path: &str) -> Option<u32> {
    let n = path.strip_prefix("/dev/nvidia")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Refuses a tree whose processes, together, hold more than one GPU device
/// (`/dev/nvidiaN`), naming each process and the devices it holds.
pub fn check_single_gpu(holders: &[(i32, Vec<String>)]) -> Result<(), CudaError> {
    let mut gpus: Vec<String> = holders
        .iter()
        .flat_map(|(_, devs)| devs.iter())
        .filter(|d| gpu_device_index(d).is_some())
        .cloned()
        .collect();
    gpus.sort_by_key(|d| gpu_device_index(d));
    gpus.dedup();
    if gpus.len() <= 1 {
        return Ok(());
    }
    let holders = holders
        .iter()
        .filter_map(|(pid, devs)| {
            let own: Vec<String> = devs
                .iter()
                .filter(|d| gpu_device_index(d).is_some())
                .cloned()
                .collect();
            (!own.is_empty()).then_some((*pid, own))
        })
        .collect();
    Err(CudaError::MultipleGpus {
        devices: gpus,
        holders,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;

    const H200: &str = "NVIDIA H200, GPU-5f1c2a3b-0000-1111-2222-333344445555, 570.124.06";

    /// A folder with a plugin, an executable cuda-checkpoint and a fake
    /// nvidia-smi that prints `gpus` (only when asked the expected query)
    /// and exits with `code`.
    fn fake_host(gpus: &str, code: i32) -> (tempfile::TempDir, CudaTools) {
        let dir = tempfile::tempdir().unwrap();
        let plugin_dir = dir.path().join("criu");
        fs::create_dir(&plugin_dir).unwrap();
        fs::write(plugin_dir.join(PLUGIN_FILE), b"not really a plugin").unwrap();
        let cuda_checkpoint = dir.path().join("cuda-checkpoint");
        write_script(&cuda_checkpoint, "exit 0");
        let nvidia_smi = dir.path().join("nvidia-smi");
        let expected = NVIDIA_SMI_ARGS.join(" ");
        write_script(
            &nvidia_smi,
            &format!(
                "[ \"$*\" = \"{expected}\" ] || {{ echo \"unexpected arguments: $*\" >&2; exit 2; }}\n\
                 printf '%s\\n' \"{gpus}\"\nexit {code}"
            ),
        );
        let tools = CudaTools {
            plugin_dir,
            cuda_checkpoint,
            nvidia_smi,
        };
        (dir, tools)
    }

    fn write_script(path: &Path, body: &str) {
        fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn happy_path_returns_every_gpu() {
        let two =
            format!("{H200}\nNVIDIA H200, GPU-aaaaaaaa-0000-1111-2222-333344445555, 570.124.06");
        let (_dir, tools) = fake_host(&two, 0);
        let id = preflight(&tools, MIN_DRIVER_PROCESS_TREE).unwrap();
        assert_eq!(id.gpus.len(), 2);
        assert_eq!(
            id.gpus[0],
            Gpu {
                name: "NVIDIA H200".into(),
                uuid: "GPU-5f1c2a3b-0000-1111-2222-333344445555".into(),
                driver: "570.124.06".into(),
            }
        );
        // The identity round-trips for the manifest.
        let text = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<GpuIdentity>(&text).unwrap(), id);
    }

    #[test]
    fn an_old_driver_is_refused_naming_both_minimums() {
        let (_dir, tools) = fake_host(
            "NVIDIA GeForce RTX 4090, GPU-01234567-89ab-cdef-0123-456789abcdef, 550.54",
            0,
        );
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "preflight: NVIDIA driver 550.54 is older than 555 (cuda-checkpoint needs >= 555; process trees need >= 570)"
        );
    }

    #[test]
    fn a_single_process_driver_is_too_old_for_a_tree() {
        let (_dir, tools) = fake_host(
            "NVIDIA L4, GPU-01234567-89ab-cdef-0123-456789abcdef, 560.35.03",
            0,
        );
        preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap();
        let e = preflight(&tools, MIN_DRIVER_PROCESS_TREE).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("preflight: NVIDIA driver 560.35.03 is older than 570 "),
            "{e}"
        );
    }

    #[test]
    fn a_missing_plugin_dir_names_the_plugin_path() {
        let (dir, mut tools) = fake_host(H200, 0);
        tools.plugin_dir = dir.path().join("no-such-dir");
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "preflight: CUDA plugin not found: {}/no-such-dir/cuda_plugin.so does not exist (set cuda_plugin_dir in the runtime config)",
                dir.path().display()
            )
        );
    }

    #[test]
    fn a_plugin_dir_without_the_plugin_is_refused() {
        let (_dir, tools) = fake_host(H200, 0);
        fs::remove_file(tools.plugin_dir.join(PLUGIN_FILE)).unwrap();
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert!(matches!(e, CudaError::PluginNotFound { .. }), "{e}");
        fs::create_dir(tools.plugin_dir.join(PLUGIN_FILE)).unwrap();
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert!(e.to_string().ends_with("is not a regular file"), "{e}");
    }

    #[test]
    fn a_missing_cuda_checkpoint_is_named() {
        let (dir, mut tools) = fake_host(H200, 0);
        tools.cuda_checkpoint = dir.path().join("bin/cuda-checkpoint");
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "preflight: cuda-checkpoint not found at {}/bin/cuda-checkpoint (install NVIDIA's cuda-checkpoint, or set cuda_checkpoint in the runtime config)",
                dir.path().display()
            )
        );
    }

    #[test]
    fn a_cuda_checkpoint_that_cannot_run_is_refused() {
        let (_dir, tools) = fake_host(H200, 0);
        fs::set_permissions(&tools.cuda_checkpoint, fs::Permissions::from_mode(0o644)).unwrap();
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("is not an executable file (mode 0644)"),
            "{e}"
        );
    }

    #[test]
    fn a_bare_cuda_checkpoint_name_is_searched_on_path() {
        // `sh` is on every PATH; a name no folder holds is not.
        check_cuda_checkpoint(Path::new("sh")).unwrap();
        let e = check_cuda_checkpoint(Path::new("vsnap-no-such-cuda-checkpoint")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("preflight: cuda-checkpoint not found on PATH (searched "),
            "{e}"
        );
    }

    #[test]
    fn nvidia_smi_failures_are_reported_with_its_message() {
        let (dir, mut tools) = fake_host(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            9,
        );
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert_eq!(
            e.to_string(),
            "preflight: nvidia-smi failed (exit status: 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        );

        tools.nvidia_smi = dir.path().join("missing-nvidia-smi");
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("preflight: nvidia-smi could not be run as "),
            "{e}"
        );
        assert!(
            e.to_string().ends_with("(is the NVIDIA driver installed?)"),
            "{e}"
        );
    }

    #[test]
    fn nvidia_smi_without_gpus_or_with_garbage_is_refused() {
        let (_dir, tools) = fake_host("", 0);
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert_eq!(e.to_string(), "preflight: nvidia-smi lists no GPU");

        let (_dir, tools) = fake_host("No devices were found", 0);
        let e = preflight(&tools, MIN_DRIVER_SINGLE_PROCESS).unwrap_err();
        assert!(matches!(e, CudaError::NvidiaSmiOutput { .. }), "{e}");
    }

    #[test]
    fn a_hanging_nvidia_smi_times_out() {
        let (_dir, tools) = fake_host(H200, 0);
        write_script(&tools.nvidia_smi, "exec sleep 30");
        let t = Instant::now();
        let e = preflight_with_timeout(&tools, 555, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, CudaError::NvidiaSmiTimeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn gpu_lines_are_parsed_from_the_right() {
        let id = parse_gpus(" Acme, Model 9, GPU-1, 575.51.03 \n\n").unwrap();
        assert_eq!(id.gpus[0].name, "Acme, Model 9");
        assert_eq!(id.gpus[0].uuid, "GPU-1");
        assert_eq!(driver_major("575.51.03"), Some(575));
        assert_eq!(driver_major("[N/A]"), None);
        assert!(parse_gpus("NVIDIA H200, GPU-1, [N/A]").is_err());
        assert!(parse_gpus("NVIDIA H200, 570.124.06").is_err());
    }

    #[test]
    fn nvidia_devices_are_found_in_devices_and_mounts() {
        let spec = json!({
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev/nvidia-caps", "type": "bind", "source": "/dev/nvidia-caps"},
                {"destination": "/dev/nvidia0", "type": "bind", "source": "/dev/nvidia0"}
            ],
            "linux": {"devices": [
                {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
                {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0},
                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
                {"path": "/dev/nvidia-uvm", "type": "c", "major": 508, "minor": 0}
            ]}
        });
        assert_eq!(
            spec_nvidia_devices(&spec),
            [
                "/dev/nvidia-caps",
                "/dev/nvidia-uvm",
                "/dev/nvidia0",
                "/dev/nvidiactl"
            ]
        );
        assert!(spec_nvidia_devices(&json!({"ociVersion": "1.0.2"})).is_empty());
        assert!(spec_nvidia_devices(&json!({"linux": {"devices": null}, "mounts": 3})).is_empty());
    }

    #[test]
    fn an_nvidia_hook_is_noticed() {
        let spec = json!({"hooks": {"prestart": [
            {"path": "/usr/bin/true"},
            {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}
        ]}});
        assert_eq!(
            spec_nvidia_hook(&spec).as_deref(),
            Some("prestart hook /usr/bin/nvidia-container-runtime-hook prestart")
        );
        assert_eq!(spec_nvidia_hook(&json!({})), None);
    }

    #[test]
    fn gpus_given_by_ctr_run_gpus_are_refused_pointing_at_cdi() {
        let spec: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/spec-ctr-gpus.json")).unwrap();
        let hook = spec_nvidia_hook(&spec).unwrap();
        assert_eq!(
            hook,
            "prestart hook /usr/local/bin/containerd oci-hook -- /usr/bin/nvidia-container-cli"
        );
        let e = check_no_gpu_hook(&spec).unwrap_err();
        assert!(e.contains("through CDI"), "{e}");
        assert!(e.contains("ctr run --gpus"), "{e}");
        // A CDI spec: devices and mounts in the spec itself, no hook that
        // injects GPUs (nvidia-ctk's createContainer hooks only update the
        // ld cache and make symlinks).
        let cdi: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/spec-cdi-gpu.json")).unwrap();
        check_no_gpu_hook(&cdi).unwrap();
        assert_eq!(
            spec_nvidia_devices(&cdi),
            [
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia1",
                "/dev/nvidiactl"
            ]
        );
    }

    #[test]
    fn the_containers_gpus_are_its_device_nodes() {
        let proc = tempfile::tempdir().unwrap();
        for (bus, minor, uuid) in [
            (
                "0000:18:00.0",
                0,
                "GPU-aaaaaaaa-0000-1111-2222-333344445555",
            ),
            (
                "0000:2a:00.0",
                1,
                "GPU-bbbbbbbb-0000-1111-2222-333344445555",
            ),
        ] {
            let dir = proc.path().join("driver/nvidia/gpus").join(bus);
            fs::create_dir_all(&dir).unwrap();
            fs::write(
                dir.join("information"),
                format!("Model: \t\t NVIDIA H200\nIRQ:   \t\t 240\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\nBus Location: \t {bus}\n"),
            )
            .unwrap();
        }
        let host = parse_gpus(
            "NVIDIA H200, GPU-aaaaaaaa-0000-1111-2222-333344445555, 570.124.06\n\
             NVIDIA H200, GPU-bbbbbbbb-0000-1111-2222-333344445555, 570.124.06",
        )
        .unwrap();
        let devices = vec![
            "/dev/nvidia-uvm".to_string(),
            "/dev/nvidia1".into(),
            "/dev/nvidiactl".into(),
        ];
        let mine = container_gpus(&host, &devices, proc.path()).unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].uuid, "GPU-bbbbbbbb-0000-1111-2222-333344445555");
        assert_eq!(
            container_gpus(&host, &["/dev/nvidiactl".into()], proc.path())
                .unwrap()
                .len(),
            2
        );
        let e = container_gpus(&host, &["/dev/nvidia7".into()], proc.path()).unwrap_err();
        assert!(
            e.starts_with("/dev/nvidia7: no GPU with device minor 7"),
            "{e}"
        );
    }

    #[test]
    fn holders_are_read_from_proc_fd_links() {
        let me = std::process::id() as i32;
        assert!(cuda_holders(&[me, i32::MAX]).is_empty());

        // A fake /proc: fd links as the kernel shows them.
        let proc = tempfile::tempdir().unwrap();
        let links: [(i32, &[(&str, &str)]); 3] = [
            (
                41,
                &[
                    ("0", "/dev/null"),
                    ("3", "/dev/nvidiactl"),
                    ("4", "/dev/nvidia0"),
                    ("5", "/dev/nvidia-uvm"),
                    ("6", "/dev/nvidia0"),
                ],
            ),
            (42, &[("1", "pipe:[1234]"), ("7", "socket:[99]")]),
            (43, &[("9", "/dev/nvidia1")]),
        ];
        for (pid, fds) in links {
            let dir = proc.path().join(pid.to_string()).join("fd");
            fs::create_dir_all(&dir).unwrap();
            for (fd, target) in fds {
                std::os::unix::fs::symlink(target, dir.join(fd)).unwrap();
            }
        }
        let holders = holders_in(proc.path(), &[41, 42, 43, 44]);
        assert_eq!(
            holders,
            [
                (
                    41,
                    vec![
                        "/dev/nvidia-uvm".to_string(),
                        "/dev/nvidia0".into(),
                        "/dev/nvidiactl".into()
                    ]
                ),
                (43, vec!["/dev/nvidia1".to_string()]),
            ]
        );
        assert!(matches!(
            check_single_gpu(&holders),
            Err(CudaError::MultipleGpus { .. })
        ));
    }

    #[test]
    fn one_gpu_per_tree() {
        let ok = vec![
            (
                10,
                vec![
                    "/dev/nvidia-uvm".to_string(),
                    "/dev/nvidia0".into(),
                    "/dev/nvidiactl".into(),
                ],
            ),
            (11, vec!["/dev/nvidia0".into(), "/dev/nvidiactl".into()]),
            (12, vec!["/dev/nvidiactl".into()]),
        ];
        check_single_gpu(&ok).unwrap();
        check_single_gpu(&[]).unwrap();

        let two = vec![
            (
                10,
                vec!["/dev/nvidia0".to_string(), "/dev/nvidiactl".into()],
            ),
            (11, vec!["/dev/nvidia1".into(), "/dev/nvidia-uvm".into()]),
            (12, vec!["/dev/nvidiactl".into()]),
        ];
        let e = check_single_gpu(&two).unwrap_err();
        assert_eq!(
            e.to_string(),
            "preflight: the container's processes use more than one GPU (/dev/nvidia0, /dev/nvidia1): pid 10 holds /dev/nvidia0; pid 11 holds /dev/nvidia1; vsnap captures single-GPU engines only (cuda-checkpoint does not support multi-process NCCL)"
        );
        assert_eq!(gpu_device_index("/dev/nvidia10"), Some(10));
        assert_eq!(gpu_device_index("/dev/nvidiactl"), None);
        assert_eq!(gpu_device_index("/dev/nvidia"), None);
    }

    #[test]
    fn cuda_checkpoint_answers_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("cuda-checkpoint");
        write_script(
            &tool,
            "case \"$1 $3\" in\n\
             '--get-restore-tid 41') echo 57 ;;\n\
             '--get-state 41') echo running ;;\n\
             *) echo \"Error: pid $3 is not a CUDA process\" >&2; exit 1 ;;\n\
             esac",
        );
        assert_eq!(cuda_restore_tid(&tool, 41), Ok(57));
        let e = cuda_restore_tid(&tool, 42).unwrap_err();
        assert_eq!(e, "Error: pid 42 is not a CUDA process (exit status: 1)");
        assert_eq!(cuda_state(&tool, 41).as_deref(), Ok("running"));
        assert!(
            resume_gpu_best_effort(&tool, &[41, 42]).is_empty(),
            "nothing locked"
        );
        let e = cuda_restore_tid(&dir.path().join("missing"), 1).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn errors_become_failed_preconditions() {
        let e: crate::error::Error = CudaError::NoGpu.into();
        assert!(matches!(e, crate::error::Error::FailedPrecondition(_)));
    }
}
