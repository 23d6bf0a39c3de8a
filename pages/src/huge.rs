//! Huge pages where the captured memory was eligible for them.
//!
//! `UFFDIO_COPY` places 4 KiB pages only. A VMA that the engine marked
//! `MADV_HUGEPAGE` (CRIU records it in the VMA's `madv` bits and restores
//! it in the restorer, after registering the VMA with the userfaultfd and
//! before `RESTORE_FINISHED`), or any VMA on a host whose THP mode is
//! `always` unless marked `MADV_NOHUGEPAGE`, is placed another way: once
//! the restore finished and the tree is stopped, the whole VMA is
//! unregistered from the task's userfaultfd (`UFFDIO_UNREGISTER`, one call
//! per VMA, so the VMA stays one VMA), and the fillers write its pages with
//! `process_vm_writev` from the buffer they hashed them in. The task's
//! memory is then faulted in by the kernel's own path, which allocates a
//! huge page for every 2 MiB of the VMA its THP policy allows: the kernel,
//! not the server, decides, so nothing changes that THP itself would not.
//!
//! Measured (`tests/examples/huge_fill_probe.rs`, docs/page-server.md):
//! unregistering piece by piece split one VMA into a dozen that never
//! merge again (each piece gets its own `anon_vma`), which a later
//! `mremap` of the whole range would trip over; `UFFDIO_COPY` then
//! `MADV_COLLAPSE` copies every byte twice. `UFFDIO_MOVE` moves pages
//! within one address space only, and CRIU 4.2 does not request it.
//!
//! A task's host pid (for `process_vm_writev`) is the pid the kernel
//! attached to CRIU's message (`SO_PASSCRED`: the task itself sends its
//! descriptor), checked against the pid CRIU names in `/proc/<pid>/status`
//! (`NSpid`). Without it the task's memory is placed with `UFFDIO_COPY`,
//! 4 KiB pages, as before.

use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::uio::{process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

use crate::error::{pid as task, PageError, Phase};
use crate::images::{self, LazyPages, Vma};
use crate::uffd;

/// `1 << MADV_HUGEPAGE` and `1 << MADV_NOHUGEPAGE` in a VMA's `madv`.
const MADV_HUGEPAGE_BIT: u64 = 1 << libc::MADV_HUGEPAGE;
const MADV_NOHUGEPAGE_BIT: u64 = 1 << libc::MADV_NOHUGEPAGE;
/// The host's THP mode.
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// The host's transparent huge page mode (`THP_ENABLED`, the bracketed
/// word).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ThpMode {
    Always,
    Madvise,
    Never,
}

impl ThpMode {
    /// This host's mode; `Never` where it cannot be read (no THP).
    pub(super) fn host() -> Self {
        std::fs::read_to_string(THP_ENABLED).map_or(ThpMode::Never, |s| Self::parse(&s))
    }

    fn parse(s: &str) -> Self {
        match s.split_once('[').and_then(|(_, r)| r.split_once(']')) {
            Some(("always", _)) => ThpMode::Always,
            Some(("madvise", _)) => ThpMode::Madvise,
            _ => ThpMode::Never,
        }
    }
}

/// Whether a private anonymous VMA with madvise bits `madv` may get huge
/// pages under `mode` (what `THPeligible` of smaps says for such a VMA,
/// 2 MiB alignment aside).
pub(super) fn eligible(madv: u64, mode: ThpMode) -> bool {
    match mode {
        ThpMode::Never => false,
        ThpMode::Madvise => madv & MADV_HUGEPAGE_BIT != 0,
        ThpMode::Always => madv & MADV_NOHUGEPAGE_BIT == 0,
    }
}

/// The eligible VMAs of `vmas` that hold lazy pages of `lazy`, as sorted
/// `(start, end)`: what the server unregisters and writes.
pub(super) fn eligible_vmas(vmas: &[Vma], lazy: &LazyPages, mode: ThpMode) -> Vec<(u64, u64)> {
    vmas.iter()
        .filter(|v| eligible(v.madv, mode))
        .filter(|v| {
            let i = lazy.ranges.partition_point(|r| r.vaddr + r.len <= v.start);
            lazy.ranges.get(i).is_some_and(|r| r.vaddr < v.end)
        })
        .map(|v| (v.start, v.end))
        .collect()
}

/// A task's eligible VMAs and how to write into them.
pub(super) struct Huge {
    /// The task's pid in the host's pid namespace (the server's).
    host_pid: i32,
    vmas: Vec<(u64, u64)>,
    /// Set once the VMAs are unregistered: from then on the fillers write.
    taken: AtomicBool,
}

impl Huge {
    /// Task `pid`'s eligible VMAs, read from its `mm-<pid>.img`; `None`
    /// where it has none, or where its host pid is not known.
    pub(super) fn open(
        images: &Path,
        pid: i32,
        host_pid: Option<i32>,
        lazy: &LazyPages,
    ) -> Result<Option<Self>, PageError> {
        let mode = ThpMode::host();
        if mode == ThpMode::Never {
            return Ok(None);
        }
        let path = images.join(format!("mm-{pid}.img"));
        let fail = |e: String| PageError::failed(Phase::Images, path.display(), e);
        let mm = std::fs::read(&path).map_err(|e| fail(format!("read: {e}")))?;
        let vmas = images::parse_vma_entries(&mm).map_err(fail)?;
        let vmas = eligible_vmas(&vmas, lazy, mode);
        let host_pid = host_pid.filter(|h| is_task(*h, pid));
        Ok(match (vmas.is_empty(), host_pid) {
            (false, Some(host_pid)) => Some(Huge {
                host_pid,
                vmas,
                taken: AtomicBool::new(false),
            }),
            _ => None,
        })
    }

    /// Whether `vaddr` is in an eligible VMA already unregistered: its
    /// pages are written, not copied, and its faults are the kernel's.
    pub(super) fn holds(&self, vaddr: u64) -> bool {
        self.taken.load(Ordering::Acquire) && {
            let i = self.vmas.partition_point(|v| v.1 <= vaddr);
            self.vmas.get(i).is_some_and(|v| v.0 <= vaddr)
        }
    }

    /// Keeps the VMAs `keep` says yes to, given each one's lazy bytes of
    /// `lazy` (before they are taken); returns the lazy bytes of the
    /// others, which stay registered and are copied in 4 KiB pages.
    pub(super) fn retain(&mut self, lazy: &LazyPages, mut keep: impl FnMut(u64) -> bool) -> u64 {
        let mut dropped = 0;
        self.vmas.retain(|&(start, end)| {
            let bytes = lazy_in(lazy, start, end);
            let kept = keep(bytes);
            if !kept {
                dropped += bytes;
            }
            kept
        });
        dropped
    }

    /// Whether no eligible VMA is left.
    pub(super) fn is_empty(&self) -> bool {
        self.vmas.is_empty()
    }

    /// A task's `Huge` of `vmas`, its host pid this process's.
    #[cfg(test)]
    pub(super) fn with_vmas(vmas: Vec<(u64, u64)>) -> Self {
        Huge {
            host_pid: std::process::id() as i32,
            vmas,
            taken: AtomicBool::new(false),
        }
    }

    /// Lazy bytes of `lazy` in the eligible VMAs.
    pub(super) fn bytes(&self, lazy: &LazyPages) -> u64 {
        lazy.ranges
            .iter()
            .filter(|r| {
                let i = self.vmas.partition_point(|v| v.1 <= r.vaddr);
                self.vmas.get(i).is_some_and(|v| v.0 <= r.vaddr)
            })
            .map(|r| r.len)
            .sum()
    }

    /// Unregisters every eligible VMA from `uffd` (task `pid`'s): from now
    /// on a touch of them is the kernel's fault, no more the server's.
    pub(super) fn take(&self, pid: i32, fd: &impl AsRawFd) -> Result<(), PageError> {
        for &(start, end) in &self.vmas {
            uffd::unregister(fd, start, end).map_err(|e| {
                let what = format!("UFFDIO_UNREGISTER of {start:#x}+{}: {e}", end - start);
                PageError::failed(Phase::Huge, task(pid), what)
            })?;
        }
        self.taken.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes `data` at `vaddr` of task `pid` (an eligible VMA, taken).
    pub(super) fn write(&self, pid: i32, vaddr: u64, data: &[u8]) -> Result<(), PageError> {
        let fail = |what: String| PageError::failed(Phase::Place, task(pid), what);
        let mut done = 0usize;
        while done < data.len() {
            let rest = &data[done..];
            let remote = [RemoteIoVec {
                base: (vaddr + done as u64) as usize,
                len: rest.len(),
            }];
            match process_vm_writev(Pid::from_raw(self.host_pid), &[IoSlice::new(rest)], &remote) {
                Ok(0) => {
                    return Err(fail(format!(
                        "process_vm_writev of {:#x}+{}: nothing written",
                        vaddr + done as u64,
                        rest.len()
                    )))
                }
                Ok(n) => done += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(fail(format!(
                        "process_vm_writev of {:#x}+{} (host pid {}): {e}",
                        vaddr + done as u64,
                        rest.len(),
                        self.host_pid
                    )))
                }
            }
        }
        Ok(())
    }
}

/// The lazy bytes of `lazy` within `[start, end)`.
fn lazy_in(lazy: &LazyPages, start: u64, end: u64) -> u64 {
    let i = lazy.ranges.partition_point(|r| r.vaddr + r.len <= start);
    lazy.ranges[i..]
        .iter()
        .take_while(|r| r.vaddr < end)
        .map(|r| (r.vaddr + r.len).min(end) - r.vaddr.max(start))
        .sum()
}

/// Whether host pid `host` is the task CRIU calls `pid` (the last `NSpid`
/// of `/proc/<host>/status`: its pid in its own namespace).
fn is_task(host: i32, pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{host}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|p| p.parse::<i32>().ok())
            == Some(pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::LazyRange;

    #[test]
    fn the_hosts_mode_is_the_bracketed_word() {
        assert_eq!(ThpMode::parse("always [madvise] never\n"), ThpMode::Madvise);
        assert_eq!(ThpMode::parse("[always] madvise never\n"), ThpMode::Always);
        assert_eq!(ThpMode::parse("always madvise [never]\n"), ThpMode::Never);
        assert_eq!(ThpMode::parse(""), ThpMode::Never);
    }

    #[test]
    fn eligible_is_madvise_hugepage_or_always_unless_nohugepage() {
        let (huge, nohuge, other) = (MADV_HUGEPAGE_BIT, MADV_NOHUGEPAGE_BIT, 1 << 3);
        assert!(eligible(huge, ThpMode::Madvise));
        assert!(eligible(huge | other, ThpMode::Madvise));
        assert!(!eligible(0, ThpMode::Madvise));
        assert!(!eligible(other, ThpMode::Madvise));
        assert!(eligible(0, ThpMode::Always));
        assert!(!eligible(nohuge, ThpMode::Always));
        assert!(!eligible(huge, ThpMode::Never));
        assert_eq!(MADV_HUGEPAGE_BIT, 1 << 14, "CRIU's bit for VM_HUGEPAGE");
    }

    #[test]
    fn only_eligible_vmas_holding_lazy_pages_are_taken() {
        let vma = |start, end, madv| Vma { start, end, madv };
        let vmas = [
            vma(0x20_0000, 0x80_0000, MADV_HUGEPAGE_BIT), // lazy pages inside
            vma(0x80_0000, 0xa0_0000, 0),                 // not advised
            vma(0xa0_0000, 0xc0_0000, MADV_HUGEPAGE_BIT), // no lazy pages
            vma(0xc0_0000, 0x100_0000, MADV_HUGEPAGE_BIT), // lazy from its middle
        ];
        let range = |vaddr, len, offset| LazyRange { vaddr, len, offset };
        let lazy = LazyPages {
            pages_id: 1,
            ranges: vec![
                range(0x30_0000, 0x10_0000, 0),
                range(0x80_0000, 0x1000, 0x10_0000),
                range(0xd0_0000, 0x2000, 0x10_1000),
            ],
        };
        let taken = eligible_vmas(&vmas, &lazy, ThpMode::Madvise);
        assert_eq!(taken, vec![(0x20_0000, 0x80_0000), (0xc0_0000, 0x100_0000)]);
        let all = eligible_vmas(&vmas, &lazy, ThpMode::Always);
        assert_eq!(all.len(), 3, "{all:x?}");
        assert!(eligible_vmas(&vmas, &lazy, ThpMode::Never).is_empty());
        let h = Huge {
            host_pid: 1,
            vmas: taken,
            taken: AtomicBool::new(false),
        };
        assert_eq!(h.bytes(&lazy), 0x10_0000 + 0x2000);
        assert!(!h.holds(0x30_0000), "nothing is held before it is taken");
        h.taken.store(true, Ordering::Release);
        assert!(h.holds(0x20_0000) && h.holds(0x7f_ffff) && h.holds(0xc0_0000));
        assert!(!h.holds(0x80_0000) && !h.holds(0xa0_0000) && !h.holds(0x100_0000));
    }

    #[test]
    fn a_task_is_known_by_its_innermost_pid() {
        let me = std::process::id() as i32;
        assert!(is_task(me, me), "no pid namespace: the same pid");
        assert!(!is_task(me, me + 1));
        assert!(!is_task(-1, me));
    }
}
