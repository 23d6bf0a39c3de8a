//! Asking nvidia-smi for the host's GPUs (name, UUID, driver version) and
//! reading its answer.

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::driver::driver_major;
use super::error::CudaError;
use super::tool::{run_tool, ToolError};

/// What nvidia-smi is asked for (one CSV line per GPU).
pub const NVIDIA_SMI_ARGS: [&str; 2] = [
    "--query-gpu=name,uuid,driver_version",
    "--format=csv,noheader",
];
/// How long nvidia-smi may take (it can hang on a wedged driver).
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The GPUs nvidia-smi at `path` lists, asked once, within `timeout`.
pub(super) fn query(path: &Path, timeout: Duration) -> Result<GpuIdentity, CudaError> {
    parse_gpus(&run_nvidia_smi(path, timeout)?)
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

#[cfg(test)]
mod tests {
    use super::super::driver::MIN_DRIVER_SINGLE_PROCESS;
    use super::super::preflight::{preflight, preflight_with_timeout};
    use super::super::testutil::{fake_host, write_script, H200};
    use super::*;
    use std::time::Instant;

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
}
