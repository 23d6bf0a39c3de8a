//! A partial pull and its disk: room for what is still to land, and the
//! write-back of what landed.

use std::fs::File;
use std::path::Path;

use crate::error::{RegistryError, Result};

/// Whether `free` bytes hold what is still to land of `total` with `here`
/// landed; else the error saying so.
pub(super) fn room(root: &Path, free: u64, total: u64, here: u64) -> Result<()> {
    let need = total.saturating_sub(here);
    if need <= free {
        return Ok(());
    }
    Err(RegistryError::io(
        format!("pull: {}", root.display()),
        std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!("{free} bytes free, the artifact needs {need} more ({here} of its {total} bytes are here)"),
        ),
    ))
}

/// `sync_file_range` flags that write a range back and wait until it is.
pub(super) const WRITTEN: libc::c_uint = libc::SYNC_FILE_RANGE_WAIT_BEFORE
    | libc::SYNC_FILE_RANGE_WRITE
    | libc::SYNC_FILE_RANGE_WAIT_AFTER;

/// `len` bytes at `offset` of `file` written back to the disk as `flags`
/// say: started (`SYNC_FILE_RANGE_WRITE`), or also waited for
/// ([`WRITTEN`]). Only the data, and only a head start: the fsync before
/// the publish still decides, and reports any error. A pull then holds no
/// more than its landings' chunks dirty in the page cache, whatever the
/// artifact's size.
pub(super) fn write_back(file: &File, (offset, len): (u64, u64), flags: libc::c_uint) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only writes back its
    // pages and touches no memory of ours.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            flags,
        )
    };
}

/// Bytes an unprivileged writer may still use on the file system of `path`.
pub(super) fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a NUL in the path"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is written by statvfs
    // before it is read (only when it returns 0).
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // Both are 64 bits wide here, not on every target.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}
