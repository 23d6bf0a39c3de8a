//! Asking nvidia-smi for the host's GPUs (name, UUID, driver version) and
//! reading its answer.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use vsnap_artifact::gpu::{parse_nvidia_smi, Gpu, GpuError, NVIDIA_SMI_ARGS};
use vsnap_artifact::spawn::{self, RunError};

use super::error::CudaError;

/// How long nvidia-smi may take (it can hang on a wedged driver).
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(30);

/// The host's GPUs as nvidia-smi reports them, for the manifest's fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuIdentity {
    pub gpus: Vec<Gpu>,
}

/// The GPUs nvidia-smi at `path` lists, asked once ([`NVIDIA_SMI_ARGS`]),
/// within `timeout`.
pub(super) fn query(path: &Path, timeout: Duration) -> Result<GpuIdentity, CudaError> {
    parse_gpus(&run_nvidia_smi(path, timeout)?)
}

/// Runs nvidia-smi's GPU query; its stdout on success.
fn run_nvidia_smi(path: &Path, timeout: Duration) -> Result<String, CudaError> {
    let ran =
        spawn::run(Command::new(path).args(NVIDIA_SMI_ARGS), timeout).map_err(|e| match e {
            RunError::Spawn(source) | RunError::Wait(source) => CudaError::NvidiaSmiNotRunnable {
                path: path.to_path_buf(),
                source,
            },
            RunError::Timeout => CudaError::NvidiaSmiTimeout { timeout },
        })?;
    match ran.failure() {
        Some((status, output)) => Err(CudaError::NvidiaSmiFailed { status, output }),
        None => Ok(ran.stdout),
    }
}

/// nvidia-smi's answer read by the workspace's one parser
/// ([`parse_nvidia_smi`]), its refusals as the preflight's.
pub(super) fn parse_gpus(output: &str) -> Result<GpuIdentity, CudaError> {
    let gpus = parse_nvidia_smi(output).map_err(|e| match e {
        GpuError::Row { line } | GpuError::Entry { entry: line } => {
            CudaError::NvidiaSmiOutput { line }
        }
        GpuError::NoGpu => CudaError::NoGpu,
    })?;
    Ok(GpuIdentity { gpus })
}

#[cfg(test)]
mod tests {
    use super::super::driver_version::MIN_DRIVER_SINGLE_PROCESS;
    use super::super::preflight::{preflight, preflight_with_timeout};
    use super::super::testutil::{fake_host, write_script, H200};
    use super::*;
    use std::time::Instant;
    use vsnap_artifact::gpu::driver_major;

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
