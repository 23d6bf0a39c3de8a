//! All-zero pages left out of a capture's page images, as holes.
//!
//! CRIU 4.2 dumps every present page of a private mapping except those
//! that map the kernel's shared zero page (`should_dump_page`,
//! `criu/mem.c`): a page the process wrote zeros to is a real page and is
//! dumped. Right after the dump, before the artifact's digests are taken,
//! each task's `pagemap-<pid>.img` and `pages-<id>.img` are rewritten here:
//! every all-zero 4 KiB page that lies in a private anonymous VMA
//! (`elidable`) is dropped, the pagemap entry holding it split around the
//! hole and the pages file compacted in place.
//!
//! Why a hole reads back as zeros (CRIU 4.2, `criu/mem.c`, `criu/uffd.c`):
//! - a restore reads a pages file sequentially: each `PE_PRESENT` entry's
//!   pages follow the previous one's (`pi_off` advances by the entry's
//!   length, `skip_pagemap_pages`), so a compacted file with split entries
//!   is read exactly as CRIU wrote an image with that hole;
//! - a private anonymous VMA is premapped fresh (`premap_private_vma`): a
//!   page nobody copies there reads as zeros. A VMA a child inherited
//!   from its parent at fork starts as the parent's pages, and
//!   `restore_priv_vma_content` drops (`MADV_DONTNEED`) every page the
//!   parent had and the child's own pagemap lacks: it reads as zeros too;
//! - with lazy pages, the registered range of a hole is never filled;
//!   once the userfaultfd is closed it faults in as a fresh zero page. A
//!   fault before that is answered with `UFFDIO_ZEROPAGE`, as CRIU's own
//!   lazy-pages daemon does (`handle_page_fault` then `uffd_zero`).
//!
//! A private *file* mapping is left alone: a page missing there reads the
//! file's bytes, not zeros. Shared memory (shmem, memfd, SysV) has its own
//! images, untouched here.

#[cfg(test)]
mod tests;

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use prost::Message;
use vsnap_artifact::ZeroPages;

use super::images::{
    self, decode, messages, pb, PagemapEntry, IMG_COMMON_MAGIC, MM_MAGIC, PAGEMAP_MAGIC, PAGE_SIZE,
    PE_PRESENT,
};

/// Pages read, checked and moved at once.
const PIECE_PAGES: u64 = 512;

// `mmap(2)` flags as CRIU records them in `vma_entry.flags`.
const MAP_SHARED: u32 = 0x01;
const MAP_PRIVATE: u32 = 0x02;
const MAP_ANONYMOUS: u32 = 0x20;
const MAP_HUGETLB: u32 = 0x4_0000;
// `criu/include/image.h`: `vma_entry.status`.
const VMA_AREA_REGULAR: u32 = 1 << 0;
const VMA_ANON_PRIVATE: u32 = 1 << 9;
/// Every status bit that makes a VMA more than plain private anonymous
/// memory: stack, vsyscall, vDSO, file-backed (private or shared), shared
/// anonymous, SysV IPC, socket, vvar, AIO ring, memfd, shadow stack,
/// guard, uprobes, a plugin's.
const VMA_NOT_PLAIN: u32 = (1 << 1)
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

/// Rewrites every task's pagemap and pages file under `images` (a CRIU
/// dump folder) without their all-zero pages of private anonymous memory.
pub fn elide(images: &Path) -> Result<ZeroPages, String> {
    let mut pids = Vec::new();
    let entries =
        std::fs::read_dir(images).map_err(|e| format!("read {}: {e}", images.display()))?;
    for entry in entries {
        let name = entry
            .map_err(|e| format!("read {}: {e}", images.display()))?
            .file_name();
        let name = name.to_string_lossy();
        if let Some(pid) = name
            .strip_prefix("pagemap-")
            .and_then(|n| n.strip_suffix(".img"))
            .and_then(|p| p.parse::<u32>().ok())
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    let mut pages_ids = Vec::new();
    let mut elided = 0;
    for pid in pids {
        let task = TaskImages::read(images, pid)?;
        if pages_ids.contains(&task.pages_id) {
            return Err(format!(
                "pid {pid}: pages-{}.img is another task's too",
                task.pages_id
            ));
        }
        pages_ids.push(task.pages_id);
        elided += task.elide(images).map_err(|e| format!("pid {pid}: {e}"))?;
    }
    Ok(ZeroPages::of_pages(elided))
}

/// The VMAs of `mm-<pid>.img` whose missing pages read as zeros: private
/// anonymous memory, not hugetlb, nothing CRIU treats apart; as sorted
/// `(start, end)`.
pub fn elidable(mm: &[u8]) -> Result<Vec<(u64, u64)>, String> {
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

/// One task's images as the rewrite needs them.
struct TaskImages {
    pid: u32,
    pages_id: u32,
    /// The pagemap's head and entries as CRIU wrote them.
    head: Vec<u8>,
    raw: Vec<Vec<u8>>,
    entries: Vec<PagemapEntry>,
    vmas: Vec<(u64, u64)>,
}

/// One entry of the rewritten pagemap.
enum Out<'a> {
    /// Unchanged: its bytes as CRIU wrote them.
    Kept(&'a [u8]),
    /// A run of pages of a split entry.
    Run(PagemapEntry),
}

impl TaskImages {
    fn read(images: &Path, pid: u32) -> Result<Self, String> {
        let read = |name: String| {
            let path = images.join(name);
            std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))
        };
        let pagemap = read(format!("pagemap-{pid}.img"))?;
        let (pages_id, entries) =
            images::parse_pagemap(&pagemap).map_err(|e| format!("pagemap-{pid}.img: {e}"))?;
        let mut bodies = messages(&pagemap, PAGEMAP_MAGIC)?;
        let head = bodies.next().ok_or("no pagemap head")??.to_vec();
        let raw = bodies
            .map(|b| b.map(<[u8]>::to_vec))
            .collect::<Result<_, _>>()?;
        let vmas =
            elidable(&read(format!("mm-{pid}.img"))?).map_err(|e| format!("mm-{pid}.img: {e}"))?;
        Ok(TaskImages {
            pid,
            pages_id,
            head,
            raw,
            entries,
            vmas,
        })
    }

    fn is_elidable(&self, vaddr: u64) -> bool {
        let i = self.vmas.partition_point(|v| v.1 <= vaddr);
        self.vmas.get(i).is_some_and(|v| v.0 <= vaddr)
    }

    fn overlaps_elidable(&self, start: u64, end: u64) -> bool {
        let i = self.vmas.partition_point(|v| v.1 <= start);
        self.vmas.get(i).is_some_and(|v| v.0 < end)
    }

    /// Compacts the pages file, then writes the pagemap with its holes;
    /// returns the pages elided. Nothing is written when none is.
    fn elide(&self, images: &Path) -> Result<u64, String> {
        let name = format!("pages-{}.img", self.pages_id);
        let path = images.join(&name);
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("open {name}: {e}"))?;
        let size = file
            .metadata()
            .map_err(|e| format!("stat {name}: {e}"))?
            .len();
        let present: u64 = self
            .entries
            .iter()
            .filter(|e| e.flags & PE_PRESENT != 0)
            .map(|e| e.nr_pages * PAGE_SIZE)
            .sum();
        if present != size {
            return Err(format!(
                "its pagemap has {present} bytes of pages, {name} holds {size}"
            ));
        }
        let mut c = Compaction {
            file: &file,
            name: &name,
            buf: vec![0u8; (PIECE_PAGES * PAGE_SIZE) as usize],
            read_at: 0,
            write_at: 0,
            elided: 0,
            run: None,
            runs: Vec::new(),
        };
        let mut out = Vec::with_capacity(self.entries.len());
        for (e, raw) in self.entries.iter().zip(&self.raw) {
            c.entry(self, e, raw, &mut out)?;
        }
        if c.elided == 0 {
            return Ok(0);
        }
        file.set_len(c.write_at)
            .map_err(|e| format!("truncate {name}: {e}"))?;
        let pagemap = format!("pagemap-{}.img", self.pid);
        let tmp = images.join(format!(".{pagemap}.zero"));
        std::fs::write(&tmp, encode(&self.head, &out))
            .map_err(|e| format!("write {}: {e}", tmp.display()))?;
        // CRIU's mode (0600), not the umask's.
        let mode = std::fs::metadata(images.join(&pagemap))
            .map_err(|e| format!("stat {pagemap}: {e}"))?
            .permissions();
        std::fs::set_permissions(&tmp, mode)
            .map_err(|e| format!("chmod {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, images.join(&pagemap))
            .map_err(|e| format!("replace {pagemap}: {e}"))?;
        Ok(c.elided)
    }
}

/// A pages file compacted in place: pages are read at `read_at` and the
/// kept ones written at `write_at`, never past what was read.
struct Compaction<'a> {
    file: &'a File,
    name: &'a str,
    buf: Vec<u8>,
    read_at: u64,
    write_at: u64,
    elided: u64,
    /// The run of kept pages under way in the current entry, and those
    /// it ended.
    run: Option<PagemapEntry>,
    runs: Vec<PagemapEntry>,
}

impl<'a> Compaction<'a> {
    /// Entry `e` (`raw` as written) into `out`: whole, or as its runs of
    /// pages that are not elided.
    fn entry(
        &mut self,
        task: &TaskImages,
        e: &PagemapEntry,
        raw: &'a [u8],
        out: &mut Vec<Out<'a>>,
    ) -> Result<(), String> {
        let len = e.nr_pages * PAGE_SIZE;
        if e.flags & PE_PRESENT == 0 {
            out.push(Out::Kept(raw));
            return Ok(());
        }
        if self.read_at == self.write_at && !task.overlaps_elidable(e.vaddr, e.vaddr + len) {
            // Nothing moves and nothing here can go: not even read.
            self.read_at += len;
            self.write_at += len;
            out.push(Out::Kept(raw));
            return Ok(());
        }
        let before = self.elided;
        let mut page = 0u64;
        while page < e.nr_pages {
            let n = PIECE_PAGES.min(e.nr_pages - page);
            let piece = PagemapEntry {
                vaddr: e.vaddr + page * PAGE_SIZE,
                nr_pages: n,
                flags: e.flags,
            };
            self.piece(task, &piece)?;
            page += n;
        }
        let mut runs = std::mem::take(&mut self.runs);
        runs.extend(self.run.take());
        if self.elided == before {
            out.push(Out::Kept(raw));
        } else {
            out.extend(runs.into_iter().map(Out::Run));
        }
        Ok(())
    }

    /// The pages of `piece` (part of one entry): read, the all-zero
    /// elidable ones dropped, the others moved down and written where the
    /// file's kept pages end.
    fn piece(&mut self, task: &TaskImages, piece: &PagemapEntry) -> Result<(), String> {
        let (vaddr, n) = (piece.vaddr, piece.nr_pages);
        let page = PAGE_SIZE as usize;
        let bytes = n as usize * page;
        let at = self.read_at;
        self.file
            .read_exact_at(&mut self.buf[..bytes], at)
            .map_err(|e| format!("read {bytes} bytes at {at} of {}: {e}", self.name))?;
        let mut kept = 0usize;
        for k in 0..n as usize {
            let addr = vaddr + (k * page) as u64;
            let data = &self.buf[k * page..(k + 1) * page];
            if task.is_elidable(addr) && is_zero(data) {
                self.runs.extend(self.run.take());
                self.elided += 1;
                continue;
            }
            match &mut self.run {
                Some(r) => r.nr_pages += 1,
                None => {
                    self.run = Some(PagemapEntry {
                        vaddr: addr,
                        nr_pages: 1,
                        flags: piece.flags,
                    })
                }
            }
            if kept != k {
                self.buf.copy_within(k * page..(k + 1) * page, kept * page);
            }
            kept += 1;
        }
        if kept > 0 && (self.write_at != at || kept != n as usize) {
            let w = self.write_at;
            self.file
                .write_all_at(&self.buf[..kept * page], w)
                .map_err(|e| format!("write {} bytes at {w} of {}: {e}", kept * page, self.name))?;
        }
        self.read_at += bytes as u64;
        self.write_at += (kept * page) as u64;
        Ok(())
    }
}

/// Whether `page` holds only zeros (64 bytes at a time, which the compiler
/// vectorizes).
pub fn is_zero(page: &[u8]) -> bool {
    page.chunks(64)
        .all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// A pagemap image: the magics, `head` and each entry as CRIU frames them
/// (a u32 size before each message). A split entry's runs are written as
/// CRIU 4.2 writes an entry (`write_pagemap_loc`): `vaddr`,
/// `compat_nr_pages` 0 (required, unused when `nr_pages` is there),
/// `flags`, `nr_pages`.
fn encode(head: &[u8], entries: &[Out]) -> Vec<u8> {
    let mut bytes = IMG_COMMON_MAGIC.to_le_bytes().to_vec();
    bytes.extend(PAGEMAP_MAGIC.to_le_bytes());
    let mut frame = |body: &[u8]| {
        bytes.extend((body.len() as u32).to_le_bytes());
        bytes.extend(body);
    };
    frame(head);
    for e in entries {
        match e {
            Out::Kept(raw) => frame(raw),
            Out::Run(r) => frame(
                &pb::PagemapEntry {
                    vaddr: Some(r.vaddr),
                    compat_nr_pages: Some(0),
                    in_parent: None,
                    flags: Some(r.flags),
                    nr_pages: Some(r.nr_pages),
                }
                .encode_to_vec(),
            ),
        }
    }
    bytes
}
