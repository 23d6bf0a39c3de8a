//! The page server's threads: one takes CRIU's connection and the tasks'
//! descriptors and serves early faults until the restore finished; then
//! `threads` fillers read and place the pages files chunk by chunk while
//! one more serves the faults of tasks waiting for a page.

use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vsnap_artifact::at_rest::Opener;

use crate::chunks::{Buffer, CHUNK};
use crate::error::{PageError, Phase};
use crate::plan::PagePlan;

use super::budget::Budget;
use super::fill::Fill;
use super::huge_free;
use super::outcome::Placed;
use super::place::{serve_faults, wait, FAULT_CHUNK};
use super::protocol::{accept, bind, receive, Message, SOCKET_NAME};
use super::share::{self, Role, Sharing};
use super::task::Task;
use super::verify::{pages_files, Verification};

/// This restore's part in its artifact's share, taken before CRIU starts
/// (a leader listens from then on); only a verified restore shares.
fn join_share(share: Option<&Sharing>, verify: Option<&Verification>) -> Option<Role> {
    let (s, v) = (share?, verify?);
    match share::join(s, v) {
        Ok(role) => role,
        Err(e) => {
            log::warn!("restore: {e}: placing alone");
            None
        }
    }
}

/// A page server listening for one restore.
pub struct PageServer {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    /// A streamed restore's arrivals, whose waits end with the server.
    arrivals: Option<Arc<super::arrivals::Arrivals>>,
    result: Option<tokio::sync::oneshot::Receiver<Result<Placed, PageError>>>,
}

impl PageServer {
    /// Listens on `<work>/lazy-pages.socket` (before CRIU starts: it
    /// connects first thing) for the restore `plan` describes.
    pub fn start(plan: PagePlan, work: &Path) -> Result<Self, PageError> {
        let budget = match &plan.budget {
            Some(b) => Some(Budget::open(&b.dir, b.slots)?),
            None => None,
        };
        let socket = work.join(SOCKET_NAME);
        let _ = std::fs::remove_file(&socket);
        let listener = bind(work, &socket)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| PageError::failed(Phase::Listen, socket.display(), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let flag = stop.clone();
        let role = match plan.arrivals {
            // What still arrives is not read whole at once: not shared.
            Some(_) => None,
            None => join_share(plan.share.as_ref(), plan.verification.as_ref()),
        };
        let arrivals = plan.arrivals.clone();
        std::thread::Builder::new()
            .name("vsnap-pages".into())
            .spawn(move || {
                let served = serve(listener, plan, budget, role.as_ref(), &flag);
                // A leader lets its followers go (they read what is left).
                drop(role);
                let _ = tx.send(served);
            })
            .map_err(|e| PageError::failed(Phase::Listen, "the server's thread", e))?;
        Ok(PageServer {
            socket,
            stop,
            arrivals,
            result: Some(rx),
        })
    }

    /// Waits until every page is in place (after CRIU's restore returned),
    /// at most until `deadline`.
    pub async fn finish(mut self, deadline: Instant) -> Result<Placed, PageError> {
        let rx = self.result.take().expect("finished once");
        let fail = |detail| PageError::failed(Phase::Finish, "the server's thread", detail);
        match tokio::time::timeout_at(deadline.into(), rx).await {
            Ok(Ok(placed)) => placed,
            Ok(Err(_)) => Err(fail("ended without a result")),
            Err(_) => Err(fail("pages not in place by the deadline")),
        }
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        // Ends the thread wherever it waits; its descriptors go with it.
        self.stop.store(true, Ordering::SeqCst);
        if let Some(a) = &self.arrivals {
            a.stop();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn serve(
    listener: UnixListener,
    plan: PagePlan,
    budget: Option<Budget>,
    role: Option<&Role>,
    stop: &AtomicBool,
) -> Result<Placed, PageError> {
    let conn = accept(&listener, stop)?;
    drop(listener);
    let images = plan.images.as_path();
    let faults = AtomicU64::new(0);
    let mut fault_buf = Buffer::new(FAULT_CHUNK as usize);
    let arrivals = plan.arrivals.clone();
    let stream = arrivals.as_ref();
    let sealed = plan.sealed.as_ref();
    let reading = (stream, sealed);
    let mut tasks = take_tasks(&conn, images, stop, (&mut fault_buf, &faults), reading)?;
    let started = Instant::now();
    // The tree is stopped now: the VMAs eligible for huge pages that the
    // policy places so leave the userfaultfd (a fault already queued is
    // served first), the fillers write them.
    let huge = huge_free::settle(&mut tasks, plan.huge);
    for t in &tasks {
        if let Some(h) = &t.huge {
            serve_faults(t, &mut fault_buf, &faults)?;
            h.take(t.pid, &t.uffd)?;
        }
    }
    let files = pages_files(images, &tasks, plan.verification.as_ref(), reading)?;
    let dir = plan.verification.map(|v| v.dir).unwrap_or_default();
    let fill = Fill {
        files: &files,
        tasks: &tasks,
        dir: &dir,
        stop,
        budget: budget.as_ref(),
        share: role,
        waited: AtomicU64::new(0),
    };
    fill.run(plan.threads.max(1), &mut fault_buf, &faults)?;
    let all: u64 = files.iter().map(|f| f.size.div_ceil(CHUNK)).sum();
    let (from_share, read, out) = match role {
        Some(Role::Follower(f)) => (f.counts().0, f.counts().1, 0),
        Some(Role::Leader(l)) => (0, all, l.sent()),
        None => (0, all, 0),
    };
    // Anything still queued must be a fault, now satisfied.
    let mut buf = Buffer::new(FAULT_CHUNK as usize);
    for t in &tasks {
        serve_faults(t, &mut buf, &faults)?;
    }
    Ok(Placed {
        tasks: tasks.len(),
        bytes: tasks.iter().map(|t| t.lazy.bytes()).sum(),
        huge_bytes: tasks
            .iter()
            .filter_map(|t| t.huge.as_ref().map(|h| h.bytes(&t.lazy)))
            .sum(),
        huge_declined_bytes: huge.declined_bytes,
        huge_free_blocks: huge.free_blocks,
        faults: faults.load(Ordering::Relaxed),
        fill: started.elapsed(),
        slot_wait: std::time::Duration::from_nanos(fill.waited.load(Ordering::Relaxed)),
        share_role: role.map(Role::name),
        chunks_from_share: from_share,
        chunks_read: read,
        chunks_shared_out: out,
        last_arrival_ms: arrivals.as_ref().map(|a| a.last_ms()),
    })
}

/// Until CRIU says the restore finished: takes each task's descriptor,
/// serves the pages touched meanwhile.
fn take_tasks(
    conn: &UnixStream,
    images: &Path,
    stop: &AtomicBool,
    (fault_buf, faults): (&mut Buffer, &AtomicU64),
    reading: (Option<&Arc<super::arrivals::Arrivals>>, Option<&Opener>),
) -> Result<Vec<Task>, PageError> {
    let mut tasks: Vec<Task> = Vec::new();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Err(PageError::cancelled(Phase::Connect));
        }
        let ready = wait(conn.as_raw_fd(), &tasks)?;
        for t in ready.iter().filter_map(|&i| tasks.get(i)) {
            serve_faults(t, fault_buf, faults)?;
        }
        if ready.contains(&usize::MAX) {
            match receive(conn)? {
                Message::Task(pid, uffd, sender) => {
                    tasks.push(Task::open(images, pid, uffd, sender, reading)?)
                }
                Message::Zombie => {}
                Message::Finished => return Ok(tasks),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The server against this process's own memory (`super::super::testing`).
    use super::super::protocol::RESTORE_FINISHED;
    use super::super::testing::{
        artifact, connect, deadline, region, send_task, verified, write_images,
        UFFD_FEATURE_EVENT_UNMAP,
    };
    use super::*;
    use crate::images::PAGE_SIZE;
    use std::io::Write;
    use vsnap_config::HugePages;

    #[tokio::test]
    async fn every_lazy_page_is_placed_and_a_touched_page_is_served_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let len = (5 << 20) + 3 * PAGE_SIZE as usize; // several fill chunks and a tail
        let r = region(len, 0);
        let data = write_images(dir.path(), 7, &r);
        let server = PageServer::start(PagePlan::new(dir.path(), 2), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 7, r.fd());
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

    #[tokio::test]
    async fn a_hole_in_the_pagemap_reads_as_zeros_when_touched_early_or_never() {
        use crate::images::testing::{entry, image};
        use crate::images::{MM_MAGIC, PAGEMAP_MAGIC, PE_LAZY, PE_PRESENT};
        let dir = tempfile::tempdir().unwrap();
        let pages = 64u64;
        let mut r = region((pages * PAGE_SIZE) as usize, 0);
        let data = write_images(dir.path(), 13, &r);
        // Pages 8-15 and 40-41 left out, as a capture elides zero pages:
        // three entries, the pages file without them.
        let start = r.addr as u64;
        let lazy = Some(PE_PRESENT | PE_LAZY);
        let at = |p: u64| start + p * PAGE_SIZE;
        let pagemap = image(
            PAGEMAP_MAGIC,
            &[
                vec![8, 1],
                entry(0x1000, 1, Some(PE_PRESENT)),
                entry(at(0), 8, lazy),
                entry(at(16), 24, lazy),
                entry(at(42), pages - 42, lazy),
            ],
        );
        std::fs::write(dir.path().join("pagemap-13.img"), pagemap).unwrap();
        let page = PAGE_SIZE as usize;
        let hole = |p: usize| (8..16).contains(&p) || (40..42).contains(&p);
        let mut file = vec![0xEEu8; page];
        let mut want = data.clone();
        for p in 0..pages as usize {
            if hole(p) {
                want[p * page..(p + 1) * page].fill(0);
            } else {
                file.extend(&data[p * page..(p + 1) * page]);
            }
        }
        std::fs::write(dir.path().join("pages-1.img"), file).unwrap();
        let mm = crate::images::testing::mm(start, at(pages));
        std::fs::write(dir.path().join("mm-13.img"), image(MM_MAGIC, &[mm])).unwrap();

        let server = PageServer::start(PagePlan::new(dir.path(), 2), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 13, r.fd());
        // A page of a hole touched before the restore finished: a zero page.
        // (Unanswered, the toucher would wait forever: bounded here.)
        let addr = at(9) as usize + 17;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: inside the region, which stays mapped while this
            // thread may read it (forgotten on a timeout below).
            let _ = tx.send(unsafe { std::ptr::read_volatile(addr as *const u8) });
        });
        let Ok(touched) = rx.recv_timeout(std::time::Duration::from_secs(30)) else {
            // The toucher still waits in the region: leave it mapped.
            std::mem::forget(r);
            panic!("a fault in a hole of the pagemap went unanswered");
        };
        assert_eq!(touched, 0, "a fault in a hole is answered with zeros");
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        let placed = server.finish(deadline()).await.unwrap();
        assert_eq!(placed.bytes, (pages - 10) * PAGE_SIZE, "{placed:?}");
        // The descriptor closed, the never touched hole faults in as zeros.
        drop(r.uffd.take());
        // SAFETY: the region is mapped; missing pages fault in as zeros.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(
            memory == &want[..],
            "the region holds the image's bytes and zeros"
        );
    }

    #[tokio::test]
    async fn pages_are_checked_against_their_digests_as_they_are_placed() {
        // Past one 64 MiB digest chunk, so two threads share the work.
        let len = (CHUNK + (3 << 20)) as usize;
        let r = region(len, 0);
        let (dir, v, data) = artifact(11, &r);
        let images = dir.path().join("images");
        let server = PageServer::start(verified(&images, 2, v), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 11, r.fd());
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
        let server = PageServer::start(verified(&images, 2, v), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 12, r.fd());
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        match server.finish(deadline()).await.unwrap_err() {
            PageError::Damaged(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("images/pages-1.img chunk 1 (bytes 67108864-"),
                    "{e}"
                );
            }
            other => panic!("not a damage: {other}"),
        }
    }

    /// A page server of `r`'s artifact (task `pid`) with its pages file
    /// sealed at rest; `damage` flips a sealed bit of its second chunk.
    async fn place_sealed(
        pid: i32,
        r: &crate::uffd::Region,
        damage: bool,
    ) -> Result<Vec<u8>, PageError> {
        use vsnap_artifact::at_rest::{apply_in_place, Sealed};
        let (dir, v, data) = artifact(pid, r);
        let key = vsnap_artifact::HostKey::load_or_create(dir.path()).unwrap();
        let opener = Sealed::fresh().unwrap().opener(&key).unwrap();
        let images = dir.path().join("images");
        let path = images.join("pages-1.img");
        apply_in_place(&path, &opener.file("images/pages-1.img").unwrap()).unwrap();
        if damage {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[CHUNK as usize + 4096 * 3 + 17] ^= 0x10;
            std::fs::write(&path, bytes).unwrap();
        }
        let plan = PagePlan {
            sealed: Some(opener),
            ..verified(&images, 2, v)
        };
        let server = PageServer::start(plan, dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, pid, r.fd());
        // A page touched before the restore finished is opened too.
        let at = r.addr as usize + (1 << 20) + 5;
        // SAFETY: inside the region, which outlives this thread (joined).
        let touched =
            std::thread::spawn(move || unsafe { std::ptr::read_volatile(at as *const u8) });
        assert_eq!(touched.join().unwrap(), data[(1 << 20) + 5]);
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        server.finish(deadline()).await.map(|_| data)
    }

    #[tokio::test]
    async fn sealed_pages_are_opened_as_placed_and_a_changed_sealed_bit_fails_its_chunk() {
        let len = (CHUNK + (1 << 20)) as usize;
        let r = region(len, 0);
        let data = place_sealed(13, &r, false).await.unwrap();
        // SAFETY: the region is mapped and every page of it is now present.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(memory == &data[..], "the plaintext is in place");
        let r = region(len, 0);
        match place_sealed(14, &r, true).await.unwrap_err() {
            PageError::Damaged(e) => {
                let e = e.to_string();
                assert!(e.contains("images/pages-1.img chunk 1 (bytes"), "{e}");
            }
            other => panic!("not a damage: {other}"),
        }
    }

    #[tokio::test]
    async fn an_address_space_change_while_pages_are_placed_fails_the_restore() {
        let dir = tempfile::tempdir().unwrap();
        let r = region(1 << 20, UFFD_FEATURE_EVENT_UNMAP);
        write_images(dir.path(), 8, &r);
        let server = PageServer::start(PagePlan::new(dir.path(), 2), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 8, r.fd());
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
        let server = PageServer::start(PagePlan::new(dir.path(), 1), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 9, r.fd());
        drop(conn);
        let e = server.finish(deadline()).await.unwrap_err().to_string();
        assert!(e.contains("before the restore finished"), "{e}");
    }

    #[tokio::test]
    async fn a_task_without_images_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let r = region(1 << 16, 0);
        let server = PageServer::start(PagePlan::new(dir.path(), 1), dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, 10, r.fd());
        let e = server.finish(deadline()).await.unwrap_err().to_string();
        assert!(e.contains("pagemap-10.img"), "{e}");
    }

    /// An advised region of 8 MiB placed under `policy`: what the server
    /// says it placed, and the region's `AnonHugePages` in bytes.
    async fn place_advised(policy: HugePages) -> (Placed, u64, u64) {
        use super::super::testing::{huge_region, write_images_advised};
        let dir = tempfile::tempdir().unwrap();
        let len = 8 << 20;
        let r = huge_region(len);
        // CRIU's pid is this process's own here: the kernel's pid of the
        // sender (this process) matches it.
        let me = std::process::id() as i32;
        let data = write_images_advised(dir.path(), me, &r, Some(1 << libc::MADV_HUGEPAGE));
        let plan = PagePlan {
            huge: policy,
            ..PagePlan::new(dir.path(), 2)
        };
        let server = PageServer::start(plan, dir.path()).unwrap();
        let mut conn = connect(dir.path());
        send_task(&mut conn, me, r.fd());
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        let placed = server.finish(deadline()).await.unwrap();
        // SAFETY: the region is mapped and every page of it is now present.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(memory == &data[..], "the region holds the image's bytes");
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let at = smaps.find(&format!("{:x}-", r.addr as usize)).unwrap();
        let huge: u64 = smaps[at..]
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        (placed, len as u64, huge * 1024)
    }

    #[tokio::test]
    async fn an_advised_region_is_written_whole_as_huge_pages_not_copied() {
        let (placed, len, huge) = place_advised(HugePages::Always).await;
        assert_eq!((placed.bytes, placed.huge_bytes), (len, len));
        assert_eq!(
            (placed.huge_declined_bytes, placed.huge_free_blocks),
            (0, None)
        );
        assert!(huge >= len / 2, "{huge} of {len} bytes huge");
    }

    #[tokio::test]
    async fn under_never_an_advised_region_is_copied_in_small_pages() {
        let (placed, len, huge) = place_advised(HugePages::Never).await;
        assert_eq!((placed.bytes, placed.huge_bytes), (len, 0));
        assert_eq!(placed.huge_declined_bytes, len);
        assert_eq!(huge, 0, "UFFDIO_COPY places 4 KiB pages");
    }

    #[tokio::test]
    async fn under_when_free_the_choice_is_recorded_with_the_free_blocks() {
        let (placed, len, _) = place_advised(HugePages::WhenFree).await;
        assert_eq!(placed.huge_bytes + placed.huge_declined_bytes, len);
        let free = placed.huge_free_blocks.expect("/proc/buddyinfo read");
        assert_eq!(
            placed.huge_bytes == len,
            free >= len / (2 << 20),
            "{placed:?}"
        );
    }

    #[test]
    fn dropping_the_server_removes_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let server = PageServer::start(PagePlan::new(dir.path(), 1), dir.path()).unwrap();
        assert!(dir.path().join(SOCKET_NAME).exists());
        drop(server);
        assert!(!dir.path().join(SOCKET_NAME).exists());
    }
}
