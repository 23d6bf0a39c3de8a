//! The tools runc and CRIU run during a checkpoint or restore (`--criu`
//! where this runc takes it, the tools' folders first on PATH).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The tools runc and CRIU run during a checkpoint or restore, as the
/// runtime config names them. runc 1.1 takes CRIU as `--criu`; runc 1.2 and
/// later run `criu` from PATH (1.2-1.3 ignore `--criu`, later ones refuse
/// it); CRIU's CUDA plugin runs `cuda-checkpoint` from CRIU's PATH, which it
/// inherits from runc. So: `--criu` where runc takes it, and the folders of
/// an absolute CRIU and cuda-checkpoint first on the PATH of both.
#[derive(Clone, Debug, Default)]
pub struct CriuTools {
    pub criu: PathBuf,
    pub path_first: Vec<PathBuf>,
    /// Whether this runc takes `--criu` (probed once, on first use).
    pub(super) takes_flag: Arc<tokio::sync::OnceCell<bool>>,
}

impl CriuTools {
    pub fn new(criu: &Path, cuda_checkpoint: &Path) -> Self {
        let mut path_first: Vec<PathBuf> = Vec::new();
        for tool in [cuda_checkpoint, criu] {
            if let Some(dir) = tool.is_absolute().then(|| tool.parent()).flatten() {
                if !path_first.iter().any(|d| d == dir) {
                    path_first.push(dir.to_path_buf());
                }
            }
        }
        Self {
            criu: criu.to_path_buf(),
            path_first,
            takes_flag: Arc::default(),
        }
    }

    /// `PATH` for runc and CRIU: the tools' folders, then `inherited`.
    pub fn path_env(&self, inherited: Option<OsString>) -> Option<OsString> {
        if self.path_first.is_empty() {
            return inherited;
        }
        let inherited = inherited.unwrap_or_else(|| {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()
        });
        let dirs = self
            .path_first
            .iter()
            .map(|d| d.as_os_str().to_owned())
            .chain(std::env::split_paths(&inherited).map(PathBuf::into_os_string));
        std::env::join_paths(dirs).ok()
    }
}

/// Whether a runc whose `--version` starts with `first_line` takes `--criu`
/// (runc 1.0 and 1.1 do).
pub fn runc_takes_criu_flag(first_line: &str) -> bool {
    let version = first_line
        .trim()
        .strip_prefix("runc version ")
        .unwrap_or_default();
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u32>().ok());
    matches!((major, minor), (Some(1), Some(0 | 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_runc_1_0_and_1_1_take_the_criu_flag() {
        assert!(runc_takes_criu_flag("runc version 1.1.5+ds1"));
        assert!(runc_takes_criu_flag("runc version 1.0.0-rc93"));
        assert!(!runc_takes_criu_flag("runc version 1.2.0"));
        assert!(!runc_takes_criu_flag("runc version 1.3.3"));
        assert!(!runc_takes_criu_flag("runc version 2.0.0"));
        assert!(!runc_takes_criu_flag("something else"));
    }

    #[test]
    fn the_tools_folders_come_first_on_path() {
        let t = CriuTools::new(
            Path::new("/opt/criu/sbin/criu"),
            Path::new("/opt/nvidia/bin/cuda-checkpoint"),
        );
        assert_eq!(
            t.path_env(Some("/usr/bin:/bin".into())).unwrap(),
            "/opt/nvidia/bin:/opt/criu/sbin:/usr/bin:/bin"
        );
        let bare = CriuTools::new(Path::new("criu"), Path::new("cuda-checkpoint"));
        assert_eq!(bare.path_env(Some("/usr/bin".into())).unwrap(), "/usr/bin");
        let same = CriuTools::new(
            Path::new("/opt/x/criu"),
            Path::new("/opt/x/cuda-checkpoint"),
        );
        assert_eq!(
            same.path_env(None)
                .unwrap()
                .to_str()
                .unwrap()
                .split(':')
                .next(),
            Some("/opt/x")
        );
    }
}
