//! Which eligible VMAs go huge now: the runtime config's `huge_pages`
//! against the host's free 2 MiB blocks.
//!
//! A huge page is a free 2 MiB block of physical memory. Where the host
//! has none at hand (its memory held by the page cache, or cut up), the
//! kernel's fault in a VMA marked `MADV_HUGEPAGE` reclaims and compacts
//! memory until it has one (THP `defrag` = `madvise`, the default; every
//! fault under `always`), a stall per 2 MiB. Under `when-free`, the server
//! writes an eligible VMA through the fault path only while the free
//! blocks counted in `/proc/buddyinfo` (`vsnap_host::buddyinfo`) cover its
//! pages; the VMAs past them stay registered and are copied in 4 KiB
//! pages, which khugepaged may collapse later, in the background, as it
//! does for any THP fault that fell back.
//!
//! The count is read once per restore, before the fillers start: restores
//! under way at once each read the same count, so together they may take
//! more than it (the kernel then compacts, as it would have).

use vsnap_config::HugePages;

use crate::images::LazyPages;

use super::huge::Huge;
use super::task::Task;

/// A huge page's bytes.
const HUGE_PAGE: u64 = 2 << 20;

/// What the server chose for the eligible memory of a restore.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HugeChoice {
    /// Eligible lazy bytes placed in 4 KiB pages instead (`never`, or past
    /// the free blocks under `when-free`).
    pub declined_bytes: u64,
    /// The host's free 2 MiB blocks when it chose (`when-free` only; none
    /// where `/proc/buddyinfo` could not be read: every eligible VMA then
    /// goes huge, as the kernel decides).
    pub free_blocks: Option<u64>,
}

/// Keeps, of the tasks' eligible VMAs (in task then address order), those
/// `policy` places as huge pages, given `free` blocks; the others leave
/// the task's `Huge` (a task left with none has no `Huge`) and are copied
/// as 4 KiB pages.
fn settle_with<'a>(
    tasks: impl Iterator<Item = (&'a LazyPages, &'a mut Option<Huge>)>,
    policy: HugePages,
    free: Option<u64>,
) -> HugeChoice {
    let mut left = free;
    let mut declined = 0;
    for (lazy, task_huge) in tasks {
        let Some(huge) = task_huge.as_mut() else {
            continue;
        };
        declined += huge.retain(lazy, |bytes| match (policy, left.as_mut()) {
            (HugePages::Never, _) => false,
            (HugePages::Always, _) | (HugePages::WhenFree, None) => true,
            (HugePages::WhenFree, Some(left)) => {
                let need = bytes.div_ceil(HUGE_PAGE);
                let fits = need <= *left;
                if fits {
                    *left -= need;
                }
                fits
            }
        });
        if huge.is_empty() {
            *task_huge = None;
        }
    }
    HugeChoice {
        declined_bytes: declined,
        free_blocks: free,
    }
}

/// `settle_with` against this host's free blocks, read now where the
/// policy asks for them.
pub(super) fn settle(tasks: &mut [Task], policy: HugePages) -> HugeChoice {
    let any = tasks.iter().any(|t| t.huge.is_some());
    let free = match (any, policy) {
        (true, HugePages::WhenFree) => vsnap_host::buddyinfo::free_huge_blocks(),
        _ => None,
    };
    let tasks = tasks.iter_mut().map(|t| (&t.lazy, &mut t.huge));
    settle_with(tasks, policy, free)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::LazyRange;

    const MIB: u64 = 1 << 20;

    /// Two tasks: the first with eligible VMAs of 6 MiB and 3 MiB of lazy
    /// pages, the second with one of 4 MiB.
    fn two_tasks() -> Vec<(LazyPages, Option<Huge>)> {
        let range = |vaddr, len| LazyRange {
            vaddr,
            len,
            offset: 0,
        };
        let lazy = |ranges| LazyPages {
            pages_id: 1,
            ranges,
        };
        vec![
            (
                lazy(vec![
                    range(0x4000_0000, 6 * MIB),
                    range(0x8000_0000, 3 * MIB),
                ]),
                Some(Huge::with_vmas(vec![
                    (0x4000_0000, 0x4000_0000 + 8 * MIB),
                    (0x8000_0000, 0x8000_0000 + 4 * MIB),
                ])),
            ),
            (
                lazy(vec![range(0x4000_0000, 4 * MIB)]),
                Some(Huge::with_vmas(vec![(0x4000_0000, 0x4000_0000 + 4 * MIB)])),
            ),
        ]
    }

    fn settle_two(policy: HugePages, free: Option<u64>) -> (HugeChoice, Vec<Option<u64>>) {
        let mut tasks = two_tasks();
        let choice = settle_with(tasks.iter_mut().map(|(l, h)| (&*l, h)), policy, free);
        let kept = tasks
            .iter()
            .map(|(l, h)| h.as_ref().map(|h| h.bytes(l)))
            .collect();
        (choice, kept)
    }

    #[test]
    fn when_free_takes_vmas_in_order_while_the_free_blocks_cover_them() {
        // 6 MiB needs 3 blocks, 3 MiB 2, 4 MiB 2.
        let (c, kept) = settle_two(HugePages::WhenFree, Some(5));
        assert_eq!(
            kept,
            vec![Some(9 * MIB), None],
            "the second task is left none"
        );
        assert_eq!(c.declined_bytes, 4 * MIB);
        assert_eq!(c.free_blocks, Some(5));
        // The 3 MiB VMA does not fit in what the first left; the next does.
        let (c, kept) = settle_two(HugePages::WhenFree, Some(4));
        assert_eq!(kept, vec![Some(6 * MIB), None]);
        assert_eq!(c.declined_bytes, 7 * MIB);
        let (c, kept) = settle_two(HugePages::WhenFree, Some(0));
        assert_eq!((c.declined_bytes, kept), (13 * MIB, vec![None, None]));
        let (c, kept) = settle_two(HugePages::WhenFree, Some(7));
        assert_eq!(
            (c.declined_bytes, kept),
            (0, vec![Some(9 * MIB), Some(4 * MIB)])
        );
    }

    #[test]
    fn always_takes_every_eligible_vma_and_never_none() {
        let (c, kept) = settle_two(HugePages::Always, Some(0));
        assert_eq!(
            (c.declined_bytes, kept),
            (0, vec![Some(9 * MIB), Some(4 * MIB)])
        );
        let (c, kept) = settle_two(HugePages::Never, None);
        assert_eq!((c.declined_bytes, kept), (13 * MIB, vec![None, None]));
        // Unknown free blocks: the kernel decides, as before the policy.
        let (c, _) = settle_two(HugePages::WhenFree, None);
        assert_eq!(c, HugeChoice::default());
    }
}
