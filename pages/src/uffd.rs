//! The userfaultfd calls the server places pages with (`UFFDIO_COPY`,
//! `UFFDIO_ZEROPAGE`, `UFFDIO_UNREGISTER`), and a region of this process's
//! own memory registered with one, as the tests and the probes of
//! `tests/examples` fill it outside CRIU.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::images::PAGE_SIZE;

// <linux/userfaultfd.h>
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
/// `_IOR(0xAA, 0x01, struct uffdio_range)`.
const UFFDIO_UNREGISTER: libc::c_ulong = 0x8010_AA01;
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
/// Reports a task's unmaps (`UFFD_EVENT_UNMAP`) on the descriptor.
pub const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// A huge page's bytes: the alignment of a region that may get them.
pub const HUGE_PAGE: usize = 2 << 20;

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioZeropage {
    start: u64,
    len: u64,
    mode: u64,
    zeropage: i64,
}

/// A `UFFDIO_COPY` or `UFFDIO_ZEROPAGE` that failed: where it stopped,
/// how many bytes were left, and the kernel's error.
#[derive(Debug)]
pub struct UffdError {
    pub call: &'static str,
    pub at: u64,
    pub left: u64,
    pub source: std::io::Error,
}

impl std::fmt::Display for UffdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.call {
            "UFFDIO_ZEROPAGE" => write!(f, "{} of {:#x}: {}", self.call, self.at, self.source),
            _ => write!(
                f,
                "{} of {:#x}+{}: {}",
                self.call, self.at, self.left, self.source
            ),
        }
    }
}

/// `UFFDIO_COPY` of `data` (page-aligned, a whole number of pages) to
/// `dst` of the memory registered with `uffd`. A page already there was
/// placed by the caller with the same bytes: it is skipped.
pub fn copy(uffd: &impl AsRawFd, dst: u64, data: &[u8]) -> Result<(), UffdError> {
    let len = data.len() as u64;
    let mut done = 0u64;
    while done < len {
        let mut c = UffdioCopy {
            dst: dst + done,
            src: data.as_ptr() as u64 + done,
            len: len - done,
            mode: 0,
            copy: 0,
        };
        // SAFETY: `c` is a valid uffdio_copy; the kernel reads `len - done`
        // bytes from `data` (in bounds) and writes only `c.copy`.
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_COPY, &mut c) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if c.copy > 0 {
            done += c.copy as u64;
        }
        match err.raw_os_error() {
            Some(libc::EAGAIN) => std::thread::yield_now(),
            Some(libc::EEXIST) if c.copy <= 0 => done += PAGE_SIZE,
            Some(libc::EEXIST) => {}
            _ => {
                return Err(UffdError {
                    call: "UFFDIO_COPY",
                    at: dst + done,
                    left: len - done,
                    source: err,
                })
            }
        }
    }
    Ok(())
}

/// `UFFDIO_ZEROPAGE` of the page at `at`: a page with no bytes to copy
/// reads as zeros (as CRIU's own lazy-pages daemon answers such a fault).
pub fn zero_page(uffd: &impl AsRawFd, at: u64) -> Result<(), UffdError> {
    loop {
        let mut z = UffdioZeropage {
            start: at,
            len: PAGE_SIZE,
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `z` is a valid uffdio_zeropage; the kernel writes only
        // `z.zeropage`.
        let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) => std::thread::yield_now(),
            Some(libc::EEXIST) => return Ok(()),
            _ => {
                return Err(UffdError {
                    call: "UFFDIO_ZEROPAGE",
                    at,
                    left: PAGE_SIZE,
                    source: err,
                })
            }
        }
    }
}

/// `UFFDIO_UNREGISTER` of `[start, end)`: a touch of it is the kernel's
/// own fault from now on, no more the descriptor's.
pub fn unregister(uffd: &impl AsRawFd, start: u64, end: u64) -> std::io::Result<()> {
    let mut range = [start, end - start];
    // SAFETY: a valid uffdio_range; the kernel reads it only.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_UNREGISTER, range.as_mut_ptr()) };
    match rc {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A private anonymous mapping of this process, its missing pages
/// reported to a userfaultfd once registered: what a restored task's
/// lazy memory is to the server.
pub struct Region {
    /// Where the region starts, and its bytes.
    pub addr: *mut u8,
    pub len: usize,
    /// Set by [`Region::register`]; closed before the region is unmapped.
    pub uffd: Option<OwnedFd>,
    /// The whole mapping (an aligned region is cut out of a larger one).
    mapped: (*mut libc::c_void, usize),
}

// SAFETY: the region is plain memory; whoever writes into it says where.
unsafe impl Send for Region {}

impl Region {
    /// `len` bytes of fresh anonymous memory; with `aligned`, 2 MiB
    /// aligned (a VMA that huge pages can back whole).
    pub fn map(len: usize, aligned: bool) -> std::io::Result<Self> {
        let total = if aligned { len + HUGE_PAGE } else { len };
        // SAFETY: a fresh private mapping, owned by the returned region.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut region = Region {
            addr: base.cast(),
            len,
            uffd: None,
            mapped: (base, total),
        };
        if aligned {
            // The aligned part kept, one VMA of exactly `len` bytes.
            let start = (base as usize).div_ceil(HUGE_PAGE) * HUGE_PAGE;
            let (head, tail) = (start - base as usize, total - (start - base as usize) - len);
            // SAFETY: the parts of the mapping made above outside
            // `[start, start + len)`, which nothing refers to.
            unsafe {
                if head > 0 {
                    libc::munmap(base, head);
                }
                if tail > 0 {
                    libc::munmap((start + len) as *mut libc::c_void, tail);
                }
            }
            region.addr = start as *mut u8;
            region.mapped = (start as *mut libc::c_void, len);
        }
        Ok(region)
    }

    /// `madvise` of the whole region: `MADV_HUGEPAGE` as CRIU's restorer
    /// leaves a VMA the engine advised, `MADV_NOHUGEPAGE` for 4 KiB pages
    /// only.
    pub fn advise(&self, advice: libc::c_int) -> std::io::Result<()> {
        // SAFETY: the region's own range; advice changes no byte of it.
        let rc = unsafe { libc::madvise(self.addr.cast(), self.len, advice) };
        match rc {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Registers the region with a new userfaultfd (non-blocking) asking
    /// for `features` (`UFFD_FEATURE_*`): its missing pages wait for a
    /// copy from then on.
    pub fn register(&mut self, features: u64) -> std::io::Result<()> {
        // SAFETY: plain syscalls on a descriptor made here, owned at once.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just gave this process.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut api = [0xAAu64, features, 0];
        // SAFETY: a valid uffdio_api; the kernel writes into it only.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut reg = [self.addr as u64, self.len as u64, 1 /* MISSING */, 0];
        // SAFETY: a valid uffdio_register of this region's own range.
        if unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER, reg.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.uffd = Some(uffd);
        Ok(())
    }

    /// The region's descriptor; panics when it was never registered.
    pub fn fd(&self) -> &OwnedFd {
        self.uffd.as_ref().expect("a registered region")
    }

    /// The region's bytes. Reading a page not yet placed waits for it
    /// (or reads zeros, unregistered).
    ///
    /// # Safety
    /// Nobody writes the region meanwhile (no copy into it is under way).
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `len` mapped bytes, readable while `self` lives; the
        // caller rules out writers.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // The descriptor first: with it open, an unmap would wait for a
        // reader of its event.
        drop(self.uffd.take());
        // SAFETY: mapped in `map`, no reference to it outlives the region.
        unsafe { libc::munmap(self.mapped.0, self.mapped.1) };
    }
}
