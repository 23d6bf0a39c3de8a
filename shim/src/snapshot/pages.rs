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
//! The tree stays stopped meanwhile (CRIU's `leave-stopped`, as for every
//! CPU restore): no task runs, forks, unmaps or discards memory before all
//! its pages are in, so the server never has to follow a changing address
//! space. An event other than a page fault is therefore an error, and so
//! is any range that could not be filled: a registered range left empty
//! would read as zeros once the descriptor is closed.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A page server listening for one restore.
pub struct PageServer {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    result: Option<tokio::sync::oneshot::Receiver<Result<Placed, String>>>,
}

impl PageServer {
    /// Listens on `<work>/lazy-pages.socket` (before CRIU starts: it
    /// connects first thing) for the restore of `images`.
    pub fn start(work: &Path, images: &Path, threads: usize) -> Result<Self, String> {
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
                let _ = tx.send(serve(listener, &images, threads.max(1), &flag));
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
    pub async fn finish(mut self, deadline: Instant) -> Result<Placed, String> {
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
    pages: File,
    lazy: LazyPages,
}

fn serve(
    listener: UnixListener,
    images: &Path,
    threads: usize,
    stop: &AtomicBool,
) -> Result<Placed, String> {
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
    let work = work_list(&tasks);
    let next = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let filled = std::thread::scope(|s| {
        let fillers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = Buffer::new(FILL_CHUNK as usize);
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            return Err("cancelled".to_string());
                        }
                        let Some(&(task, vaddr, len, offset)) =
                            work.get(next.fetch_add(1, Ordering::Relaxed))
                        else {
                            return Ok(());
                        };
                        place(&tasks[task], vaddr, len, offset, &mut buf)?;
                    }
                })
            })
            .collect();
        // Meanwhile: the faults of tasks waiting for a page.
        let serving = s.spawn(|| -> Result<(), String> {
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

/// Every range of every task in chunks of at most [`FILL_CHUNK`]:
/// `(task, vaddr, len, offset)`.
fn work_list(tasks: &[Task]) -> Vec<(usize, u64, u64, u64)> {
    let mut work = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        for r in &t.lazy.ranges {
            let mut at = 0;
            while at < r.len {
                let len = FILL_CHUNK.min(r.len - at);
                work.push((i, r.vaddr + at, len, r.offset + at));
                at += len;
            }
        }
    }
    work
}

impl Task {
    fn open(images: &Path, pid: i32, uffd: OwnedFd) -> Result<Self, String> {
        let lazy = criu_image::lazy_pages(images, pid)?;
        let path = images.join(format!("pages-{}.img", lazy.pages_id));
        let pages = File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
        Ok(Task {
            pid,
            uffd,
            pages,
            lazy,
        })
    }
}

/// Places `len` bytes at `vaddr` of `task` from `offset` of its pages file.
/// A page already there was placed by the fault path with the same bytes.
fn place(task: &Task, vaddr: u64, len: u64, offset: u64, buf: &mut Buffer) -> Result<(), String> {
    let data = &mut buf.as_mut()[..len as usize];
    task.pages.read_exact_at(data, offset).map_err(|e| {
        format!(
            "pid {}: read {len} bytes at {offset} of its pages: {e}",
            task.pid
        )
    })?;
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
