//! Placing pages into a task's memory: `UFFDIO_COPY` from a page-aligned
//! buffer, the faults of a task that touched a page before its range was
//! filled, and the poll over the tasks' descriptors.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::images::PAGE_SIZE;

use super::task::Task;

/// Bytes one `UFFDIO_COPY` of a filling thread places.
pub(super) const FILL_CHUNK: u64 = 2 << 20;
/// Bytes placed around a page a task touched before its range was filled.
pub(super) const FAULT_CHUNK: u64 = 64 << 10;

// <linux/userfaultfd.h>
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFDIO_ZEROPAGE: libc::c_ulong = 0xC020_AA04;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_MSG_SIZE: usize = 32;

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// Places `len` bytes at `vaddr` of `task` from `offset` of its pages file
/// (a page a task touched before its chunk was placed; the chunk is
/// checked against its digest all the same before the tree runs).
fn place(task: &Task, vaddr: u64, len: u64, offset: u64, buf: &mut Buffer) -> Result<(), String> {
    if task.huge.as_ref().is_some_and(|h| h.holds(vaddr)) {
        // No more registered: the kernel's own fault resolved it, a filler
        // writes the bytes.
        return Ok(());
    }
    let data = &mut buf.as_mut()[..len as usize];
    task.pages.read_exact_at(data, offset).map_err(|e| {
        format!(
            "pid {}: read {len} bytes at {offset} of its pages: {e}",
            task.pid
        )
    })?;
    copy(task, vaddr, data)
}

/// `UFFDIO_COPY` of `data` (page-aligned) to `vaddr` of `task`. A page
/// already there was placed by this server with the same bytes. In a VMA
/// taken for huge pages (`super::huge`), a write instead.
pub(super) fn copy(task: &Task, vaddr: u64, data: &[u8]) -> Result<(), String> {
    if let Some(h) = task.huge.as_ref().filter(|h| h.holds(vaddr)) {
        return h.write(task.pid, vaddr, data);
    }
    let len = data.len() as u64;
    let mut done = 0u64;
    while done < len {
        let mut c = UffdioCopy {
            dst: vaddr + done,
            src: data.as_ptr() as u64 + done,
            len: len - done,
            mode: 0,
            copy: 0,
        };
        // SAFETY: `c` is a valid uffdio_copy; the kernel reads `len - done`
        // bytes from `data` (in bounds) and writes only `c.copy`.
        let rc = unsafe { libc::ioctl(task.uffd.as_raw_fd(), UFFDIO_COPY, &mut c) };
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
                return Err(format!(
                    "pid {}: UFFDIO_COPY of {:#x}+{}: {err}",
                    task.pid,
                    vaddr + done,
                    len - done
                ))
            }
        }
    }
    Ok(())
}

#[repr(C)]
struct UffdioZeropage {
    start: u64,
    len: u64,
    mode: u64,
    zeropage: i64,
}

/// `UFFDIO_ZEROPAGE` of the page at `vaddr` of `task`: a page its pagemap
/// has no bytes for (a hole: a zero page the capture left out, or one never
/// touched), as CRIU's own lazy-pages daemon answers such a fault.
fn zero(task: &Task, vaddr: u64) -> Result<(), String> {
    loop {
        let mut z = UffdioZeropage {
            start: vaddr,
            len: PAGE_SIZE,
            mode: 0,
            zeropage: 0,
        };
        // SAFETY: `z` is a valid uffdio_zeropage; the kernel writes only
        // `z.zeropage`.
        let rc = unsafe { libc::ioctl(task.uffd.as_raw_fd(), UFFDIO_ZEROPAGE, &mut z) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EAGAIN) => std::thread::yield_now(),
            Some(libc::EEXIST) => return Ok(()),
            _ => {
                return Err(format!(
                    "pid {}: UFFDIO_ZEROPAGE of {vaddr:#x}: {err}",
                    task.pid
                ))
            }
        }
    }
}

/// Reads every queued message of `task`'s descriptor; a page fault gets
/// its neighbourhood placed now (a zero page in a hole of the pagemap),
/// any other event fails the restore.
pub(super) fn serve_faults(
    task: &Task,
    buf: &mut Buffer,
    faults: &AtomicU64,
) -> Result<(), String> {
    let mut msgs = [0u8; UFFD_MSG_SIZE * 16];
    loop {
        let n = match nix::unistd::read(&task.uffd, &mut msgs) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("pid {}: read its userfaultfd: {e}", task.pid)),
        };
        if n == 0 {
            return Ok(());
        }
        for msg in msgs[..n].chunks_exact(UFFD_MSG_SIZE) {
            if msg[0] != UFFD_EVENT_PAGEFAULT {
                return Err(format!(
                    "pid {}: userfaultfd event {:#x} while its pages were placed: the tree ran before it was restored",
                    task.pid, msg[0]
                ));
            }
            let addr =
                u64::from_le_bytes(msg[16..24].try_into().expect("8 bytes")) & !(PAGE_SIZE - 1);
            // The kernel reports faults in registered ranges only: CRIU
            // registers whole lazy VMAs, so an address no pagemap entry
            // holds is a hole of one and reads as zeros.
            let Some(r) = task.lazy.find(addr) else {
                zero(task, addr)?;
                faults.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let start = (addr & !(FAULT_CHUNK - 1)).max(r.vaddr);
            let end = (start + FAULT_CHUNK).min(r.vaddr + r.len);
            place(task, start, end - start, r.offset + (start - r.vaddr), buf)?;
            faults.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits up to 50 ms for `conn` (reported as `usize::MAX`; -1 for none) or
/// a task's descriptor to be readable; returns which are.
pub(super) fn wait(conn: RawFd, tasks: &[Task]) -> Result<Vec<usize>, String> {
    let mut fds: Vec<libc::pollfd> = tasks
        .iter()
        .map(|t| libc::pollfd {
            fd: t.uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if conn >= 0 {
        fds.push(libc::pollfd {
            fd: conn,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // SAFETY: `fds` is a valid array of pollfd of the given length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(Vec::new());
        }
        return Err(format!("poll: {e}"));
    }
    Ok(fds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, _)| if i == tasks.len() { usize::MAX } else { i })
        .collect())
}

/// A page-aligned buffer (`UFFDIO_COPY` wants a page-aligned source).
pub(super) struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by one thread at a time.
unsafe impl Send for Buffer {}

impl Buffer {
    pub(super) fn new(len: usize) -> Self {
        let layout =
            std::alloc::Layout::from_size_align(len, PAGE_SIZE as usize).expect("a layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "out of memory for a {len}-byte buffer");
        Buffer { ptr, len }
    }

    pub(super) fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len, PAGE_SIZE as usize).expect("a layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}
