//! A verified chunk as one restore hands it to the others: a `memfd`
//! written once through a mapping, then sealed (`F_SEAL_WRITE`,
//! `F_SEAL_SHRINK`, `F_SEAL_GROW`, `F_SEAL_SEAL`) so that nobody, its
//! writer included, can change it any more; and the receiving side's check
//! of those seals and of its size before it maps it read-only.

use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use crate::error::{PageError, Phase};

/// A shared chunk as errors name it.
const CHUNK_FD: &str = "a chunk's memfd";

fn chunk_error(detail: impl std::fmt::Display) -> PageError {
    PageError::failed(Phase::Share, CHUNK_FD, detail)
}

/// The seals a shared chunk must carry.
pub(super) fn seals() -> SealFlag {
    SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL
}

/// A mapping of a chunk's memfd: writable while it is filled, read-only
/// once sealed. Unmapped when dropped.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<libc::c_void>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by one thread at a time.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize, prot: ProtFlags) -> Result<Self, PageError> {
        let size = NonZeroUsize::new(len).ok_or_else(|| chunk_error("empty"))?;
        // SAFETY: a fresh shared mapping of `fd`, not aliasing any Rust
        // object; unmapped in Drop.
        let ptr = unsafe { mmap(None, size, prot, MapFlags::MAP_SHARED, fd, 0) }
            .map_err(|e| chunk_error(format!("mmap {len} bytes: {e}")))?;
        Ok(Mapping { ptr, len })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` mapped bytes, readable while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: a writable mapping (`Unsealed` only), owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; nothing borrows it now.
        let _ = unsafe { munmap(self.ptr, self.len) };
    }
}

/// A chunk's memfd being filled by the leader, mapped writable.
pub(super) struct Unsealed {
    fd: OwnedFd,
    map: Mapping,
}

impl Unsealed {
    /// A memfd of `len` bytes that may be sealed, mapped writable.
    pub(super) fn new(len: usize) -> Result<Self, PageError> {
        let flags = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
        let fd = memfd_create("vsnap-chunk", flags)
            .map_err(|e| chunk_error(format!("memfd_create: {e}")))?;
        nix::unistd::ftruncate(&fd, len as libc::off_t)
            .map_err(|e| chunk_error(format!("size to {len} bytes: {e}")))?;
        let map = Mapping::new(&fd, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE)?;
        Ok(Unsealed { fd, map })
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        self.map.as_mut_slice()
    }

    /// Unmapped (a writable mapping would keep `F_SEAL_WRITE` out), then
    /// sealed: from here on its bytes cannot change.
    pub(super) fn seal(self) -> Result<OwnedFd, PageError> {
        drop(self.map);
        fcntl(&self.fd, FcntlArg::F_ADD_SEALS(seals()))
            .map_err(|e| chunk_error(format!("seal: {e}")))?;
        Ok(self.fd)
    }
}

#[cfg(test)]
impl Unsealed {
    /// Its descriptor, never sealed: what a follower must refuse.
    pub(super) fn unsealed_fd(self) -> OwnedFd {
        self.fd
    }
}

/// A chunk received from the leader: checked to be sealed against any
/// change and to hold exactly `len` bytes, then mapped read-only.
pub(super) fn open_sealed(fd: &OwnedFd, len: u64) -> Result<Mapping, PageError> {
    let got =
        fcntl(fd, FcntlArg::F_GET_SEALS).map_err(|e| chunk_error(format!("F_GET_SEALS: {e}")))?;
    let got = SealFlag::from_bits_truncate(got);
    if !got.contains(seals()) {
        return Err(chunk_error(format!(
            "not sealed against changes (seals {:#x}, want {:#x})",
            got.bits(),
            seals().bits()
        )));
    }
    let size = nix::sys::stat::fstat(fd)
        .map_err(|e| chunk_error(format!("fstat: {e}")))?
        .st_size as u64;
    if size != len {
        return Err(chunk_error(format!(
            "holds {size} bytes, the chunk has {len}"
        )));
    }
    Mapping::new(fd, len as usize, ProtFlags::PROT_READ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_chunk_opens_with_its_bytes_and_cannot_change() {
        let mut c = Unsealed::new(3 * 4096).unwrap();
        c.as_mut_slice()[4096..4100].copy_from_slice(b"abcd");
        let fd = c.seal().unwrap();
        let map = open_sealed(&fd, 3 * 4096).unwrap();
        assert_eq!(&map.as_slice()[4096..4100], b"abcd");
        let e = nix::unistd::ftruncate(&fd, 4096).unwrap_err();
        assert_eq!(e, nix::errno::Errno::EPERM);
        let writable = Mapping::new(&fd, 4096, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE);
        assert!(writable.is_err(), "a sealed chunk maps read-only only");
    }

    #[test]
    fn an_unsealed_memfd_or_one_of_another_size_is_refused() {
        let c = Unsealed::new(4096).unwrap();
        let e = open_sealed(&c.fd, 4096).unwrap_err().to_string();
        assert!(e.contains("not sealed"), "{e}");
        let fd = c.seal().unwrap();
        let e = open_sealed(&fd, 8192).unwrap_err().to_string();
        assert!(e.contains("holds 4096 bytes, the chunk has 8192"), "{e}");
    }
}
