//! The partial folder's two records, each opened once by a pull: `landed`
//! (the chunks whose bytes are at every place of them) and `arrived` (the
//! same as places, what a streamed restore follows).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{RegistryError, Result};

/// `landed`, opened to append (created 0600 when missing).
pub(super) fn open_journal(path: &Path) -> Result<File> {
    File::options()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| RegistryError::io(format!("pull: open {}", path.display()), e))
}

/// The record of arrivals in the partial folder `dir`, made afresh: an
/// earlier pull's record is not this pull's, what it landed is recorded
/// again once checked.
pub(super) fn open_record(dir: &Path) -> Result<File> {
    let path = dir.join(vsnap_artifact::arrivals::FILE);
    File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| RegistryError::io(format!("pull: open {}", path.display()), e))
}
