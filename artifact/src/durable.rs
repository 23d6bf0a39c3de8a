//! A file written whole and durable: created 0600 without following a
//! symlink, written, fsynced. Used for the keys and the manifest, below
//! both the key and the layout rooms.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{ArtifactError, Result};

/// Creates `path` (0600, never following a symlink), writes and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| ArtifactError::io(path, "create", e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| ArtifactError::io(path, "write", e))
}
