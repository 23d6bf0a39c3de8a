//! `CudaError`: every refusal of the CUDA preflight and the GPU inventory,
//! worded for the operator, and its mapping onto the shim's errors.

use std::path::PathBuf;
use std::time::Duration;

use super::driver_version::{MIN_DRIVER_PROCESS_TREE, MIN_DRIVER_SINGLE_PROCESS};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_become_failed_preconditions() {
        let e: crate::error::Error = CudaError::NoGpu.into();
        assert!(matches!(e, crate::error::Error::FailedPrecondition(_)));
    }
}
