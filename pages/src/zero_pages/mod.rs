//! All-zero pages left out of a capture's page images, as holes.
//!
//! CRIU 4.2 dumps every present page of a private mapping except those
//! that map the kernel's shared zero page (`should_dump_page`,
//! `criu/mem.c`): a page the process wrote zeros to is a real page and is
//! dumped. Right after the dump, before the artifact's digests are taken,
//! each task's `pagemap-<pid>.img` and `pages-<id>.img` are rewritten here:
//! every all-zero 4 KiB page that lies in a private anonymous VMA
//! (`elidable`) is dropped, the pagemap entry holding it split around the
//! hole and the pages file compacted in place (`compaction`). The same
//! pass takes the compacted file's content digest from the bytes it keeps
//! (`output`, on a second thread that also writes them), so the capture's
//! digest pass does not read the pages files again: elision costs one
//! read of every page, not two. A pages file without a zero page to drop
//! is read and hashed, never written.
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

mod compaction;
mod output;
#[cfg(test)]
mod tests;
mod vmas;

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use prost::Message;
use vsnap_artifact::{FileDigest, ZeroPages};

use crate::error::{PageError, Phase};
use compaction::{Compaction, Out, PIECE_PAGES};
use output::Output;
use vmas::Elidable;

use super::images::{
    self, messages, pb, PagemapEntry, IMG_COMMON_MAGIC, PAGEMAP_MAGIC, PAGE_SIZE, PE_PRESENT,
};

/// What [`elide`] did to a dump folder.
#[derive(Debug, PartialEq, Eq)]
pub struct Elided {
    pub zero_pages: ZeroPages,
    /// The content digest of each task's pages file, by file name
    /// (`pages-<id>.img`), taken from its final bytes as they were kept:
    /// what `content::digest` would take of the file afterwards.
    pub digests: Vec<(String, FileDigest)>,
}

/// Rewrites every task's pagemap and pages file under `images` (a CRIU
/// dump folder) without their all-zero pages of private anonymous memory,
/// and takes each pages file's digest on the way.
/// Errors name the folder and, in their detail, the task and file.
pub fn elide(images: &Path) -> Result<Elided, PageError> {
    elide_in(images).map_err(|e| PageError::failed(Phase::Elide, images.display(), e))
}

fn elide_in(images: &Path) -> Result<Elided, String> {
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
    let mut digests = Vec::new();
    for pid in pids {
        let task = TaskImages::read(images, pid)?;
        if pages_ids.contains(&task.pages_id) {
            return Err(format!(
                "pid {pid}: pages-{}.img is another task's too",
                task.pages_id
            ));
        }
        pages_ids.push(task.pages_id);
        let (n, digest) = task.elide(images).map_err(|e| format!("pid {pid}: {e}"))?;
        elided += n;
        digests.push((format!("pages-{}.img", task.pages_id), digest));
    }
    Ok(Elided {
        zero_pages: ZeroPages::of_pages(elided),
        digests,
    })
}

/// One task's images as the rewrite needs them.
struct TaskImages {
    pid: u32,
    pages_id: u32,
    /// The pagemap's head and entries as CRIU wrote them.
    head: Vec<u8>,
    raw: Vec<Vec<u8>>,
    entries: Vec<PagemapEntry>,
    vmas: Elidable,
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
        let vmas = Elidable::of_mm(&read(format!("mm-{pid}.img"))?)
            .map_err(|e| format!("mm-{pid}.img: {e}"))?;
        Ok(TaskImages {
            pid,
            pages_id,
            head,
            raw,
            entries,
            vmas,
        })
    }

    /// Compacts the pages file, then writes the pagemap with its holes;
    /// returns the pages elided and the pages file's digest. Nothing is
    /// written when no page is elided.
    fn elide(&self, images: &Path) -> Result<(u64, FileDigest), String> {
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
        let (out, c) = std::thread::scope(|s| {
            let output = Output::start(s, &file, &name, (PIECE_PAGES * PAGE_SIZE) as usize);
            let mut c = Compaction::new(&file, &name, output);
            let mut out = Vec::with_capacity(self.entries.len());
            for (e, raw) in self.entries.iter().zip(&self.raw) {
                c.entry(&self.vmas, e, raw, &mut out)?;
            }
            Ok::<_, String>((out, c.finish()?))
        })?;
        if c.elided == 0 {
            return Ok((0, c.digest));
        }
        file.set_len(c.len)
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
        Ok((c.elided, c.digest))
    }
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
