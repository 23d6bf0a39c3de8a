//! The host's free 2 MiB blocks, as `/proc/buddyinfo` counts them.
//!
//! A huge page is a free 2 MiB block of physical memory. The kernel counts
//! its free blocks per node, zone and order (a block of order n is 2^n
//! pages of 4 KiB): `Node 0, zone   Normal  18424 6248 ...`, one count per
//! order from 0. A free block of order n ≥ 9 holds 2^(n-9) blocks of 2 MiB.

/// Where the kernel counts its free blocks, per zone and order.
pub const PATH: &str = "/proc/buddyinfo";
/// A 2 MiB block's order (2^9 pages of 4 KiB).
pub const HUGE_ORDER: usize = 9;

/// The free 2 MiB blocks in a `/proc/buddyinfo` text, all zones added.
/// None where a line does not read as the kernel writes it.
pub fn free_huge_blocks_in(text: &str) -> Option<u64> {
    let mut blocks = 0u64;
    let mut zones = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // "Node 0, zone   Normal  18424 6248 ..." : counts per order.
        let counts = line.split_once(" zone ")?.1.split_whitespace().skip(1);
        for (order, count) in counts.enumerate() {
            let count: u64 = count.parse().ok()?;
            if order >= HUGE_ORDER {
                blocks = blocks.saturating_add(count << (order - HUGE_ORDER).min(32));
            }
        }
        zones += 1;
    }
    (zones > 0).then_some(blocks)
}

/// This host's free 2 MiB blocks now; None where `/proc/buddyinfo`
/// cannot be read (or does not read as the kernel writes it).
pub fn free_huge_blocks() -> Option<u64> {
    std::fs::read_to_string(PATH)
        .ok()
        .and_then(|t| free_huge_blocks_in(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_blocks_count_every_order_from_nine_in_two_mib_blocks() {
        let text = "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n\
Node 0, zone    DMA32     89    105    100     98     86     80     71     57     37     27    715 \n\
Node 0, zone   Normal  18424   6248   4138   4245   2651   3810   2525   1837   1268    665   3145 \n";
        // Order 9: 1 + 27 + 665; order 10, two blocks each: 3 + 715 + 3145.
        assert_eq!(free_huge_blocks_in(text), Some(693 + 2 * 3863));
        let two_nodes = "Node 0, zone   Normal 0 0 0 0 0 0 0 0 0 4 0\nNode 1, zone   Normal 0 0 0 0 0 0 0 0 0 0 1\n";
        assert_eq!(free_huge_blocks_in(two_nodes), Some(6));
        let cut_up = "Node 0, zone   Normal 9000 9000 9000 9000 9000 9000 9000 9000 9000 0 0\n";
        assert_eq!(
            free_huge_blocks_in(cut_up),
            Some(0),
            "small blocks make no huge page"
        );
    }

    #[test]
    fn a_text_the_kernel_did_not_write_counts_nothing() {
        assert_eq!(free_huge_blocks_in(""), None);
        assert_eq!(free_huge_blocks_in("Node 0, zone Normal 1 x 3\n"), None);
        assert_eq!(free_huge_blocks_in("no zones here\n"), None);
    }

    #[test]
    fn this_host_reads_its_own() {
        // Every Linux with a buddy allocator has the file.
        if std::path::Path::new(PATH).exists() {
            assert!(free_huge_blocks().is_some());
        }
    }
}
