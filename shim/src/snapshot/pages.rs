//! vsnap's page server: places a restored tree's memory with several
//! threads, where CRIU alone copies it with one.
//!
//! With `lazy-pages` in its config, CRIU restores everything but the pages
//! of private anonymous memory (what an engine's heap and weights are): each
//! restored task registers those ranges with a userfaultfd and CRIU hands
//! the descriptor to a server listening on `lazy-pages.socket` in its work
//! folder (`criu/uffd.c`: per task an `int` pid then the fd with one byte;
//! a negative pid for a zombie; `RESTORE_FINISHED` once every task is in
//! place). This server reads each task's pagemap and pages from the
//! artifact's own images and fills every range with `UFFDIO_COPY` from
//! `threads` threads once the restore finished, serving any page a task
//! touches before that at once.
//!
//! It also verifies the pages files: each thread takes a 64 MiB chunk,
//! reads it in pieces, hashes each piece and places its lazy pages from
//! the same buffer, then checks the chunk's digest from the manifest. Every
//! byte is read once, hashed once and copied once, on every core; a damaged
//! chunk fails the restore before anything of the tree has run.
//!
//! The tree stays stopped meanwhile (CRIU's `leave-stopped`, as for every
//! CPU restore): no task runs, forks, unmaps or discards memory before all
//! its pages are in, so the server never has to follow a changing address
//! space. An event other than a page fault is therefore an error, and so
//! is any range that could not be filled: a registered range left empty
//! would read as zeros once the descriptor is closed.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vsnap_artifact::content::{ChunkDigest, CHUNK};
use vsnap_artifact::{ArtifactError, FileDigest};

use super::criu_image::{self, LazyPages, PAGE_SIZE};

/// CRIU connects to this name in its work folder.
pub const SOCKET_NAME: &str = "lazy-pages.socket";
/// `LAZY_PAGES_RESTORE_FINISHED` ("RSTF").
const RESTORE_FINISHED: u32 = 0x5253_5446;
/// Bytes one `UFFDIO_COPY` of a filling thread places.
const FILL_CHUNK: u64 = 2 << 20;
/// Bytes placed around a page a task touched before its range was filled.
const FAULT_CHUNK: u64 = 64 << 10;

// <linux/userfaultfd.h>
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_MSG_SIZE: usize = 32;

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// What the server placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Placed {
    pub tasks: usize,
    pub bytes: u64,
    pub faults: u64,
    /// From the end of CRIU's restore to the last page in place.
    pub fill: Duration,
}

/// Why pages could not be placed.
#[derive(Debug)]
pub enum PlaceError {
    /// A pages file differs from its digest: the artifact is damaged.
    Damaged(ArtifactError),
    Failed(String),
}

impl From<String> for PlaceError {
    fn from(e: String) -> Self {
        PlaceError::Failed(e)
    }
}

impl From<&str> for PlaceError {
    fn from(e: &str) -> Self {
        PlaceError::Failed(e.to_string())
    }
}

impl std::fmt::Display for PlaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlaceError::Damaged(e) => e.fmt(f),
            PlaceError::Failed(e) => f.write_str(e),
        }
    }
}

/// The pages files the server checks while placing them: `dir` is the
/// artifact (named in errors), `files` the digests of its tasks' pages
/// files (`images/pages-<id>.img`), taken out of the restore's other
/// verification.
pub struct Verification {
    pub dir: PathBuf,
    pub files: Vec<(String, FileDigest)>,
}

/// The pages files of the tasks in `images`, as `images/pages-<id>.img`:
/// what the page server reads whole (shared memory's pages files are not
/// among them: CRIU places those itself).
pub fn task_pages_files(images: &Path) -> Result<Vec<String>, String> {
    let entries =
        std::fs::read_dir(images).map_err(|e| format!("read {}: {e}", images.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let name = entry
            .map_err(|e| format!("read {}: {e}", images.display()))?
            .file_name();
        let name = name.to_string_lossy();
        let pid = name
            .strip_prefix("pagemap-")
            .and_then(|n| n.strip_suffix(".img"))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if pid.is_some() {
            let path = images.join(&*name);
            let bytes =
                std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
            let (id, _) = criu_image::parse_pagemap(&bytes)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            out.push(format!("images/pages-{id}.img"));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A page server listening for one restore.
pub struct PageServer {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    result: Option<tokio::sync::oneshot::Receiver<Result<Placed, PlaceError>>>,
}

impl PageServer {
    /// Listens on `<work>/lazy-pages.socket` (before CRIU starts: it
    /// connects first thing) for the restore of `images`.
    pub fn start(
        work: &Path,
        images: &Path,
        threads: usize,
        verify: Option<Verification>,
    ) -> Result<Self, String> {
        let socket = work.join(SOCKET_NAME);
        let _ = std::fs::remove_file(&socket);
        let listener = bind(work, &socket)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", socket.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (images, flag) = (images.to_path_buf(), stop.clone());
        std::thread::Builder::new()
            .name("vsnap-pages".into())
            .spawn(move || {
                let _ = tx.send(serve(listener, &images, threads.max(1), verify, &flag));
            })
            .map_err(|e| format!("start the page server: {e}"))?;
        Ok(PageServer {
            socket,
            stop,
            result: Some(rx),
        })
    }

    /// Waits until every page is in place (after CRIU's restore returned),
    /// at most until `deadline`.
    pub async fn finish(mut self, deadline: Instant) -> Result<Placed, PlaceError> {
        let rx = self.result.take().expect("finished once");
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(placed)) => placed,
            Ok(Err(_)) => Err("the page server thread ended without a result".into()),
            Err(_) => Err("pages not in place by the deadline".into()),
        }
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        // Ends the thread wherever it waits; its descriptors go with it.
        self.stop.store(true, Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Binds `socket`; a path too long for `sun_path` is reached through the
/// folder's descriptor.
fn bind(work: &Path, socket: &Path) -> Result<UnixListener, String> {
    let fail = |e: std::io::Error| format!("listen on {}: {e}", socket.display());
    if socket.as_os_str().len() < 100 {
        return UnixListener::bind(socket).map_err(fail);
    }
    let dir = File::open(work).map_err(fail)?;
    UnixListener::bind(format!("/proc/self/fd/{}/{SOCKET_NAME}", dir.as_raw_fd())).map_err(fail)
}

/// One restored task: its userfaultfd, pages file and lazy ranges.
struct Task {
    pid: i32,
    uffd: OwnedFd,
    /// `images/pages-<id>.img`.
    pages_rel: String,
    pages: File,
    lazy: LazyPages,
}

/// A pages file read whole once the restore finished: every chunk checked
/// against its digest (when verifying), the lazy ranges of its task placed.
struct PagesFile {
    rel: String,
    file: File,
    size: u64,
    digest: Option<FileDigest>,
    task: Option<usize>,
}

fn serve(
    listener: UnixListener,
    images: &Path,
    threads: usize,
    verify: Option<Verification>,
    stop: &AtomicBool,
) -> Result<Placed, PlaceError> {
    let conn = accept(&listener, stop)?;
    drop(listener);
    let faults = AtomicU64::new(0);
    let mut fault_buf = Buffer::new(FAULT_CHUNK as usize);
    let mut tasks: Vec<Task> = Vec::new();
    // Until CRIU says the restore finished: take each task's descriptor,
    // serve the pages touched meanwhile.
    loop {
        if stop.load(Ordering::SeqCst) {
            return Err("cancelled".into());
        }
        let ready = wait(conn.as_raw_fd(), &tasks)?;
        for t in ready.iter().filter_map(|&i| tasks.get(i)) {
            serve_faults(t, &mut fault_buf, &faults)?;
        }
        if ready.contains(&usize::MAX) {
            match receive(&conn)? {
                Message::Task(pid, uffd) => tasks.push(Task::open(images, pid, uffd)?),
                Message::Zombie => {}
                Message::Finished => break,
            }
        }
    }
    let started = Instant::now();
    let files = pages_files(images, &tasks, verify.as_ref())?;
    let dir = verify.map(|v| v.dir).unwrap_or_default();
    let work: Vec<(usize, usize)> = files
        .iter()
        .enumerate()
        .flat_map(|(i, f)| (0..f.size.div_ceil(CHUNK) as usize).map(move |c| (i, c)))
        .collect();
    let next = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let filled = std::thread::scope(|s| {
        let fillers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = Buffer::new(FILL_CHUNK as usize);
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            return Err(PlaceError::from("cancelled"));
                        }
                        let Some(&(file, chunk)) = work.get(next.fetch_add(1, Ordering::Relaxed))
                        else {
                            return Ok(());
                        };
                        let f = &files[file];
                        place_chunk(f, chunk, f.task.map(|t| &tasks[t]), &dir, &mut buf)?;
                    }
                })
            })
            .collect();
        // Meanwhile: the faults of tasks waiting for a page.
        let serving = s.spawn(|| -> Result<(), PlaceError> {
            while !done.load(Ordering::SeqCst) {
                for i in wait(-1, &tasks)? {
                    serve_faults(&tasks[i], &mut fault_buf, &faults)?;
                }
            }
            Ok(())
        });
        let mut result = Ok(());
        for f in fillers {
            let r = f
                .join()
                .unwrap_or_else(|_| Err("a filling thread panicked".into()));
            if result.is_ok() {
                result = r;
            }
            if result.is_err() {
                stop.store(true, Ordering::SeqCst);
            }
        }
        done.store(true, Ordering::SeqCst);
        let served = serving
            .join()
            .unwrap_or_else(|_| Err("the fault thread panicked".into()));
        result.and(served)
    });
    filled?;
    // Anything still queued must be a fault, now satisfied.
    let mut buf = Buffer::new(FAULT_CHUNK as usize);
    for t in &tasks {
        serve_faults(t, &mut buf, &faults)?;
    }
    Ok(Placed {
        tasks: tasks.len(),
        bytes: tasks.iter().map(|t| t.lazy.bytes()).sum(),
        faults: faults.load(Ordering::Relaxed),
        fill: started.elapsed(),
    })
}

/// The files to read after the restore: with verification, exactly the
/// pages files it names (each task's must be among them); without, each
/// task's. A task whose ranges reach past its file's end is refused: its
/// missing pages would read as zeros.
fn pages_files(
    images: &Path,
    tasks: &[Task],
    verify: Option<&Verification>,
) -> Result<Vec<PagesFile>, PlaceError> {
    let mut files = Vec::new();
    match verify {
        Some(v) => {
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
        }
        None => {
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
        }
    }
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

/// Reads chunk `chunk` of `f` a piece at a time: hashes each piece (when
/// verifying) and places the lazy pages in it into `task`'s memory from
/// the same buffer; then checks the chunk's digest.
fn place_chunk(
    f: &PagesFile,
    chunk: usize,
    task: Option<&Task>,
    dir: &Path,
    buf: &mut Buffer,
) -> Result<(), PlaceError> {
    let start = chunk as u64 * CHUNK;
    let end = (start + CHUNK).min(f.size);
    let mut digest = f.digest.as_ref().map(|_| ChunkDigest::new());
    let mut at = start;
    while at < end {
        let n = FILL_CHUNK.min(end - at);
        let data = &mut buf.as_mut()[..n as usize];
        f.file
            .read_exact_at(data, at)
            .map_err(|e| format!("read {n} bytes at {at} of {}: {e}", f.rel))?;
        if let Some(d) = digest.as_mut() {
            d.update(data);
        }
        if let Some(t) = task {
            for r in t.lazy.overlapping(at, at + n) {
                let (s, e) = (r.offset.max(at), (r.offset + r.len).min(at + n));
                copy(
                    t,
                    r.vaddr + (s - r.offset),
                    &data[(s - at) as usize..(e - at) as usize],
                )?;
            }
        }
        at += n;
    }
    if let (Some(d), Some(want)) = (digest, &f.digest) {
        d.check(dir, &f.rel, want, chunk)
            .map_err(PlaceError::Damaged)?;
    }
    Ok(())
}

impl Task {
    fn open(images: &Path, pid: i32, uffd: OwnedFd) -> Result<Self, String> {
        let lazy = criu_image::lazy_pages(images, pid)?;
        let name = format!("pages-{}.img", lazy.pages_id);
        let path = images.join(&name);
        let pages = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        Ok(Task {
            pid,
            uffd,
            pages_rel: format!("images/{name}"),
            pages,
            lazy,
        })
    }
}

/// Places `len` bytes at `vaddr` of `task` from `offset` of its pages file
/// (a page a task touched before its chunk was placed; the chunk is
/// checked against its digest all the same before the tree runs).
fn place(task: &Task, vaddr: u64, len: u64, offset: u64, buf: &mut Buffer) -> Result<(), String> {
    let data = &mut buf.as_mut()[..len as usize];
    task.pages.read_exact_at(data, offset).map_err(|e| {
        format!(
            "pid {}: read {len} bytes at {offset} of its pages: {e}",
            task.pid
        )
    })?;
    copy(task, vaddr, data)
}

/// `UFFDIO_COPY` of `data` (page-aligned) to `vaddr` of `task`. A page
/// already there was placed by this server with the same bytes.
fn copy(task: &Task, vaddr: u64, data: &[u8]) -> Result<(), String> {
    let len = data.len() as u64;
    let mut done = 0u64;
    while done < len {
        let mut c = UffdioCopy {
            dst: vaddr + done,
            src: data.as_ptr() as u64 + done,
            len: len - done,
            mode: 0,
            copy: 0,
        };
        // SAFETY: `c` is a valid uffdio_copy; the kernel reads `len - done`
        // bytes from `data` (in bounds) and writes only `c.copy`.
        let rc = unsafe { libc::ioctl(task.uffd.as_raw_fd(), UFFDIO_COPY, &mut c) };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if c.copy > 0 {
            done += c.copy as u64;
        }
        match err.raw_os_error() {
            Some(libc::EAGAIN) => std::thread::yield_now(),
            Some(libc::EEXIST) if c.copy <= 0 => done += PAGE_SIZE,
            Some(libc::EEXIST) => {}
            _ => {
                return Err(format!(
                    "pid {}: UFFDIO_COPY of {:#x}+{}: {err}",
                    task.pid,
                    vaddr + done,
                    len - done
                ))
            }
        }
    }
    Ok(())
}

/// Reads every queued message of `task`'s descriptor; a page fault gets
/// its neighbourhood placed now, any other event fails the restore.
fn serve_faults(task: &Task, buf: &mut Buffer, faults: &AtomicU64) -> Result<(), String> {
    let mut msgs = [0u8; UFFD_MSG_SIZE * 16];
    loop {
        let n = match nix::unistd::read(&task.uffd, &mut msgs) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("pid {}: read its userfaultfd: {e}", task.pid)),
        };
        if n == 0 {
            return Ok(());
        }
        for msg in msgs[..n].chunks_exact(UFFD_MSG_SIZE) {
            if msg[0] != UFFD_EVENT_PAGEFAULT {
                return Err(format!(
                    "pid {}: userfaultfd event {:#x} while its pages were placed: the tree ran before it was restored",
                    task.pid, msg[0]
                ));
            }
            let addr =
                u64::from_le_bytes(msg[16..24].try_into().expect("8 bytes")) & !(PAGE_SIZE - 1);
            let r = task.lazy.find(addr).ok_or_else(|| {
                format!(
                    "pid {}: a fault at {addr:#x}, outside its lazy pages",
                    task.pid
                )
            })?;
            let start = (addr & !(FAULT_CHUNK - 1)).max(r.vaddr);
            let end = (start + FAULT_CHUNK).min(r.vaddr + r.len);
            place(task, start, end - start, r.offset + (start - r.vaddr), buf)?;
            faults.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits up to 50 ms for `conn` (reported as `usize::MAX`; -1 for none) or
/// a task's descriptor to be readable; returns which are.
fn wait(conn: RawFd, tasks: &[Task]) -> Result<Vec<usize>, String> {
    let mut fds: Vec<libc::pollfd> = tasks
        .iter()
        .map(|t| libc::pollfd {
            fd: t.uffd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    if conn >= 0 {
        fds.push(libc::pollfd {
            fd: conn,
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // SAFETY: `fds` is a valid array of pollfd of the given length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(Vec::new());
        }
        return Err(format!("poll: {e}"));
    }
    Ok(fds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, _)| if i == tasks.len() { usize::MAX } else { i })
        .collect())
}

fn accept(listener: &UnixListener, stop: &AtomicBool) -> Result<UnixStream, String> {
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)
                    .map_err(|e| format!("the CRIU connection: {e}"))?;
                return Ok(conn);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if stop.load(Ordering::SeqCst) {
                    return Err("cancelled before CRIU connected".into());
                }
                let mut p = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, 50) };
            }
            Err(e) => return Err(format!("accept CRIU's connection: {e}")),
        }
    }
}

enum Message {
    Task(i32, OwnedFd),
    Zombie,
    Finished,
}

/// One message of CRIU's lazy-pages protocol.
fn receive(conn: &UnixStream) -> Result<Message, String> {
    let mut word = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let (n, _) = recv(conn, &mut word[got..])?;
        if n == 0 {
            return Err("CRIU closed the connection before the restore finished".into());
        }
        got += n;
    }
    let value = u32::from_ne_bytes(word);
    if value == RESTORE_FINISHED {
        return Ok(Message::Finished);
    }
    let pid = value as i32;
    if pid < 0 {
        return Ok(Message::Zombie);
    }
    let mut byte = [0u8; 1];
    match recv(conn, &mut byte)? {
        (1, Some(fd)) => Ok(Message::Task(pid, fd)),
        _ => Err(format!("CRIU sent pid {pid} without its userfaultfd")),
    }
}

/// `recvmsg` of up to `buf.len()` bytes and at most one descriptor.
fn recv(conn: &UnixStream, buf: &mut [u8]) -> Result<(usize, Option<OwnedFd>), String> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut space = nix::cmsg_space!(RawFd);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("receive from CRIU: {e}"))?;
    let mut fd = None;
    for c in msg.cmsgs().map_err(|e| format!("receive from CRIU: {e}"))? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: a descriptor just received, owned by nobody else.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    Ok((msg.bytes, fd))
}

/// A page-aligned buffer (`UFFDIO_COPY` wants a page-aligned source).
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by one thread at a time.
unsafe impl Send for Buffer {}

impl Buffer {
    fn new(len: usize) -> Self {
        let layout =
            std::alloc::Layout::from_size_align(len, PAGE_SIZE as usize).expect("a layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "out of memory for a {len}-byte buffer");
        Buffer { ptr, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `len` bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len, PAGE_SIZE as usize).expect("a layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

#[cfg(test)]
mod tests {
    //! The server against this process's own memory: a region registered
    //! with a real userfaultfd, images written as CRIU writes them, and the
    //! descriptor handed over as CRIU's restore does.
    use super::criu_image::testing::{entry, image, mm};
    use super::*;
    use std::io::{IoSlice, Write};

    const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
    const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
    const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;

    struct Region {
        addr: *mut u8,
        len: usize,
        uffd: OwnedFd,
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // The descriptor first: with it open, an unmap would wait for a
            // reader of its event.
            let fd = std::mem::replace(&mut self.uffd, File::open("/dev/null").unwrap().into());
            drop(fd);
            // SAFETY: mapped in `region`, no reference to it outlives the test.
            unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
        }
    }

    /// `len` bytes of fresh anonymous memory whose missing pages go to the
    /// returned userfaultfd.
    fn region(len: usize, features: u64) -> Region {
        // SAFETY: plain syscalls on memory and descriptors this test owns.
        unsafe {
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(addr, libc::MAP_FAILED);
            let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK);
            assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
            let uffd = OwnedFd::from_raw_fd(fd as RawFd);
            let mut api = [0xAAu64, features, 0];
            assert_eq!(libc::ioctl(fd as RawFd, UFFDIO_API, api.as_mut_ptr()), 0);
            let mut reg = [addr as u64, len as u64, 1 /* MISSING */, 0];
            assert_eq!(
                libc::ioctl(fd as RawFd, UFFDIO_REGISTER, reg.as_mut_ptr()),
                0
            );
            Region {
                addr: addr as *mut u8,
                len,
                uffd,
            }
        }
    }

    /// Images of task `pid`: one present, not lazy page elsewhere first (so
    /// the region's bytes start one page into the pages file), then the
    /// region, lazy. Returns the region's expected bytes.
    fn write_images(dir: &Path, pid: i32, r: &Region) -> Vec<u8> {
        let data: Vec<u8> = (0..r.len).map(|i| (i * 7 + i / 4096) as u8).collect();
        let start = r.addr as u64;
        let pagemap = image(
            criu_image::PAGEMAP_MAGIC,
            &[
                vec![8, 1],
                entry(0x1000, 1, Some(criu_image::PE_PRESENT)),
                entry(
                    start,
                    (r.len as u64) / PAGE_SIZE,
                    Some(criu_image::PE_PRESENT | criu_image::PE_LAZY),
                ),
            ],
        );
        std::fs::write(dir.join(format!("pagemap-{pid}.img")), pagemap).unwrap();
        let mm = mm(start, start + r.len as u64);
        std::fs::write(
            dir.join(format!("mm-{pid}.img")),
            image(criu_image::MM_MAGIC, &[mm]),
        )
        .unwrap();
        let mut pages = vec![0xEEu8; PAGE_SIZE as usize];
        pages.extend(&data);
        std::fs::write(dir.join("pages-1.img"), pages).unwrap();
        data
    }

    /// CRIU's side of the socket.
    fn connect(work: &Path) -> UnixStream {
        UnixStream::connect(work.join(SOCKET_NAME)).unwrap()
    }

    fn send_task(conn: &mut UnixStream, pid: i32, uffd: &OwnedFd) {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        conn.write_all(&pid.to_ne_bytes()).unwrap();
        let fds = [uffd.as_raw_fd()];
        sendmsg::<()>(
            conn.as_raw_fd(),
            &[IoSlice::new(&[0])],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[tokio::test]
    async fn every_lazy_page_is_placed_and_a_touched_page_is_served_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let len = (5 << 20) + 3 * PAGE_SIZE as usize; // several fill chunks and a tail
        let r = region(len, 0);
        let data = write_images(dir.path(), 7, &r);
        let server = PageServer::start(dir.path(), dir.path(), 2, None).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 7, &r.uffd);
        conn.write_all(&(-9i32).to_ne_bytes()).unwrap(); // a zombie: no descriptor
                                                         // A task touching its memory before the restore finished waits only
                                                         // for its own page.
        let at = r.addr as usize + (3 << 20) + 5;
        let touched = std::thread::spawn(move || {
            // SAFETY: inside the region, which outlives this thread (joined below).
            unsafe { std::ptr::read_volatile(at as *const u8) }
        })
        .join()
        .unwrap();
        assert_eq!(touched, data[(3 << 20) + 5]);
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        let placed = server.finish(deadline()).await.unwrap();
        assert_eq!((placed.tasks, placed.bytes), (1, len as u64));
        assert!(placed.faults >= 1, "{placed:?}");
        // SAFETY: the region is mapped and every page of it is now present.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(memory == &data[..], "the region holds the image's bytes");
        assert!(
            !dir.path().join(SOCKET_NAME).exists(),
            "the socket went with the server"
        );
    }

    /// An artifact folder with `images/` for task `pid`, its digests, and
    /// the region's expected bytes.
    fn artifact(pid: i32, r: &Region) -> (tempfile::TempDir, Verification, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("images")).unwrap();
        let data = write_images(&dir.path().join("images"), pid, r);
        let contents = vsnap_artifact::content::digest(dir.path(), 1).unwrap();
        let names = task_pages_files(&dir.path().join("images")).unwrap();
        assert_eq!(names, vec!["images/pages-1.img".to_string()]);
        let files = names
            .into_iter()
            .map(|n| (n.clone(), contents[&n].clone()))
            .collect();
        let v = Verification {
            dir: dir.path().to_path_buf(),
            files,
        };
        (dir, v, data)
    }

    #[tokio::test]
    async fn pages_are_checked_against_their_digests_as_they_are_placed() {
        // Past one 64 MiB digest chunk, so two threads share the work.
        let len = (CHUNK + (3 << 20)) as usize;
        let r = region(len, 0);
        let (dir, v, data) = artifact(11, &r);
        let images = dir.path().join("images");
        let server = PageServer::start(dir.path(), &images, 2, Some(v)).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 11, &r.uffd);
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        let placed = server.finish(deadline()).await.unwrap();
        assert_eq!(placed.bytes, len as u64);
        // SAFETY: the region is mapped and every page of it is now present.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(memory == &data[..]);
    }

    #[tokio::test]
    async fn a_damaged_pages_chunk_fails_naming_the_file_and_the_chunk() {
        let len = (CHUNK + (1 << 20)) as usize;
        let r = region(len, 0);
        let (dir, v, _) = artifact(12, &r);
        let images = dir.path().join("images");
        // One bit of the second chunk, after the digests were taken.
        let path = images.join("pages-1.img");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[CHUNK as usize + 4096 * 3 + 17] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
        let server = PageServer::start(dir.path(), &images, 2, Some(v)).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 12, &r.uffd);
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        match server.finish(deadline()).await.unwrap_err() {
            PlaceError::Damaged(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("images/pages-1.img chunk 1 (bytes 67108864-"),
                    "{e}"
                );
            }
            other => panic!("not a damage: {other}"),
        }
    }

    #[tokio::test]
    async fn an_address_space_change_while_pages_are_placed_fails_the_restore() {
        let dir = tempfile::tempdir().unwrap();
        let r = region(1 << 20, UFFD_FEATURE_EVENT_UNMAP);
        write_images(dir.path(), 8, &r);
        let server = PageServer::start(dir.path(), dir.path(), 2, None).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 8, &r.uffd);
        // The "tree" runs and unmaps part of its memory: it waits until the
        // server read the event, which the server refuses.
        let at = r.addr as usize;
        let unmapped = std::thread::spawn(move || {
            // SAFETY: the first page of the region; nothing reads it after.
            unsafe { libc::munmap(at as *mut libc::c_void, PAGE_SIZE as usize) }
        });
        let e = server.finish(deadline()).await.unwrap_err().to_string();
        assert!(e.contains("event 0x16") && e.contains("pid 8"), "{e}");
        assert_eq!(unmapped.join().unwrap(), 0);
    }

    #[tokio::test]
    async fn criu_going_away_before_the_restore_finished_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let r = region(1 << 16, 0);
        write_images(dir.path(), 9, &r);
        let server = PageServer::start(dir.path(), dir.path(), 1, None).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 9, &r.uffd);
        drop(conn);
        let e = server.finish(deadline()).await.unwrap_err().to_string();
        assert!(e.contains("before the restore finished"), "{e}");
    }

    #[tokio::test]
    async fn a_task_without_images_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = region(1 << 16, 0);
        let server = PageServer::start(dir.path(), dir.path(), 1, None).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 10, &r.uffd);
        let e = server.finish(deadline()).await.unwrap_err().to_string();
        assert!(e.contains("pagemap-10.img"), "{e}");
    }

    #[test]
    fn dropping_the_server_removes_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let server = PageServer::start(dir.path(), dir.path(), 1, None).unwrap();
        assert!(dir.path().join(SOCKET_NAME).exists());
        drop(server);
        assert!(!dir.path().join(SOCKET_NAME).exists());
    }
}
