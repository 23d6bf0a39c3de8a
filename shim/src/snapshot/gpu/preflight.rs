//! The CUDA preflight: CRIU's CUDA plugin, NVIDIA's cuda-checkpoint and a
//! driver new enough for it, checked before CRIU runs.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use vsnap_artifact::gpu::driver_major;

use super::error::CudaError;
use super::nvidia_smi::{self, GpuIdentity, NVIDIA_SMI_TIMEOUT};

/// The file CRIU loads from its plugin folder for CUDA support.
pub const PLUGIN_FILE: &str = "cuda_plugin.so";
/// CRIU's compiled-in plugin folder (where `scripts/setup.sh` installs the plugin).
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/criu";

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

/// Checks that the CUDA plugin, cuda-checkpoint and a driver of at least
/// `min_driver_major` are there, and returns the GPUs nvidia-smi lists.
/// Pass [`MIN_DRIVER_SINGLE_PROCESS`](super::driver_version::MIN_DRIVER_SINGLE_PROCESS)
/// for a single CUDA process and
/// [`MIN_DRIVER_PROCESS_TREE`](super::driver_version::MIN_DRIVER_PROCESS_TREE) when
/// several processes of the tree use CUDA.
pub fn preflight(tools: &CudaTools, min_driver_major: u32) -> Result<GpuIdentity, CudaError> {
    preflight_with_timeout(tools, min_driver_major, NVIDIA_SMI_TIMEOUT)
}

pub(super) fn preflight_with_timeout(
    tools: &CudaTools,
    min_driver_major: u32,
    timeout: Duration,
) -> Result<GpuIdentity, CudaError> {
    check_plugin(&tools.plugin_dir)?;
    check_cuda_checkpoint(&tools.cuda_checkpoint)?;
    let identity = nvidia_smi::query(&tools.nvidia_smi, timeout)?;
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

#[cfg(test)]
mod tests {
    use super::super::driver_version::{MIN_DRIVER_PROCESS_TREE, MIN_DRIVER_SINGLE_PROCESS};
    use super::super::testutil::{fake_host, H200};
    use super::*;
    use std::fs;
    use vsnap_artifact::Gpu;

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
}
