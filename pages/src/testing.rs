//! Test fixtures of the page server: this process's own memory registered
//! with a real userfaultfd, images written as CRIU writes them, and the
//! descriptor handed over as CRIU's restore does.

use std::io::{IoSlice, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::images::testing::{entry, image, mm_advised};
use crate::images::{self, PAGE_SIZE};
use crate::plan::PagePlan;
use crate::uffd::Region;
pub use crate::uffd::UFFD_FEATURE_EVENT_UNMAP;

use super::protocol::SOCKET_NAME;
use super::task::task_pages_files;
use super::verify::Verification;

/// `len` bytes of fresh anonymous memory whose missing pages go to its
/// userfaultfd.
pub fn region(len: usize, features: u64) -> Region {
    let mut r = Region::map(len, false).expect("mmap");
    r.register(features).expect("userfaultfd");
    r
}

/// As [`region`], 2 MiB aligned and advised `MADV_HUGEPAGE` (as CRIU's
/// restorer leaves a VMA the engine advised).
pub fn huge_region(len: usize) -> Region {
    let mut r = Region::map(len, true).expect("mmap");
    r.advise(libc::MADV_HUGEPAGE).expect("madvise");
    r.register(0).expect("userfaultfd");
    r
}

/// The restore of `images` by `threads` fillers, checked against `v`.
pub fn verified(images: &Path, threads: usize, v: Verification) -> PagePlan {
    PagePlan {
        verification: Some(v),
        ..PagePlan::new(images, threads)
    }
}

/// Images of task `pid`: one present, not lazy page elsewhere first (so
/// the region's bytes start one page into the pages file), then the
/// region, lazy. Returns the region's expected bytes.
pub fn write_images(dir: &Path, pid: i32, r: &Region) -> Vec<u8> {
    write_images_advised(dir, pid, r, None)
}

/// As [`write_images`], the region's VMA with madvise bits `madv`.
pub fn write_images_advised(dir: &Path, pid: i32, r: &Region, madv: Option<u64>) -> Vec<u8> {
    let data: Vec<u8> = (0..r.len).map(|i| (i * 7 + i / 4096) as u8).collect();
    let start = r.addr as u64;
    let pagemap = image(
        images::PAGEMAP_MAGIC,
        &[
            vec![8, 1],
            entry(0x1000, 1, Some(images::PE_PRESENT)),
            entry(
                start,
                (r.len as u64) / PAGE_SIZE,
                Some(images::PE_PRESENT | images::PE_LAZY),
            ),
        ],
    );
    std::fs::write(dir.join(format!("pagemap-{pid}.img")), pagemap).unwrap();
    let mm = mm_advised(&[(start, start + r.len as u64, madv)]);
    std::fs::write(
        dir.join(format!("mm-{pid}.img")),
        image(images::MM_MAGIC, &[mm]),
    )
    .unwrap();
    let mut pages = vec![0xEEu8; PAGE_SIZE as usize];
    pages.extend(&data);
    std::fs::write(dir.join("pages-1.img"), pages).unwrap();
    data
}

/// CRIU's side of the socket.
pub fn connect(work: &Path) -> UnixStream {
    UnixStream::connect(work.join(SOCKET_NAME)).unwrap()
}

pub fn send_task(conn: &mut UnixStream, pid: i32, uffd: &OwnedFd) {
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

pub fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// An artifact folder with `images/` for task `pid`, its digests, and
/// the region's expected bytes.
pub fn artifact(pid: i32, r: &Region) -> (tempfile::TempDir, Verification, Vec<u8>) {
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
