//! One task's pages file compacted in place, a piece at a time: every page
//! is read once, the all-zero elidable ones dropped, and the kept bytes
//! handed, in the file's final order, to the thread that writes them down
//! the file where the kept pages end and takes the file's content digest
//! (`output`).

use std::fs::File;
use std::os::unix::fs::FileExt;

use vsnap_artifact::FileDigest;

use super::output::Output;
use super::vmas::Elidable;
use crate::images::{PagemapEntry, PAGE_SIZE, PE_PRESENT};

/// Pages read, checked and moved at once.
pub(super) const PIECE_PAGES: u64 = 512;

/// One entry of the rewritten pagemap.
pub(super) enum Out<'a> {
    /// Unchanged: its bytes as CRIU wrote them.
    Kept(&'a [u8]),
    /// A run of pages of a split entry.
    Run(PagemapEntry),
}

/// A pages file compacted in place: pages are read at `read_at` and the
/// kept ones written at `write_at`, never past what was read.
pub(super) struct Compaction<'a, 's> {
    file: &'a File,
    name: &'a str,
    output: Output<'s>,
    read_at: u64,
    write_at: u64,
    elided: u64,
    /// The run of kept pages under way in the current entry, and those
    /// it ended.
    run: Option<PagemapEntry>,
    runs: Vec<PagemapEntry>,
}

/// What a compaction did: the pages it dropped, the file's new length and
/// the digest of its bytes.
pub(super) struct Compacted {
    pub elided: u64,
    pub len: u64,
    pub digest: FileDigest,
}

impl<'a, 's> Compaction<'a, 's> {
    pub(super) fn new(file: &'a File, name: &'a str, output: Output<'s>) -> Self {
        Compaction {
            file,
            name,
            output,
            read_at: 0,
            write_at: 0,
            elided: 0,
            run: None,
            runs: Vec::new(),
        }
    }

    /// Once every kept page is written.
    pub(super) fn finish(self) -> Result<Compacted, String> {
        Ok(Compacted {
            elided: self.elided,
            len: self.write_at,
            digest: self.output.finish()?,
        })
    }

    /// Entry `e` (`raw` as written) into `out`: whole, or as its runs of
    /// pages that are not elided.
    pub(super) fn entry(
        &mut self,
        vmas: &Elidable,
        e: &PagemapEntry,
        raw: &'a [u8],
        out: &mut Vec<Out<'a>>,
    ) -> Result<(), String> {
        if e.flags & PE_PRESENT == 0 {
            out.push(Out::Kept(raw));
            return Ok(());
        }
        // Nothing here can go: its pages are only hashed (and moved down
        // once the file shrank before them).
        let check = vmas.overlaps(e.vaddr, e.vaddr + e.nr_pages * PAGE_SIZE);
        let before = self.elided;
        let mut page = 0u64;
        while page < e.nr_pages {
            let n = PIECE_PAGES.min(e.nr_pages - page);
            let piece = PagemapEntry {
                vaddr: e.vaddr + page * PAGE_SIZE,
                nr_pages: n,
                flags: e.flags,
            };
            self.piece(check.then_some(vmas), &piece)?;
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
    /// elidable ones dropped (none without `vmas`), the others handed over
    /// to be written where the file's kept pages end, and hashed.
    fn piece(&mut self, vmas: Option<&Elidable>, piece: &PagemapEntry) -> Result<(), String> {
        let page = PAGE_SIZE as usize;
        let n = piece.nr_pages as usize;
        let at = self.read_at;
        let mut buf = self.output.buffer();
        self.file
            .read_exact_at(&mut buf[..n * page], at)
            .map_err(|e| format!("read {} bytes at {at} of {}: {e}", n * page, self.name))?;
        let kept = match vmas {
            Some(vmas) => self.drop_zeros(vmas, piece, &mut buf),
            None => {
                self.extend_run(piece.vaddr, n as u64, piece.flags);
                n
            }
        };
        let moved = self.write_at != at || kept != n;
        self.output
            .put(buf, kept * page, moved.then_some(self.write_at));
        self.read_at += (n * page) as u64;
        self.write_at += (kept * page) as u64;
        Ok(())
    }

    /// Drops the all-zero elidable pages of `piece` from `buf` (its bytes),
    /// the kept ones moved to its front; returns how many are kept.
    fn drop_zeros(&mut self, vmas: &Elidable, piece: &PagemapEntry, buf: &mut [u8]) -> usize {
        let page = PAGE_SIZE as usize;
        let mut kept = 0usize;
        for k in 0..piece.nr_pages as usize {
            let addr = piece.vaddr + (k * page) as u64;
            if vmas.contains(addr) && is_zero(&buf[k * page..(k + 1) * page]) {
                self.runs.extend(self.run.take());
                self.elided += 1;
                continue;
            }
            self.extend_run(addr, 1, piece.flags);
            if kept != k {
                buf.copy_within(k * page..(k + 1) * page, kept * page);
            }
            kept += 1;
        }
        kept
    }

    /// `n` kept pages at `addr`: the run under way grows, or one starts.
    fn extend_run(&mut self, addr: u64, n: u64, flags: u32) {
        match &mut self.run {
            Some(r) => r.nr_pages += n,
            None => {
                self.run = Some(PagemapEntry {
                    vaddr: addr,
                    nr_pages: n,
                    flags,
                })
            }
        }
    }
}

/// A page of zeros, to compare pages with.
static ZERO_PAGE: [u8; PAGE_SIZE as usize] = [0; PAGE_SIZE as usize];

/// Whether `bytes` hold only zeros: compared a page at a time with
/// [`ZERO_PAGE`] by the C library's `bcmp`, vectorized whatever the
/// shim's own optimization level (`z` in release, where a byte loop here
/// is not vectorized).
pub(super) fn is_zero(bytes: &[u8]) -> bool {
    bytes
        .chunks(ZERO_PAGE.len())
        .all(|c| c == &ZERO_PAGE[..c.len()])
}
