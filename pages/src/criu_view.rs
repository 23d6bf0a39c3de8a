//! The images CRIU restores from when an artifact's pages files are sealed
//! at rest (vsnap_artifact::at_rest): CRIU reads some pages itself and
//! cannot open them, so a restore hands it a view of the images folder in
//! which those pages are in clear, and nothing else is.
//!
//! With lazy pages (vsnap's page server), CRIU reads a task's pages file
//! only for its pagemap entries without `PE_LAZY` (stacks, the vDSO's
//! data, file-backed and locked memory: `criu/mem.c` skips a lazy entry's
//! pages when `lazy-pages` is on) and every page of shared memory's pages
//! files (`pagemap-shmem-*`: the server never sees those). Without it,
//! CRIU reads every page. The view is a folder of copies of the
//! artifact's other images (small; not symlinks: a restored task opens its
//! pagemap from inside its own root, where the artifact's path is not),
//! and each pages file is a new sparse file of the same size holding, at
//! their own offsets, only the bytes CRIU reads, opened; the lazy pages
//! stay sealed in the artifact, where the page server opens them as it
//! places them. The view belongs in memory (the
//! runtime folder, a tmpfs on a systemd host) and goes when the restore
//! ends.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use vsnap_artifact::at_rest::Opener;

use crate::error::{PageError, Phase};
use crate::images::{parse_pagemap, PAGE_SIZE, PE_LAZY, PE_PRESENT};

/// Bytes opened at a time.
const PIECE: usize = 1 << 20;

/// A view of an images folder for CRIU, removed when dropped.
#[derive(Debug)]
pub struct CriuView {
    dir: PathBuf,
    /// Bytes of pages opened into it.
    pub opened: u64,
}

impl CriuView {
    /// The view of `images` in `dir` (made 0700; anything there before is
    /// removed). `lazy`: the page server places the lazy pages, CRIU reads
    /// only the others.
    pub fn make(images: &Path, dir: &Path, opener: &Opener, lazy: bool) -> Result<Self, PageError> {
        let fail = |what: &str, path: &Path, e: std::io::Error| {
            PageError::failed(Phase::Images, path.display(), format!("{what}: {e}"))
        };
        let _ = std::fs::remove_dir_all(dir);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail("mkdir", dir, e))?;
        let mut view = CriuView {
            dir: dir.to_path_buf(),
            opened: 0,
        };
        let read = lazy.then(|| criu_reads(images)).transpose()?;
        for entry in std::fs::read_dir(images).map_err(|e| fail("read", images, e))? {
            let name = entry.map_err(|e| fail("read", images, e))?.file_name();
            let name = name.to_string_lossy().into_owned();
            let (from, to) = (images.join(&name), dir.join(&name));
            let rel = format!("images/{name}");
            match opener.file(&rel) {
                Some(c) => {
                    let ranges = read.as_ref().and_then(|r| r.get(&name));
                    view.opened += open_pages(&from, &to, &c, ranges.map(Vec::as_slice))?;
                }
                None => copy(&from, &to).map_err(|e| fail("copy", &to, e))?,
            }
        }
        Ok(view)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for CriuView {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A copy of the image `from` at `to` (0600), never through a symlink.
fn copy(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut src = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)?;
    let mut dst = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)?;
    std::io::copy(&mut src, &mut dst).map(drop)
}

/// With lazy pages: for each task's pages file (by file name), the
/// `(offset, len)` ranges CRIU reads itself, its entries without
/// `PE_LAZY`. A pages file no task's pagemap names (shared memory's) is
/// not among them: CRIU reads it whole.
fn criu_reads(
    images: &Path,
) -> Result<std::collections::BTreeMap<String, Vec<(u64, u64)>>, PageError> {
    let mut out = std::collections::BTreeMap::new();
    let in_dir = |e: std::io::Error| {
        PageError::failed(Phase::Images, images.display(), format!("read: {e}"))
    };
    for entry in std::fs::read_dir(images).map_err(in_dir)? {
        let name = entry.map_err(in_dir)?.file_name();
        let name = name.to_string_lossy();
        let task = name
            .strip_prefix("pagemap-")
            .and_then(|n| n.strip_suffix(".img"))
            .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !task {
            continue;
        }
        let path = images.join(&*name);
        let in_file = |e: String| PageError::failed(Phase::Images, path.display(), e);
        let bytes = std::fs::read(&path).map_err(|e| in_file(format!("read: {e}")))?;
        let (id, entries) = parse_pagemap(&bytes).map_err(in_file)?;
        let mut ranges = Vec::new();
        let mut offset = 0;
        for e in entries.iter().filter(|e| e.flags & PE_PRESENT != 0) {
            let len = e.nr_pages * PAGE_SIZE;
            if e.flags & PE_LAZY == 0 {
                ranges.push((offset, len));
            }
            offset += len;
        }
        out.insert(format!("pages-{id}.img"), ranges);
    }
    Ok(out)
}

/// The view's copy of the sealed pages file `from` at `to`: its size, and
/// in clear the bytes of `ranges` (all of it where None). Returns the
/// bytes opened.
fn open_pages(
    from: &Path,
    to: &Path,
    c: &vsnap_artifact::at_rest::FileCipher,
    ranges: Option<&[(u64, u64)]>,
) -> Result<u64, PageError> {
    let fail = |path: &Path, what: &str, e: std::io::Error| {
        PageError::failed(Phase::Images, path.display(), format!("{what}: {e}"))
    };
    let src = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)
        .map_err(|e| fail(from, "open", e))?;
    let size = src.metadata().map_err(|e| fail(from, "stat", e))?.len();
    let dst = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)
        .map_err(|e| fail(to, "create", e))?;
    dst.set_len(size).map_err(|e| fail(to, "truncate", e))?;
    let whole = [(0, size)];
    let mut buf = vec![0u8; PIECE];
    let mut opened = 0;
    for &(start, len) in ranges.unwrap_or(&whole) {
        let end = (start + len).min(size);
        let mut at = start;
        while at < end {
            let n = (end - at).min(PIECE as u64) as usize;
            let piece = &mut buf[..n];
            src.read_exact_at(piece, at)
                .map_err(|e| fail(from, "read", e))?;
            c.apply(at, piece);
            dst.write_all_at(piece, at)
                .map_err(|e| fail(to, "write", e))?;
            at += n as u64;
            opened += n as u64;
        }
    }
    Ok(opened)
}

#[cfg(test)]
#[path = "criu_view_tests.rs"]
mod tests;
