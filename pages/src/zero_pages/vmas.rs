//! Which VMAs of a task may lose their all-zero pages: the missing pages
//! of plain private anonymous memory read as zeros (see the module above).

use super::super::images::{decode, messages, pb, MM_MAGIC};

// `mmap(2)` flags as CRIU records them in `vma_entry.flags`.
pub(super) const MAP_SHARED: u32 = 0x01;
pub(super) const MAP_PRIVATE: u32 = 0x02;
pub(super) const MAP_ANONYMOUS: u32 = 0x20;
pub(super) const MAP_HUGETLB: u32 = 0x4_0000;
// `criu/include/image.h`: `vma_entry.status`.
pub(super) const VMA_AREA_REGULAR: u32 = 1 << 0;
pub(super) const VMA_ANON_PRIVATE: u32 = 1 << 9;
/// Every status bit that makes a VMA more than plain private anonymous
/// memory: stack, vsyscall, vDSO, file-backed (private or shared), shared
/// anonymous, SysV IPC, socket, vvar, AIO ring, memfd, shadow stack,
/// guard, uprobes, a plugin's.
pub(super) const VMA_NOT_PLAIN: u32 = (1 << 1)
    | (1 << 2)
    | (1 << 3)
    | (1 << 6)
    | (1 << 7)
    | (1 << 8)
    | (1 << 10)
    | (1 << 11)
    | (1 << 12)
    | (1 << 13)
    | (1 << 14)
    | (1 << 15)
    | (1 << 16)
    | (1 << 17)
    | (1 << 27);

/// The VMAs of `mm-<pid>.img` whose missing pages read as zeros: private
/// anonymous memory, not hugetlb, nothing CRIU treats apart; as sorted
/// `(start, end)`.
pub(super) fn elidable(mm: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    let mm: pb::MmEntry = decode(
        messages(mm, MM_MAGIC)?.next().ok_or("no mm entry")??,
        "mm entry",
    )?;
    let mut vmas = Vec::new();
    for vma in mm.vmas {
        let (flags, status) = (vma.flags.unwrap_or(0), vma.status.unwrap_or(0));
        let plain = status & VMA_AREA_REGULAR != 0
            && status & VMA_ANON_PRIVATE != 0
            && status & VMA_NOT_PLAIN == 0
            && flags & (MAP_PRIVATE | MAP_ANONYMOUS) == MAP_PRIVATE | MAP_ANONYMOUS
            && flags & (MAP_SHARED | MAP_HUGETLB) == 0;
        if plain {
            vmas.push((
                vma.start.ok_or("a VMA has no start")?,
                vma.end.ok_or("a VMA has no end")?,
            ));
        }
    }
    vmas.sort_unstable();
    Ok(vmas)
}

/// A task's elidable VMAs, sorted, for lookups by address.
pub(super) struct Elidable(Vec<(u64, u64)>);

impl Elidable {
    /// The elidable VMAs of `mm-<pid>.img`.
    pub(super) fn of_mm(mm: &[u8]) -> Result<Self, String> {
        elidable(mm).map(Elidable)
    }

    /// Whether the page at `vaddr` lies in an elidable VMA.
    pub(super) fn contains(&self, vaddr: u64) -> bool {
        let i = self.0.partition_point(|v| v.1 <= vaddr);
        self.0.get(i).is_some_and(|v| v.0 <= vaddr)
    }

    /// Whether any of `start..end` lies in an elidable VMA.
    pub(super) fn overlaps(&self, start: u64, end: u64) -> bool {
        let i = self.0.partition_point(|v| v.1 <= start);
        self.0.get(i).is_some_and(|v| v.0 < end)
    }
}
