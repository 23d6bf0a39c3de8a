#!/usr/bin/env python3
"""How fast this host faults in 1 GiB of memory advised MADV_HUGEPAGE (huge
pages) or MADV_NOHUGEPAGE (4 KiB pages), right after the same amount was
freed and after 5 s idle.

On a VM whose balloon reports free pages (virtio-balloon REPORTING,
/sys/module/page_reporting/parameters/page_reporting_order = 9), the guest
hands every free 2 MiB block back to the hypervisor about 2 s after it was
freed; a huge page taken from such a block is faulted in again by the
hypervisor. 4 KiB pages come from the kernel's per-CPU lists, recently used.
Run as any user; prints one line per round (docs/page-server.md, "Huge
pages")."""
import mmap
import time

N = 1 << 30


def touch(advice):
    m = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(advice)
    t = time.perf_counter()
    for i in range(0, N, 4096):
        m[i] = 1
    dt = time.perf_counter() - t
    m.close()
    return dt


HUGE, SMALL = mmap.MADV_HUGEPAGE, mmap.MADV_NOHUGEPAGE
ROUNDS = [
    ("huge, after 5 s idle", HUGE, 5), ("huge, right after", HUGE, 0),
    ("huge, right after", HUGE, 0), ("huge, after 5 s idle", HUGE, 5),
    ("4 KiB, after 5 s idle", SMALL, 5), ("4 KiB, right after", SMALL, 0),
    ("huge, after 5 s idle", HUGE, 5), ("huge, right after", HUGE, 0),
]
for label, advice, idle in ROUNDS:
    time.sleep(idle)
    print(f"{label:24s} {touch(advice) * 1000:7.0f} ms for 1 GiB")
