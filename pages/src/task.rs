//! A restored task as the page server knows it (its userfaultfd, pages
//! file and lazy ranges, read from its CRIU images), and which pages files
//! the tasks of an image folder read.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use vsnap_artifact::at_rest::{FileCipher, Opener};

use crate::error::{PageError, Phase};
use crate::images::{self, LazyPages};

use super::arrivals::Arrivals;
use super::huge::Huge;

/// One restored task: its userfaultfd, pages file and lazy ranges.
pub(super) struct Task {
    pub(super) pid: i32,
    pub(super) uffd: OwnedFd,
    /// `images/pages-<id>.img`.
    pub(super) pages_rel: String,
    pub(super) pages: File,
    /// Its pages file's cipher, where sealed at rest.
    pub(super) sealed: Option<FileCipher>,
    pub(super) lazy: LazyPages,
    /// Its VMAs eligible for huge pages, written rather than copied.
    pub(super) huge: Option<Huge>,
    /// Where its pages still arrive (a streamed restore).
    pub(super) stream: Option<Arc<Arrivals>>,
}

impl Task {
    /// Task `pid` (CRIU's, as its images name it), sent by host pid
    /// `sender` where the kernel said.
    pub(super) fn open(
        images: &Path,
        pid: i32,
        uffd: OwnedFd,
        sender: Option<i32>,
        (stream, opener): (Option<&Arc<Arrivals>>, Option<&Opener>),
    ) -> Result<Self, PageError> {
        let lazy = images::lazy_pages(images, pid)?;
        let huge = Huge::open(images, pid, sender, &lazy)?;
        let name = format!("pages-{}.img", lazy.pages_id);
        let path = images.join(&name);
        let pages = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| PageError::failed(Phase::Images, path.display(), format!("open: {e}")))?;
        let pages_rel = format!("images/{name}");
        Ok(Task {
            pid,
            uffd,
            sealed: opener.and_then(|o| o.file(&pages_rel)),
            pages_rel,
            pages,
            lazy,
            huge,
            stream: stream.cloned(),
        })
    }
}

/// The pages files of the tasks in `images`, as `images/pages-<id>.img`:
/// what the page server reads whole (shared memory's pages files are not
/// among them: CRIU places those itself).
pub fn task_pages_files(images: &Path) -> Result<Vec<String>, PageError> {
    let in_dir = |e: std::io::Error| {
        PageError::failed(Phase::Images, images.display(), format!("read: {e}"))
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(images).map_err(in_dir)? {
        let name = entry.map_err(in_dir)?.file_name();
        let name = name.to_string_lossy();
        let pid = name
            .strip_prefix("pagemap-")
            .and_then(|n| n.strip_suffix(".img"))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if pid.is_some() {
            let path = images.join(&*name);
            let in_file = |e: String| PageError::failed(Phase::Images, path.display(), e);
            let bytes = std::fs::read(&path).map_err(|e| in_file(format!("read: {e}")))?;
            let (id, _) = images::parse_pagemap(&bytes).map_err(in_file)?;
            out.push(format!("images/pages-{id}.img"));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}
