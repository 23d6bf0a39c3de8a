//! The pages files read whole once the restore finished, each 64 MiB chunk
//! hashed as it is read and checked against the manifest's digest, its lazy
//! pages placed from the same buffer.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use vsnap_artifact::content::{ChunkDigest, CHUNK};
use vsnap_artifact::{ArtifactError, FileDigest};

use super::outcome::PlaceError;
use super::place::{copy, FILL_CHUNK};
use super::task::Task;

/// The pages files the server checks while placing them: `dir` is the
/// artifact (named in errors), `files` the digests of its tasks' pages
/// files (`images/pages-<id>.img`), taken out of the restore's other
/// verification.
pub struct Verification {
    pub dir: PathBuf,
    pub files: Vec<(String, FileDigest)>,
}

/// A pages file read whole once the restore finished: every chunk checked
/// against its digest (when verifying), the lazy ranges of its task placed.
pub(super) struct PagesFile {
    pub(super) rel: String,
    file: File,
    pub(super) size: u64,
    digest: Option<FileDigest>,
    pub(super) task: Option<usize>,
}

/// The files to read after the restore: with verification, exactly the
/// pages files it names (each task's must be among them); without, each
/// task's. A task whose ranges reach past its file's end is refused: its
/// missing pages would read as zeros.
pub(super) fn pages_files(
    images: &Path,
    tasks: &[Task],
    verify: Option<&Verification>,
) -> Result<Vec<PagesFile>, PlaceError> {
    let files = match verify {
        Some(v) => verified_files(images, tasks, v)?,
        None => task_files(tasks)?,
    };
    for f in &files {
        if let Some(t) = f.task.map(|t| &tasks[t]) {
            let end = t.lazy.ranges.last().map_or(0, |r| r.offset + r.len);
            if end > f.size {
                return Err(format!(
                    "pid {}: its pagemap needs {end} bytes of {}, which holds {}",
                    t.pid, f.rel, f.size
                )
                .into());
            }
        }
    }
    Ok(files)
}

/// The pages files `v` names, each of the size its digest says; every
/// task's must be among them.
fn verified_files(
    images: &Path,
    tasks: &[Task],
    v: &Verification,
) -> Result<Vec<PagesFile>, PlaceError> {
    let mut files = Vec::new();
    for (rel, digest) in &v.files {
        let name = rel.strip_prefix("images/").unwrap_or(rel);
        let path = images.join(name);
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        let size = file
            .metadata()
            .map_err(|e| format!("stat {}: {e}", path.display()))?
            .len();
        if size != digest.size {
            return Err(PlaceError::Damaged(ArtifactError::Damaged(format!(
                "{}: {rel} holds {size} bytes, the manifest says {}",
                v.dir.display(),
                digest.size
            ))));
        }
        files.push(PagesFile {
            rel: rel.clone(),
            file,
            size,
            digest: Some(digest.clone()),
            task: tasks.iter().position(|t| &t.pages_rel == rel),
        });
    }
    if let Some(t) = tasks
        .iter()
        .find(|t| !files.iter().any(|f| f.rel == t.pages_rel))
    {
        return Err(format!(
            "pid {}: {} has no digest to check it against",
            t.pid, t.pages_rel
        )
        .into());
    }
    Ok(files)
}

/// Each task's own pages file, unchecked.
fn task_files(tasks: &[Task]) -> Result<Vec<PagesFile>, PlaceError> {
    let mut files = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let file = t
            .pages
            .try_clone()
            .map_err(|e| format!("pid {}: {}: {e}", t.pid, t.pages_rel))?;
        let size = file
            .metadata()
            .map_err(|e| format!("pid {}: {}: {e}", t.pid, t.pages_rel))?
            .len();
        files.push(PagesFile {
            rel: t.pages_rel.clone(),
            file,
            size,
            digest: None,
            task: Some(i),
        });
    }
    Ok(files)
}

/// Reads chunk `chunk` of `f` a piece at a time: hashes each piece (when
/// verifying) and places the lazy pages in it into `task`'s memory from
/// the same buffer; then checks the chunk's digest. `buf` is a filler's
/// buffer, each piece read to its start, or one as long as the chunk (a
/// memfd shared with other restores), which then holds the whole chunk.
pub(super) fn place_chunk(
    f: &PagesFile,
    chunk: usize,
    task: Option<&Task>,
    dir: &Path,
    buf: &mut [u8],
) -> Result<(), PlaceError> {
    let start = chunk as u64 * CHUNK;
    let end = (start + CHUNK).min(f.size);
    let whole = buf.len() as u64 >= end - start;
    let mut digest = f.digest.as_ref().map(|_| ChunkDigest::new());
    let mut at = start;
    while at < end {
        let n = FILL_CHUNK.min(end - at);
        let from = if whole { (at - start) as usize } else { 0 };
        let data = &mut buf[from..from + n as usize];
        f.file
            .read_exact_at(data, at)
            .map_err(|e| format!("read {n} bytes at {at} of {}: {e}", f.rel))?;
        if let Some(d) = digest.as_mut() {
            d.update(data);
        }
        if let Some(t) = task {
            place_piece(t, at, data)?;
        }
        at += n;
    }
    if let (Some(d), Some(want)) = (digest, &f.digest) {
        d.check(dir, &f.rel, want, chunk)
            .map_err(PlaceError::Damaged)?;
    }
    Ok(())
}

/// Places chunk `chunk` of `f` into `task`'s memory from `data`, the
/// chunk's bytes as another restore read and checked them.
pub(super) fn place_checked(
    f: &PagesFile,
    chunk: usize,
    task: Option<&Task>,
    data: &[u8],
) -> Result<(), PlaceError> {
    let start = chunk as u64 * CHUNK;
    let end = (start + CHUNK).min(f.size);
    if data.len() as u64 != end - start {
        return Err(format!(
            "{} chunk {chunk}: {} bytes shared, the chunk has {}",
            f.rel,
            data.len(),
            end - start
        )
        .into());
    }
    match task {
        Some(t) => Ok(place_piece(t, start, data)?),
        None => Ok(()),
    }
}

/// The lazy pages of `task` among the bytes `data` at `at` of its pages
/// file, placed.
fn place_piece(task: &Task, at: u64, data: &[u8]) -> Result<(), String> {
    let end = at + data.len() as u64;
    for r in task.lazy.overlapping(at, end) {
        let (s, e) = (r.offset.max(at), (r.offset + r.len).min(end));
        copy(
            task,
            r.vaddr + (s - r.offset),
            &data[(s - at) as usize..(e - at) as usize],
        )?;
    }
    Ok(())
}
