//! Which files of an artifact are covered, and opening them without
//! following a symlink.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::COVERED;
use crate::error::{ArtifactError, Result};

/// The regular files under the covered folders of `dir`, relative, sorted.
/// A symlink, device or other special file there is an error.
pub(super) fn covered_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack: Vec<String> = COVERED
        .iter()
        .filter(|d| dir.join(d).is_dir())
        .map(|d| d.to_string())
        .collect();
    while let Some(rel) = stack.pop() {
        let path = dir.join(&rel);
        let entries = std::fs::read_dir(&path).map_err(|e| ArtifactError::io(&path, "read", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ArtifactError::io(&path, "read", e))?;
            let child = format!("{rel}/{}", entry.file_name().to_string_lossy());
            let ft = entry
                .file_type()
                .map_err(|e| ArtifactError::io(&entry.path(), "stat", e))?;
            if ft.is_dir() {
                stack.push(child);
            } else if ft.is_file() {
                out.push(child);
            } else {
                return Err(ArtifactError::Unsafe(format!(
                    "{}: not a regular file or folder",
                    entry.path().display()
                )));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Opens `dir/rel` without following a symlink; a regular file only.
pub(super) fn open_regular(dir: &Path, rel: &str) -> Result<(File, u64)> {
    let path = dir.join(rel);
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| ArtifactError::io(&path, "open", e))?;
    let md = file
        .metadata()
        .map_err(|e| ArtifactError::io(&path, "stat", e))?;
    if !md.is_file() {
        return Err(ArtifactError::Unsafe(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok((file, md.len()))
}

pub(super) fn open_all(dir: &Path, rels: &[String]) -> Result<Vec<(String, File, u64)>> {
    rels.iter()
        .map(|rel| open_regular(dir, rel).map(|(f, size)| (rel.clone(), f, size)))
        .collect()
}
