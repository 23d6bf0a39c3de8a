//! Placing pages into a task's memory: `UFFDIO_COPY` from a page-aligned
//! buffer, the faults of a task that touched a page before its range was
//! filled, and the poll over the tasks' descriptors.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::chunks::Buffer;
use crate::error::{pid, PageError, Phase};
use crate::images::PAGE_SIZE;
use crate::uffd;

use super::task::Task;

/// Bytes placed around a page a task touched before its range was filled.
pub(super) const FAULT_CHUNK: u64 = 64 << 10;

// <linux/userfaultfd.h>
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_MSG_SIZE: usize = 32;

/// Places `len` bytes at `vaddr` of `task` from `offset` of its pages file
/// (a page a task touched before its chunk was placed; the chunk is
/// checked against its digest all the same before the tree runs).
fn place(
    task: &Task,
    vaddr: u64,
    len: u64,
    offset: u64,
    buf: &mut Buffer,
) -> Result<(), PageError> {
    if task.huge.as_ref().is_some_and(|h| h.holds(vaddr)) {
        // No more registered: the kernel's own fault resolved it, a filler
        // writes the bytes.
        return Ok(());
    }
    if let Some(arrivals) = &task.stream {
        // A page touched before its chunk arrived: asked for ahead of the
        // pull's order, then waited for (the server's drop or the pull's
        // failure ends the wait).
        arrivals.want(&task.pages_rel, offset, offset + len);
        arrivals.wait(
            &task.pages_rel,
            offset,
            offset + len,
            &AtomicBool::new(false),
        )?;
    }
    let data = &mut buf.as_mut_slice()[..len as usize];
    task.pages.read_exact_at(data, offset).map_err(|e| {
        PageError::failed(
            Phase::Read,
            pid(task.pid),
            format!("read {len} bytes at {offset} of its pages: {e}"),
        )
    })?;
    if let Some(c) = &task.sealed {
        c.apply(offset, data);
    }
    copy(task, vaddr, data)
}

/// `UFFDIO_COPY` of `data` (page-aligned) to `vaddr` of `task`. A page
/// already there was placed by this server with the same bytes. In a VMA
/// taken for huge pages (`super::huge`), a write instead.
pub(super) fn copy(task: &Task, vaddr: u64, data: &[u8]) -> Result<(), PageError> {
    if let Some(h) = task.huge.as_ref().filter(|h| h.holds(vaddr)) {
        return h.write(task.pid, vaddr, data);
    }
    uffd::copy(&task.uffd, vaddr, data)
        .map_err(|e| PageError::failed(Phase::Place, pid(task.pid), e))
}

/// `UFFDIO_ZEROPAGE` of the page at `vaddr` of `task`: a page its pagemap
/// has no bytes for (a hole: a zero page the capture left out, or one never
/// touched), as CRIU's own lazy-pages daemon answers such a fault.
fn zero(task: &Task, vaddr: u64) -> Result<(), PageError> {
    uffd::zero_page(&task.uffd, vaddr)
        .map_err(|e| PageError::failed(Phase::Place, pid(task.pid), e))
}

/// Reads every queued message of `task`'s descriptor; a page fault gets
/// its neighbourhood placed now (a zero page in a hole of the pagemap),
/// any other event fails the restore.
pub(super) fn serve_faults(
    task: &Task,
    buf: &mut Buffer,
    faults: &AtomicU64,
) -> Result<(), PageError> {
    let fail = |detail: String| PageError::failed(Phase::Place, pid(task.pid), detail);
    let mut msgs = [0u8; UFFD_MSG_SIZE * 16];
    loop {
        let n = match nix::unistd::read(&task.uffd, &mut msgs) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(fail(format!("read its userfaultfd: {e}"))),
        };
        if n == 0 {
            return Ok(());
        }
        for msg in msgs[..n].chunks_exact(UFFD_MSG_SIZE) {
            if msg[0] != UFFD_EVENT_PAGEFAULT {
                return Err(fail(format!(
                    "userfaultfd event {:#x} while its pages were placed: the tree ran before it was restored",
                    msg[0]
                )));
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
pub(super) fn wait(conn: RawFd, tasks: &[Task]) -> Result<Vec<usize>, PageError> {
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
        return Err(PageError::failed(
            Phase::Place,
            "the tasks' userfaultfds",
            format!("poll: {e}"),
        ));
    }
    Ok(fds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, _)| if i == tasks.len() { usize::MAX } else { i })
        .collect())
}
