//! Test fixtures of the CUDA module: a fake GPU host (plugin,
//! cuda-checkpoint, nvidia-smi) and executable scripts.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use vsnap_artifact::gpu::NVIDIA_SMI_ARGS;

use super::preflight::{CudaTools, PLUGIN_FILE};

pub const H200: &str = "NVIDIA H200, GPU-5f1c2a3b-0000-1111-2222-333344445555, 570.124.06";

/// A folder with a plugin, an executable cuda-checkpoint and a fake
/// nvidia-smi that prints `gpus` (only when asked the expected query)
/// and exits with `code`.
pub fn fake_host(gpus: &str, code: i32) -> (tempfile::TempDir, CudaTools) {
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

pub fn write_script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}
