//! The pages files read whole once the restore finished, each 64 MiB chunk
//! hashed as it is read and checked against the manifest's digest, its lazy
//! pages placed from the same buffer.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vsnap_artifact::at_rest::{FileCipher, Opener};
use vsnap_artifact::content::ChunkDigest;
use vsnap_artifact::{ArtifactError, Contents, FileDigest};

use crate::chunks::{read_chunk, Chunk, PIECE};
use crate::error::{pid, PageError, Phase};

use super::arrivals::Arrivals;
use super::place::copy;
use super::task::{task_pages_files, Task};

/// The pages files the server checks while placing them: `dir` is the
/// artifact (named in errors), `files` the digests of its tasks' pages
/// files (`images/pages-<id>.img`), taken out of the restore's other
/// verification.
#[derive(Debug, Clone)]
pub struct Verification {
    pub dir: PathBuf,
    pub files: Vec<(String, FileDigest)>,
}

impl Verification {
    /// The tasks' pages files of the artifact in `dir` (its `images/`),
    /// each with its digest of `contents`: what the server checks as it
    /// places them, and the restore's other verification leaves to it.
    /// An error where the pagemaps cannot be read.
    pub fn of_tasks(dir: &Path, contents: &Contents) -> Result<Self, PageError> {
        let names = task_pages_files(&dir.join("images"))?;
        let files = names
            .into_iter()
            .filter_map(|rel| contents.get(&rel).map(|d| (rel, d.clone())))
            .collect();
        Ok(Verification {
            dir: dir.to_path_buf(),
            files,
        })
    }

    /// The files it checks, as the artifact names them.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.iter().map(|(rel, _)| rel.as_str())
    }
}

/// A pages file read whole once the restore finished: every chunk checked
/// against its digest (when verifying), the lazy ranges of its task placed.
pub(super) struct PagesFile {
    pub(super) rel: String,
    file: File,
    pub(super) size: u64,
    digest: Option<FileDigest>,
    pub(super) task: Option<usize>,
    /// Where its bytes still arrive (a streamed restore).
    pub(super) stream: Option<Arc<Arrivals>>,
    /// Its cipher, where sealed at rest: each piece is opened as read.
    sealed: Option<FileCipher>,
}

/// The files to read after the restore: with verification, exactly the
/// pages files it names (each task's must be among them); without, each
/// task's. A task whose ranges reach past its file's end is refused: its
/// missing pages would read as zeros.
pub(super) fn pages_files(
    images: &Path,
    tasks: &[Task],
    verify: Option<&Verification>,
    (stream, sealed): (Option<&Arc<Arrivals>>, Option<&Opener>),
) -> Result<Vec<PagesFile>, PageError> {
    let mut files = match verify {
        Some(v) => verified_files(images, tasks, v)?,
        None => task_files(tasks)?,
    };
    for f in &mut files {
        f.stream = stream.cloned();
        f.sealed = sealed.and_then(|o| o.file(&f.rel));
    }
    for f in &files {
        if let Some(t) = f.task.map(|t| &tasks[t]) {
            let end = t.lazy.ranges.last().map_or(0, |r| r.offset + r.len);
            if end > f.size {
                return Err(PageError::failed(
                    Phase::Images,
                    pid(t.pid),
                    format!(
                        "its pagemap needs {end} bytes of {}, which holds {}",
                        f.rel, f.size
                    ),
                ));
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
) -> Result<Vec<PagesFile>, PageError> {
    let mut files = Vec::new();
    for (rel, digest) in &v.files {
        let name = rel.strip_prefix("images/").unwrap_or(rel);
        let path = images.join(name);
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| PageError::failed(Phase::Read, path.display(), format!("open: {e}")))?;
        let size = file
            .metadata()
            .map_err(|e| PageError::failed(Phase::Read, path.display(), format!("stat: {e}")))?
            .len();
        if size != digest.size {
            return Err(PageError::Damaged(ArtifactError::Damaged(format!(
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
            stream: None,
            sealed: None,
        });
    }
    if let Some(t) = tasks
        .iter()
        .find(|t| !files.iter().any(|f| f.rel == t.pages_rel))
    {
        return Err(PageError::failed(
            Phase::Verify,
            pid(t.pid),
            format!("{} has no digest to check it against", t.pages_rel),
        ));
    }
    Ok(files)
}

/// Each task's own pages file, unchecked.
fn task_files(tasks: &[Task]) -> Result<Vec<PagesFile>, PageError> {
    let mut files = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let fail = |e| PageError::failed(Phase::Read, pid(t.pid), format!("{}: {e}", t.pages_rel));
        let file = t.pages.try_clone().map_err(fail)?;
        let size = file.metadata().map_err(fail)?.len();
        files.push(PagesFile {
            rel: t.pages_rel.clone(),
            file,
            size,
            digest: None,
            task: Some(i),
            stream: None,
            sealed: None,
        });
    }
    Ok(files)
}

/// Bytes of a piece opened and hashed at once: within a core's L2 cache.
const OPEN_PART: usize = 256 << 10;

/// Reads chunk `chunk` of `f` a piece at a time: hashes each piece (when
/// verifying) and places the lazy pages in it into `task`'s memory from
/// the same buffer; then checks the chunk's digest. A chunk still on its
/// way (a streamed restore) is waited for whole first, until `stop`. `buf` is a filler's
/// buffer, each piece read to its start, or one as long as the chunk (a
/// memfd shared with other restores), which then holds the whole chunk.
pub(super) fn place_chunk(
    f: &PagesFile,
    chunk: usize,
    task: Option<&Task>,
    dir: &Path,
    buf: &mut [u8],
    stop: &AtomicBool,
) -> Result<(), PageError> {
    let c = Chunk::of(0, f.size, chunk);
    if let Some(arrivals) = &f.stream {
        arrivals.wait(&f.rel, c.start, c.end, stop)?;
    }
    let mut digest = f.digest.as_ref().map(|_| ChunkDigest::new());
    read_chunk(&f.file, &f.rel, c, PIECE, buf, |at, data| {
        // Sealed at rest: opened in the buffer, then hashed (the digests
        // are of the plaintext), a cache-sized part at a time so the hash
        // reads what the cipher just wrote; then placed.
        for (i, part) in data.chunks_mut(OPEN_PART).enumerate() {
            if let Some(c) = &f.sealed {
                c.apply(at + (i * OPEN_PART) as u64, part);
            }
            if let Some(d) = digest.as_mut() {
                d.update(part);
            }
        }
        match task {
            Some(t) => place_piece(t, at, data),
            None => Ok(()),
        }
    })?;
    if let (Some(d), Some(want)) = (digest, &f.digest) {
        d.check(dir, &f.rel, want, chunk)
            .map_err(PageError::Damaged)?;
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
) -> Result<(), PageError> {
    let c = Chunk::of(0, f.size, chunk);
    if data.len() as u64 != c.len() {
        return Err(PageError::failed(
            Phase::Share,
            format!("{} chunk {chunk}", f.rel),
            format!("{} bytes shared, the chunk has {}", data.len(), c.len()),
        ));
    }
    match task {
        Some(t) => place_piece(t, c.start, data),
        None => Ok(()),
    }
}

/// The lazy pages of `task` among the bytes `data` at `at` of its pages
/// file, placed.
fn place_piece(task: &Task, at: u64, data: &[u8]) -> Result<(), PageError> {
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
