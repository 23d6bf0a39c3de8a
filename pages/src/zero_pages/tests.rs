//! The rewrite on images written as CRIU writes them, read back with the
//! page server's own reader.

use std::collections::BTreeMap;
use std::path::Path;

use prost::Message;

use super::compaction::is_zero;
use super::vmas::*;
use super::*;
use crate::images::testing::image;
use crate::images::{lazy_ranges, parse_pagemap, parse_vmas, MM_MAGIC, PE_LAZY, PE_PARENT};

const P: u64 = PAGE_SIZE;
const ANON: (u32, u32) = (
    MAP_PRIVATE | MAP_ANONYMOUS,
    VMA_AREA_REGULAR | VMA_ANON_PRIVATE,
);
/// A private mapping of a file: a missing page would read the file.
const FILE_PRIVATE: (u32, u32) = (MAP_PRIVATE, VMA_AREA_REGULAR | (1 << 6));
const SHARED_ANON: (u32, u32) = (MAP_SHARED | MAP_ANONYMOUS, VMA_AREA_REGULAR | (1 << 8));
const HUGETLB: (u32, u32) = (
    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB,
    VMA_AREA_REGULAR | VMA_ANON_PRIVATE,
);

/// A page: all zero for `None`, else filled with the byte (never 0).
fn page(fill: Option<u8>) -> Vec<u8> {
    let mut p = vec![0u8; P as usize];
    if let Some(b) = fill {
        // One non-zero byte near the end: the check must look at all of it.
        p[P as usize - 3] = b;
    }
    p
}

/// A VMA: start, end, `(flags, status)`.
type Vma = (u64, u64, (u32, u32));

/// One pagemap entry and its pages (None: no pages in the file).
struct Range {
    vaddr: u64,
    flags: u32,
    pages: Vec<Option<u8>>,
}

fn range(vaddr: u64, flags: u32, pages: &[Option<u8>]) -> Range {
    Range {
        vaddr,
        flags,
        pages: pages.to_vec(),
    }
}

/// Writes task `pid`'s images into `dir` (pages file 3) as CRIU 4.2 does:
/// `vaddr`, `compat_nr_pages` 0, `flags`, `nr_pages`.
fn write_task(dir: &Path, pid: u32, vmas: &[Vma], ranges: &[Range]) {
    let head = pb::PagemapHead { pages_id: Some(3) }.encode_to_vec();
    let mut messages = vec![head];
    let mut pages = Vec::new();
    for r in ranges {
        messages.push(
            pb::PagemapEntry {
                vaddr: Some(r.vaddr),
                compat_nr_pages: Some(0),
                in_parent: None,
                flags: Some(r.flags),
                nr_pages: Some(r.pages.len() as u64),
            }
            .encode_to_vec(),
        );
        if r.flags & PE_PRESENT != 0 {
            for p in &r.pages {
                pages.extend(page(*p));
            }
        }
    }
    std::fs::write(
        dir.join(format!("pagemap-{pid}.img")),
        image(PAGEMAP_MAGIC, &messages),
    )
    .unwrap();
    std::fs::write(dir.join("pages-3.img"), pages).unwrap();
    let mm = pb::MmEntry {
        vmas: vmas
            .iter()
            .map(|&(start, end, (flags, status))| pb::VmaEntry {
                start: Some(start),
                end: Some(end),
                flags: Some(flags),
                status: Some(status),
                madv: None,
            })
            .collect(),
    };
    std::fs::write(
        dir.join(format!("mm-{pid}.img")),
        image(MM_MAGIC, &[mm.encode_to_vec()]),
    )
    .unwrap();
}

/// The task's memory as a restore reads it from the images: each present
/// page by address, its offset in the pages file derived as CRIU derives it.
fn memory(dir: &Path, pid: u32) -> BTreeMap<u64, Vec<u8>> {
    let (id, entries) =
        parse_pagemap(&std::fs::read(dir.join(format!("pagemap-{pid}.img"))).unwrap()).unwrap();
    let pages = std::fs::read(dir.join(format!("pages-{id}.img"))).unwrap();
    let mut at = 0usize;
    let mut out = BTreeMap::new();
    for e in entries.iter().filter(|e| e.flags & PE_PRESENT != 0) {
        for i in 0..e.nr_pages {
            out.insert(e.vaddr + i * P, pages[at..at + P as usize].to_vec());
            at += P as usize;
        }
    }
    assert_eq!(
        at,
        pages.len(),
        "every byte of the pages file is some page's"
    );
    out
}

const D: Option<u8> = Some(0xd1);
const Z: Option<u8> = None;

#[test]
fn zero_pages_of_private_anonymous_memory_become_holes_and_the_rest_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let vmas = [
        (0x10000, 0x20000, ANON),
        (0x30000, 0x34000, FILE_PRIVATE),
        (0x50000, 0x51000, SHARED_ANON),
        (0x60000, 0x70000, HUGETLB),
    ];
    let lazy = PE_PRESENT | PE_LAZY;
    let ranges = [
        // Zeros at the start, in the middle and at the end.
        range(0x10000, lazy, &[Z, D, Z, Z, Some(2), Some(3), D, Z]),
        // A whole entry of zeros: it goes.
        range(0x18000, lazy, &[Z, Z]),
        // No zeros: kept as written, but its pages move down the file.
        range(0x1a000, PE_PRESENT, &[D, Some(9), D]),
        // Zeros of a private file mapping, shared memory, hugetlb: kept.
        range(0x30000, PE_PRESENT, &[Z, D]),
        range(0x40000, PE_PARENT, &[Z, Z]),
        range(0x50000, PE_PRESENT, &[Z]),
        range(0x60000, lazy, &[Z]),
    ];
    write_task(dir.path(), 41, &vmas, &ranges);
    let pagemap = dir.path().join("pagemap-41.img");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pagemap, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = memory(dir.path(), 41);

    let elided = elide(dir.path()).unwrap();
    assert_eq!(elided.zero_pages, ZeroPages::of_pages(6));
    assert_eq!(elided.zero_pages.elided_bytes, 6 * P);
    let after = memory(dir.path(), 41);
    for (addr, bytes) in &before {
        let in_anon = (0x10000..0x20000).contains(addr);
        match after.get(addr) {
            Some(b) => assert_eq!(b, bytes, "{addr:#x} reads back"),
            None => assert!(in_anon && is_zero(bytes), "{addr:#x} was elided"),
        }
    }
    assert_eq!(after.len(), before.len() - 6);
    let mode = std::fs::metadata(&pagemap).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the pagemap keeps CRIU's mode");
    assert_eq!(
        std::fs::metadata(dir.path().join("pages-3.img"))
            .unwrap()
            .len(),
        after.len() as u64 * P
    );
    // The entries as CRIU will read them: runs with the entry's flags, in
    // address order, the untouched ones as they were.
    let (id, entries) =
        parse_pagemap(&std::fs::read(dir.path().join("pagemap-41.img")).unwrap()).unwrap();
    assert_eq!(id, 3);
    let spans: Vec<(u64, u64, u32)> = entries
        .iter()
        .map(|e| (e.vaddr, e.nr_pages, e.flags))
        .collect();
    assert_eq!(
        spans,
        vec![
            (0x11000, 1, lazy),
            (0x14000, 3, lazy),
            (0x1a000, 3, PE_PRESENT),
            (0x30000, 2, PE_PRESENT),
            (0x40000, 2, PE_PARENT),
            (0x50000, 1, PE_PRESENT),
            (0x60000, 1, lazy),
        ]
    );
    // The page server's reader finds each lazy page at the right offset.
    let mm = std::fs::read(dir.path().join("mm-41.img")).unwrap();
    let ranges = lazy_ranges(&entries, &parse_vmas(&mm).unwrap()).unwrap();
    let pages = std::fs::read(dir.path().join("pages-3.img")).unwrap();
    for r in ranges {
        for i in 0..r.len / P {
            let at = (r.offset + i * P) as usize;
            assert_eq!(&pages[at..at + P as usize], &after[&(r.vaddr + i * P)][..]);
        }
    }
}

#[test]
fn images_without_zero_pages_are_left_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let ranges = [
        range(0x10000, PE_PRESENT | PE_LAZY, &[D, Some(4), D]),
        range(0x30000, PE_PRESENT, &[Z]),
    ];
    write_task(
        dir.path(),
        7,
        &[(0x10000, 0x20000, ANON), (0x30000, 0x31000, FILE_PRIVATE)],
        &ranges,
    );
    let read = |n: &str| std::fs::read(dir.path().join(n)).unwrap();
    let (pagemap, pages) = (read("pagemap-7.img"), read("pages-3.img"));
    // Not rewritten either: its modification time stays.
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000);
    let modified = || {
        let md = std::fs::metadata(dir.path().join("pages-3.img")).unwrap();
        md.modified().unwrap()
    };
    File::options()
        .write(true)
        .open(dir.path().join("pages-3.img"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    let elided = elide(dir.path()).unwrap();
    assert_eq!(elided.zero_pages, ZeroPages::default());
    assert_eq!(modified(), old, "pages-3.img was not written");
    assert_eq!(read("pagemap-7.img"), pagemap);
    assert_eq!(read("pages-3.img"), pages);
    let d = &elided.digests;
    assert!(d.len() == 1 && d[0].0 == "pages-3.img" && d[0].1.size == pages.len() as u64);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "nothing left beside the images: {names:?}");
}

#[test]
fn an_entry_longer_than_a_piece_is_compacted_across_pieces() {
    let dir = tempfile::tempdir().unwrap();
    // 1300 pages: zeros on every third page and a zero run across the
    // first piece's end, so pages move down from every piece.
    let pages: Vec<Option<u8>> = (0..1300u64)
        .map(|i| {
            if i % 3 == 0 || (500..530).contains(&i) {
                None
            } else {
                Some((i % 251) as u8 + 1)
            }
        })
        .collect();
    let zeros = pages.iter().filter(|p| p.is_none()).count() as u64;
    write_task(
        dir.path(),
        5,
        &[(0x100000, 0x100000 + 1300 * P, ANON)],
        &[range(0x100000, PE_PRESENT | PE_LAZY, &pages)],
    );
    let before = memory(dir.path(), 5);
    assert_eq!(elide(dir.path()).unwrap().zero_pages.elided_pages, zeros);
    let after = memory(dir.path(), 5);
    assert_eq!(after.len() as u64, 1300 - zeros);
    for (addr, bytes) in &after {
        assert_eq!(&before[addr], bytes, "{addr:#x}");
    }
}

#[test]
fn a_pages_file_of_another_size_than_its_pagemap_says_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_task(
        dir.path(),
        9,
        &[(0x10000, 0x20000, ANON)],
        &[range(0x10000, PE_PRESENT, &[Z, D])],
    );
    let path = dir.path().join("pages-3.img");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend(page(D));
    std::fs::write(&path, &bytes).unwrap();
    let e = elide(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("pid 9") && e.contains("pages-3.img holds 12288"),
        "{e}"
    );
    assert!(e.starts_with("zero pages: "), "the phase named: {e}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing written");
}

#[test]
fn only_plain_private_anonymous_vmas_are_elidable() {
    let mm = |flags, status| {
        let m = pb::MmEntry {
            vmas: vec![pb::VmaEntry {
                start: Some(0x1000),
                end: Some(0x2000),
                flags: Some(flags),
                status: Some(status),
                madv: None,
            }],
        };
        elidable(&image(MM_MAGIC, &[m.encode_to_vec()])).unwrap()
    };
    assert_eq!(mm(ANON.0, ANON.1), vec![(0x1000, 0x2000)]);
    // The heap is plain anonymous memory too.
    assert_eq!(mm(ANON.0, ANON.1 | (1 << 5)).len(), 1);
    for (flags, status) in [
        FILE_PRIVATE,
        SHARED_ANON,
        HUGETLB,
        (ANON.0, ANON.1 | (1 << 1)),  // the stack
        (ANON.0, ANON.1 | (1 << 14)), // memfd
        (ANON.0, ANON.1 | (1 << 27)), // a plugin's
        (ANON.0, VMA_ANON_PRIVATE),   // not regular
    ] {
        assert!(mm(flags, status).is_empty(), "{flags:#x} {status:#x}");
    }
}

/// The pages files' digests taken as they were compacted, against those a
/// separate pass (`content::digest`, what a restore verifies against)
/// takes of the final files: elided or not, across pieces and chunks.
#[test]
fn digests_taken_in_the_compaction_are_those_of_the_final_files() {
    use vsnap_artifact::content::{digest, CHUNK};
    // 20000 pages (78 MiB), one in 7 zero, and a zero run across a piece's
    // end: the kept pages still span two 64 MiB chunks.
    let n = 20_000u64;
    let pages: Vec<Option<u8>> = (0..n)
        .map(|i| match i % 7 == 0 || (500..530).contains(&i) {
            true => None,
            false => Some((i % 251) as u8 + 1),
        })
        .collect();
    let cases: [(&[Vma], Vec<Range>); 3] = [
        // Elided: pages move down from every piece.
        (
            &[(0x100000, 0x100000 + n * P, ANON)],
            vec![range(0x100000, PE_PRESENT | PE_LAZY, &pages)],
        ),
        // Nothing elidable (a private file mapping): read and hashed only.
        (
            &[(0x100000, 0x100000 + n * P, FILE_PRIVATE)],
            vec![range(0x100000, PE_PRESENT, &pages)],
        ),
        // A mix: an entry that cannot lose a page after one that does.
        (
            &[(0x10000, 0x20000, ANON), (0x30000, 0x34000, FILE_PRIVATE)],
            vec![
                range(0x10000, PE_PRESENT, &[Z, D, Z, Some(7)]),
                range(0x30000, PE_PRESENT, &[Z, D, Some(5)]),
            ],
        ),
    ];
    for (i, (vmas, ranges)) in cases.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("images");
        std::fs::create_dir(&images).unwrap();
        write_task(&images, 11, vmas, ranges);
        let elided = elide(&images).unwrap();
        let separate = digest(dir.path(), 2).unwrap();
        assert_eq!(elided.digests.len(), 1);
        let (name, d) = &elided.digests[0];
        assert_eq!(d, &separate[&format!("images/{name}")], "case {i}");
        if i == 0 {
            assert!(d.size > CHUNK && d.chunks.len() == 2, "case {i}: {d:?}");
        }
    }
}
