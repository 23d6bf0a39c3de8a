//! The little of CRIU's image format vsnap's page server reads: a task's
//! pagemap (which address ranges have pages, where in `pages-<id>.img`
//! they are, and which of them CRIU leaves to a lazy-pages server) and its
//! VMAs (a `UFFDIO_COPY` must stay inside one VMA).
//!
//! Format (CRIU 4.x, `criu/image.c`, `images/pagemap.proto`, `mm.proto`):
//! a file starts with the common magic and the image's own magic (two u32
//! little-endian), then protobuf messages, each preceded by its u32 size.
//! `pagemap-<pid>.img` holds a `pagemap_head { pages_id = 1 }`, then one
//! `pagemap_entry { vaddr = 1; compat_nr_pages = 2; in_parent = 3;
//! flags = 4; nr_pages = 5 }` per range; the pages of every entry flagged
//! `PE_PRESENT` follow one another in `pages-<pages_id>.img`.
//! `mm-<pid>.img` holds one `mm_entry` whose field 14 repeats
//! `vma_entry { start = 1; end = 2; ... }`. The framing is read here, the
//! messages by prost (`pb`: only the fields above).

use std::path::Path;

use crate::error::{PageError, Phase};

pub const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
pub const PAGEMAP_MAGIC: u32 = 0x5608_4025;
pub const MM_MAGIC: u32 = 0x5749_2820;

/// `criu/include/pagemap.h`.
pub const PE_PARENT: u32 = 1 << 0;
pub const PE_LAZY: u32 = 1 << 1;
pub const PE_PRESENT: u32 = 1 << 2;

pub const PAGE_SIZE: u64 = 4096;

/// One range of a task's pagemap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagemapEntry {
    pub vaddr: u64,
    pub nr_pages: u64,
    pub flags: u32,
}

/// A range CRIU leaves to the lazy-pages server: `len` bytes at `vaddr`,
/// found at `offset` in the pages file, inside one VMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LazyRange {
    pub vaddr: u64,
    pub len: u64,
    pub offset: u64,
}

/// What a task's images say about its lazily restored memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LazyPages {
    pub pages_id: u32,
    pub ranges: Vec<LazyRange>,
}

impl LazyPages {
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    /// The ranges whose pages lie in `[start, end)` of the pages file (in
    /// part or whole), in file order.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &LazyRange> {
        let i = self.ranges.partition_point(|r| r.offset + r.len <= start);
        self.ranges[i..].iter().take_while(move |r| r.offset < end)
    }

    /// The range holding `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<&LazyRange> {
        let i = self.ranges.partition_point(|r| r.vaddr + r.len <= addr);
        self.ranges.get(i).filter(|r| r.vaddr <= addr)
    }
}

/// Reads task `pid`'s pagemap and VMAs from `images`.
pub fn lazy_pages(images: &Path, pid: i32) -> Result<LazyPages, PageError> {
    let pagemap_path = images.join(format!("pagemap-{pid}.img"));
    let in_pagemap = |e: String| PageError::failed(Phase::Images, pagemap_path.display(), e);
    let pagemap = std::fs::read(&pagemap_path).map_err(|e| in_pagemap(format!("read: {e}")))?;
    let (pages_id, entries) = parse_pagemap(&pagemap).map_err(in_pagemap)?;
    let mm_path = images.join(format!("mm-{pid}.img"));
    let in_mm = |e: String| PageError::failed(Phase::Images, mm_path.display(), e);
    let mm = std::fs::read(&mm_path).map_err(|e| in_mm(format!("read: {e}")))?;
    let vmas = parse_vmas(&mm).map_err(in_mm)?;
    let ranges = lazy_ranges(&entries, &vmas).map_err(in_pagemap)?;
    Ok(LazyPages { pages_id, ranges })
}

/// The lazy, present ranges of `entries` with their offsets in the pages
/// file, split at VMA boundaries (`vmas` as sorted `(start, end)`).
pub fn lazy_ranges(
    entries: &[PagemapEntry],
    vmas: &[(u64, u64)],
) -> Result<Vec<LazyRange>, String> {
    let mut ranges = Vec::new();
    let mut offset = 0u64;
    for e in entries {
        let len = e.nr_pages * PAGE_SIZE;
        let present = e.flags & PE_PRESENT != 0;
        if e.flags & PE_LAZY != 0 {
            if !present {
                // A lazy-migration dump: the pages are on another host.
                return Err(format!(
                    "pagemap entry {:#x}+{len} is lazy but its pages are not in the image",
                    e.vaddr
                ));
            }
            let (mut start, end) = (e.vaddr, e.vaddr + len);
            while start < end {
                let vma = vmas
                    .iter()
                    .find(|(s, e)| *s <= start && start < *e)
                    .ok_or_else(|| format!("no VMA holds the lazy page at {start:#x}"))?;
                let stop = end.min(vma.1);
                ranges.push(LazyRange {
                    vaddr: start,
                    len: stop - start,
                    offset: offset + (start - e.vaddr),
                });
                start = stop;
            }
        }
        if present {
            offset += len;
        }
    }
    // CRIU writes a pagemap in address order, so the pages file is in
    // address order too: both lookups (by address, by file offset) rely on it.
    if ranges
        .windows(2)
        .any(|w| w[1].vaddr < w[0].vaddr + w[0].len || w[1].offset < w[0].offset + w[0].len)
    {
        return Err("the pagemap is not in address order".into());
    }
    Ok(ranges)
}

/// `pagemap-<pid>.img`: the pages file id and the entries, in order.
pub fn parse_pagemap(bytes: &[u8]) -> Result<(u32, Vec<PagemapEntry>), String> {
    let mut messages = messages(bytes, PAGEMAP_MAGIC)?;
    let head: pb::PagemapHead = decode(messages.next().ok_or("no pagemap head")??, "pagemap head")?;
    let pages_id = head.pages_id.ok_or("the pagemap head has no pages_id")?;
    let mut entries = Vec::new();
    for m in messages {
        let e: pb::PagemapEntry = decode(m?, "pagemap entry")?;
        // As CRIU reads old images (init_compat_pagemap_entry).
        let flags = match e.flags {
            _ if e.in_parent == Some(true) => PE_PARENT,
            Some(f) => f,
            None => PE_PRESENT,
        };
        entries.push(PagemapEntry {
            vaddr: e.vaddr.ok_or("a pagemap entry has no vaddr")?,
            nr_pages: e
                .nr_pages
                .unwrap_or_else(|| e.compat_nr_pages.map_or(0, u64::from)),
            flags,
        });
    }
    Ok((pages_id, entries))
}

/// `mm-<pid>.img`: the VMAs as `(start, end)`, sorted.
pub fn parse_vmas(bytes: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    Ok(parse_vma_entries(bytes)?
        .into_iter()
        .map(|v| (v.start, v.end))
        .collect())
}

/// A VMA of a task's `mm-<pid>.img`: its bounds and its madvise bits
/// (`1 << MADV_HUGEPAGE` and the like, as CRIU records them from
/// `/proc/<pid>/smaps`' `VmFlags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub madv: u64,
}

/// `mm-<pid>.img`: the VMAs, sorted.
pub fn parse_vma_entries(bytes: &[u8]) -> Result<Vec<Vma>, String> {
    let mm: pb::MmEntry = decode(
        messages(bytes, MM_MAGIC)?.next().ok_or("no mm entry")??,
        "mm entry",
    )?;
    let mut vmas = Vec::with_capacity(mm.vmas.len());
    for vma in mm.vmas {
        vmas.push(Vma {
            start: vma.start.ok_or("a VMA has no start")?,
            end: vma.end.ok_or("a VMA has no end")?,
            madv: vma.madv.unwrap_or(0),
        });
    }
    vmas.sort_unstable_by_key(|v| (v.start, v.end));
    Ok(vmas)
}

/// The size-prefixed messages after the two magics.
pub(super) fn messages(
    bytes: &[u8],
    magic: u32,
) -> Result<impl Iterator<Item = Result<&[u8], String>>, String> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    if word(0) != Some(IMG_COMMON_MAGIC) || word(4) != Some(magic) {
        return Err(format!("not a CRIU image of magic {magic:#x}"));
    }
    let mut at = 8usize;
    Ok(std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let size = match word(at) {
            Some(s) => s as usize,
            None => return Some(Err("a truncated message size".to_string())),
        };
        let body = bytes.get(at + 4..at + 4 + size);
        at += 4 + size;
        Some(body.ok_or_else(|| "a truncated message".to_string()))
    }))
}

/// One message's body as `M`. prost cannot tell a body cut short from
/// garbage (both read as an invalid varint or a buffer underflow), hence
/// the one text for both.
pub(super) fn decode<M: prost::Message + Default>(body: &[u8], what: &str) -> Result<M, String> {
    M::decode(body).map_err(|e| format!("a truncated or malformed {what}: {e}"))
}

/// The fields vsnap reads of CRIU's messages, under CRIU's numbers and
/// types; prost skips the others. CRIU declares most of them `required`:
/// they are `optional` here so that a missing one is told apart from 0.
pub(super) mod pb {
    /// `images/pagemap.proto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PagemapHead {
        #[prost(uint32, optional, tag = "1")]
        pub pages_id: Option<u32>,
    }

    /// `images/pagemap.proto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PagemapEntry {
        #[prost(uint64, optional, tag = "1")]
        pub vaddr: Option<u64>,
        #[prost(uint32, optional, tag = "2")]
        pub compat_nr_pages: Option<u32>,
        #[prost(bool, optional, tag = "3")]
        pub in_parent: Option<bool>,
        #[prost(uint32, optional, tag = "4")]
        pub flags: Option<u32>,
        #[prost(uint64, optional, tag = "5")]
        pub nr_pages: Option<u64>,
    }

    /// `images/mm.proto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MmEntry {
        #[prost(message, repeated, tag = "14")]
        pub vmas: Vec<VmaEntry>,
    }

    /// `images/vma.proto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VmaEntry {
        #[prost(uint64, optional, tag = "1")]
        pub start: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        pub end: Option<u64>,
        /// `MAP_*` flags.
        #[prost(uint32, optional, tag = "6")]
        pub flags: Option<u32>,
        /// CRIU's `VMA_*` status bits (`criu/include/image.h`).
        #[prost(uint32, optional, tag = "7")]
        pub status: Option<u32>,
        /// The madvise bits (`1 << MADV_*`).
        #[prost(uint64, optional, tag = "9")]
        pub madv: Option<u64>,
    }
}

/// Builders of CRIU images as CRIU writes them, for tests here and of the
/// page server.
#[cfg(test)]
pub mod testing {
    use super::*;

    pub fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// A varint field `n` of value `v`.
    pub fn field(n: u64, v: u64, out: &mut Vec<u8>) {
        varint(n << 3, out);
        varint(v, out);
    }

    /// The two magics, then each message with its u32 size.
    pub fn image(magic: u32, messages: &[Vec<u8>]) -> Vec<u8> {
        let mut out = IMG_COMMON_MAGIC.to_le_bytes().to_vec();
        out.extend(magic.to_le_bytes());
        for m in messages {
            out.extend((m.len() as u32).to_le_bytes());
            out.extend(m);
        }
        out
    }

    /// A `pagemap_entry` (flags left out: an old image's entry).
    pub fn entry(vaddr: u64, pages: u64, flags: Option<u32>) -> Vec<u8> {
        let mut m = Vec::new();
        field(1, vaddr, &mut m);
        field(2, pages, &mut m);
        if let Some(f) = flags {
            field(4, u64::from(f), &mut m);
        }
        m
    }

    /// An mm image's body with one VMA, no madvise bits.
    pub fn mm(start: u64, end: u64) -> Vec<u8> {
        mm_advised(&[(start, end, None)])
    }

    /// An `mm_entry` holding VMAs `[start, end)` with their madvise bits
    /// (left out where `None`, as CRIU leaves them out when empty).
    pub fn mm_advised(vmas: &[(u64, u64, Option<u64>)]) -> Vec<u8> {
        let mut mm = Vec::new();
        for &(start, end, madv) in vmas {
            let mut vma = Vec::new();
            field(1, start, &mut vma);
            field(2, end, &mut vma);
            if let Some(m) = madv {
                field(9, m, &mut vma);
            }
            varint((14 << 3) | 2, &mut mm);
            varint(vma.len() as u64, &mut mm);
            mm.extend(vma);
        }
        mm
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn a_pagemap_is_read_with_offsets_and_split_at_vmas() {
        let mut head = Vec::new();
        field(1, 7, &mut head);
        let bytes = image(
            PAGEMAP_MAGIC,
            &[
                head,
                // Present, not lazy (a stack page): takes room in the file.
                entry(0x1000, 1, Some(PE_PRESENT)),
                // Lazy across two VMAs.
                entry(0x10000, 4, Some(PE_PRESENT | PE_LAZY)),
                // In a parent image: no room in this file.
                entry(0x40000, 2, Some(PE_PARENT)),
                // An old image without flags: present.
                entry(0x50000, 1, None),
                entry(0x60000, 2, Some(PE_PRESENT | PE_LAZY)),
            ],
        );
        let (id, entries) = parse_pagemap(&bytes).unwrap();
        assert_eq!(id, 7);
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[3].flags, PE_PRESENT);
        let vmas = [
            (0x1000, 0x2000),
            (0x10000, 0x12000),
            (0x12000, 0x20000),
            (0x60000, 0x70000),
        ];
        let ranges = lazy_ranges(&entries, &vmas).unwrap();
        assert_eq!(
            ranges,
            vec![
                LazyRange {
                    vaddr: 0x10000,
                    len: 0x2000,
                    offset: 0x1000
                },
                LazyRange {
                    vaddr: 0x12000,
                    len: 0x2000,
                    offset: 0x3000
                },
                LazyRange {
                    vaddr: 0x60000,
                    len: 0x2000,
                    offset: 0x6000
                },
            ]
        );
        let pages = LazyPages {
            pages_id: id,
            ranges,
        };
        assert_eq!(pages.bytes(), 0x6000);
        assert_eq!(pages.find(0x12fff).unwrap().vaddr, 0x12000);
        assert!(pages.find(0x14000).is_none());
        assert!(pages.find(0x0fff).is_none());
        let in_file: Vec<u64> = pages.overlapping(0x2000, 0x4000).map(|r| r.vaddr).collect();
        assert_eq!(in_file, vec![0x10000, 0x12000]);
        assert_eq!(pages.overlapping(0x5000, 0x6000).count(), 0);
        assert_eq!(pages.overlapping(0x7fff, 0x9000).count(), 1);
    }

    #[test]
    fn vmas_are_read_from_field_14_of_the_mm_entry() {
        let mut vma = Vec::new();
        field(1, 0x7000, &mut vma);
        field(2, 0x9000, &mut vma);
        field(6, 0x22, &mut vma);
        let mut mm = Vec::new();
        field(1, 0x400000, &mut mm);
        varint((14 << 3) | 2, &mut mm);
        varint(vma.len() as u64, &mut mm);
        mm.extend(&vma);
        let bytes = image(MM_MAGIC, &[mm]);
        assert_eq!(parse_vmas(&bytes).unwrap(), vec![(0x7000, 0x9000)]);
    }

    #[test]
    fn a_vmas_madvise_bits_are_field_9_and_absent_reads_as_none() {
        let mm = mm_advised(&[
            (0x20_0000, 0x60_0000, Some(1 << 14)),
            (0x1000, 0x2000, None),
        ]);
        let vmas = parse_vma_entries(&image(MM_MAGIC, &[mm])).unwrap();
        let want = [(0x1000, 0x2000, 0), (0x20_0000, 0x60_0000, 1 << 14)];
        let got: Vec<_> = vmas.iter().map(|v| (v.start, v.end, v.madv)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn messages_prost_encodes_are_read_field_by_field() {
        use prost::Message;
        let head = pb::PagemapHead { pages_id: Some(9) };
        let entry = |vaddr, compat, in_parent, flags, nr_pages| pb::PagemapEntry {
            vaddr: Some(vaddr),
            compat_nr_pages: Some(compat),
            in_parent,
            flags,
            nr_pages,
        };
        let bytes = image(
            PAGEMAP_MAGIC,
            &[
                head.encode_to_vec(),
                // nr_pages wins over compat_nr_pages; flags as written.
                entry(
                    0x7f00_0000_1000,
                    1,
                    Some(false),
                    Some(PE_LAZY | PE_PRESENT),
                    Some(300),
                )
                .encode_to_vec(),
                // in_parent wins over flags.
                entry(0x7f00_0100_0000, 2, Some(true), Some(PE_PRESENT), Some(2)).encode_to_vec(),
                // An old image: compat_nr_pages only, no flags: present.
                entry(0x7f00_0200_0000, 3, None, None, None).encode_to_vec(),
            ],
        );
        let (id, entries) = parse_pagemap(&bytes).unwrap();
        assert_eq!(id, 9);
        assert_eq!(
            entries,
            vec![
                PagemapEntry {
                    vaddr: 0x7f00_0000_1000,
                    nr_pages: 300,
                    flags: PE_LAZY | PE_PRESENT
                },
                PagemapEntry {
                    vaddr: 0x7f00_0100_0000,
                    nr_pages: 2,
                    flags: PE_PARENT
                },
                PagemapEntry {
                    vaddr: 0x7f00_0200_0000,
                    nr_pages: 3,
                    flags: PE_PRESENT
                },
            ]
        );
        let vma = |start, end| pb::VmaEntry {
            start: Some(start),
            end: Some(end),
            ..Default::default()
        };
        let mm = pb::MmEntry {
            vmas: vec![vma(0x9000, 0xa000), vma(0x1000, 0x3000)],
        };
        assert_eq!(
            parse_vmas(&image(MM_MAGIC, &[mm.encode_to_vec()])).unwrap(),
            vec![(0x1000, 0x3000), (0x9000, 0xa000)]
        );
        let no_end = pb::MmEntry {
            vmas: vec![pb::VmaEntry {
                start: Some(0x1000),
                end: None,
                ..Default::default()
            }],
        };
        assert!(parse_vmas(&image(MM_MAGIC, &[no_end.encode_to_vec()]))
            .unwrap_err()
            .contains("no end"));
    }

    #[test]
    fn a_message_cut_short_or_garbage_inside_its_frame_is_refused() {
        use prost::Message;
        let head = pb::PagemapHead { pages_id: Some(1) }.encode_to_vec();
        let mut cut = pb::PagemapEntry {
            vaddr: Some(0x1000),
            nr_pages: Some(300),
            ..Default::default()
        }
        .encode_to_vec();
        // The frame is whole; the message ends inside nr_pages' varint.
        cut.pop();
        let e = parse_pagemap(&image(PAGEMAP_MAGIC, &[head.clone(), cut])).unwrap_err();
        assert!(
            e.contains("truncated") && e.contains("pagemap entry"),
            "{e}"
        );
        // Wire type 7 does not exist.
        let e = parse_pagemap(&image(PAGEMAP_MAGIC, &[head, vec![0x0f]])).unwrap_err();
        assert!(e.contains("malformed pagemap entry"), "{e}");
        // A VMA longer than the mm entry holding it.
        let e = parse_vmas(&image(MM_MAGIC, &[vec![(14 << 3) | 2, 4, 8, 1]])).unwrap_err();
        assert!(e.contains("truncated") && e.contains("mm entry"), "{e}");
    }

    #[test]
    fn bad_images_are_refused_naming_why() {
        assert!(parse_pagemap(&image(MM_MAGIC, &[]))
            .unwrap_err()
            .contains("magic"));
        let mut bytes = image(PAGEMAP_MAGIC, &[vec![8, 1]]);
        bytes.truncate(bytes.len() - 1);
        assert!(parse_pagemap(&bytes).unwrap_err().contains("truncated"));
        let lazy_elsewhere = [PagemapEntry {
            vaddr: 0x1000,
            nr_pages: 1,
            flags: PE_LAZY,
        }];
        assert!(lazy_ranges(&lazy_elsewhere, &[(0, 0x10000)])
            .unwrap_err()
            .contains("not in the image"));
        let outside = [PagemapEntry {
            vaddr: 0x1000,
            nr_pages: 1,
            flags: PE_LAZY | PE_PRESENT,
        }];
        assert!(lazy_ranges(&outside, &[]).unwrap_err().contains("no VMA"));
        let unordered = [
            PagemapEntry {
                vaddr: 0x9000,
                nr_pages: 1,
                flags: PE_LAZY | PE_PRESENT,
            },
            PagemapEntry {
                vaddr: 0x1000,
                nr_pages: 1,
                flags: PE_LAZY | PE_PRESENT,
            },
        ];
        assert!(lazy_ranges(&unordered, &[(0, 0x10000)])
            .unwrap_err()
            .contains("address order"));
    }
}
