//! The share between page servers of this process (each its own region
//! and userfaultfd, one artifact), and a follower against a leader played
//! by the test.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use vsnap_artifact::content::CHUNK;

use super::super::outcome::Placed;
use super::super::protocol::RESTORE_FINISHED;
use super::super::server::PageServer;
use super::super::testing::{
    artifact, connect, deadline, region, send_task, verified, write_images,
};
use super::super::verify::Verification;
use super::chunk::Unsealed;
use super::wire::{self, Kind, Message};
use super::*;
use crate::error::PageError;
use crate::plan::PagePlan;
use crate::uffd::Region;

/// A page server for one copy of the artifact (`images`), its work folder
/// its own, sharing under `runtime`.
fn copy_server(runtime: &Path, images: &Path, v: &Verification) -> (tempfile::TempDir, PageServer) {
    let work = tempfile::tempdir().unwrap();
    let plan = PagePlan {
        share: Some(Sharing::new(runtime, "mac", &v.dir)),
        ..verified(images, 2, v.clone())
    };
    let server = PageServer::start(plan, work.path()).unwrap();
    (work, server)
}

/// CRIU's part for `server`: task `pid` with region `r`, then finished.
fn restore(work: &Path, pid: i32, r: &Region) -> std::os::unix::net::UnixStream {
    let mut conn = connect(work);
    send_task(&mut conn, pid, r.fd());
    conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
    conn
}

fn holds(r: &Region, data: &[u8]) -> bool {
    // SAFETY: the region is mapped and every page of it is now present.
    let memory = unsafe { r.bytes() };
    memory == data
}

#[tokio::test]
async fn a_follower_places_the_chunks_the_leader_checked_without_reading_them() {
    let len = (CHUNK + (3 << 20)) as usize; // two chunks
    let (lead, follow) = (region(len, 0), region(len, 0));
    let (dir, v, data) = artifact(21, &lead);
    let images = dir.path().join("images");
    // The second copy's task: the same pages file, its own addresses.
    write_images(&images, 31, &follow);
    let runtime = tempfile::tempdir().unwrap();
    let (lw, leader) = copy_server(runtime.path(), &images, &v);
    let (fw, follower) = copy_server(runtime.path(), &images, &v);
    // The follower's fill begins first: it waits for the leader's chunks.
    let _fc = restore(fw.path(), 31, &follow);
    let followed = tokio::spawn(follower.finish(deadline()));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let _lc = restore(lw.path(), 21, &lead);
    let led: Placed = leader.finish(deadline()).await.unwrap();
    let followed: Placed = followed.await.unwrap().unwrap();
    assert!(holds(&lead, &data) && holds(&follow, &data));
    assert_eq!(
        (led.share_role, led.chunks_read),
        (Some("leader"), 2),
        "{led:?}"
    );
    assert_eq!(followed.share_role, Some("follower"));
    assert_eq!(
        followed.chunks_from_share + followed.chunks_read,
        2,
        "{followed:?}"
    );
    assert!(followed.chunks_from_share >= 1, "{followed:?}");
    assert!(
        led.chunks_shared_out >= followed.chunks_from_share,
        "{led:?}"
    );
    let left = names(&runtime.path().join("share"));
    assert!(
        left.is_empty(),
        "the leader's lock and socket went: {left:?}"
    );
}

fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
async fn a_damage_the_leader_found_fails_the_follower_naming_its_chunk() {
    let len = (CHUNK + (1 << 20)) as usize;
    let (lead, follow) = (region(len, 0), region(len, 0));
    let (dir, v, _) = artifact(22, &lead);
    let images = dir.path().join("images");
    write_images(&images, 32, &follow);
    let path = images.join("pages-1.img");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096 * 5 + 3] ^= 0x01; // chunk 0, which the leader takes first
    std::fs::write(&path, bytes).unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let (lw, leader) = copy_server(runtime.path(), &images, &v);
    let (fw, follower) = copy_server(runtime.path(), &images, &v);
    let _fc = restore(fw.path(), 32, &follow);
    let followed = tokio::spawn(follower.finish(deadline()));
    let _lc = restore(lw.path(), 22, &lead);
    for e in [
        leader.finish(deadline()).await.unwrap_err(),
        followed.await.unwrap().unwrap_err(),
    ] {
        let PageError::Damaged(e) = e else {
            panic!("not a damage: {e}")
        };
        let e = e.to_string();
        assert!(e.contains("images/pages-1.img chunk 0 (bytes 0-"), "{e}");
        assert!(e.contains("does not match its digest"), "{e}");
    }
}

#[tokio::test]
async fn a_follower_whose_leader_goes_away_reads_every_chunk_itself() {
    let len = (CHUNK + (1 << 20)) as usize;
    let follow = region(len, 0);
    let (dir, v, data) = artifact(23, &follow);
    let images = dir.path().join("images");
    let runtime = tempfile::tempdir().unwrap();
    let (_lw, leader) = copy_server(runtime.path(), &images, &v);
    let (fw, follower) = copy_server(runtime.path(), &images, &v);
    // The leader's restore is killed before its CRIU even connected.
    drop(leader);
    let started = std::time::Instant::now();
    let _fc = restore(fw.path(), 23, &follow);
    let followed = follower.finish(deadline()).await.unwrap();
    assert!(holds(&follow, &data));
    assert_eq!(followed.share_role, Some("follower"));
    assert_eq!((followed.chunks_from_share, followed.chunks_read), (0, 2));
    assert!(
        started.elapsed() < follower::PATIENCE * 2,
        "no wait for a leader gone: {:?}",
        started.elapsed()
    );
}

/// A follower of files `files`, and the test's end of its socket.
fn follower_of(files: Vec<(String, u64)>) -> (Follower, std::os::fd::OwnedFd) {
    let (leader, mine) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    (Follower::start(mine, files).unwrap(), leader)
}

fn sealed(len: u64) -> std::os::fd::OwnedFd {
    Unsealed::new(len as usize).unwrap().seal().unwrap()
}

fn chunk_message(chunk: usize, fd: std::os::fd::OwnedFd) -> Message {
    let mut m = Message::new(Kind::Chunk, "images/pages-1.img", chunk, CHUNK);
    m.fd = Some(fd);
    m
}

#[test]
fn a_follower_refuses_an_unsealed_or_missized_chunk_and_reads_it_itself() {
    let (f, leader) = follower_of(vec![("images/pages-1.img".into(), 3 * CHUNK)]);
    let send = |m: &Message| wire::send(leader.as_raw_fd(), m).unwrap();
    send(&chunk_message(2, sealed(CHUNK)));
    let unsealed = Unsealed::new(CHUNK as usize).unwrap().unsealed_fd();
    send(&chunk_message(0, unsealed));
    send(&chunk_message(1, sealed(CHUNK / 2)));
    // The two refused come back as let go.
    let mut refused = Vec::new();
    while refused.len() < 2 {
        let m = wire::receive(leader.as_raw_fd()).unwrap().unwrap();
        assert_eq!(m.kind, Kind::Done);
        refused.push(m.chunk);
    }
    refused.sort();
    assert_eq!(refused, vec![0, 1]);
    let stop = AtomicBool::new(false);
    let dir = Path::new("/artifact");
    let mut got = Vec::new();
    while let Some(job) = f.next(&stop, dir).unwrap() {
        got.push(match job {
            Job::Shared { chunk, .. } => ("shared", chunk),
            Job::Read { chunk, .. } => ("read", chunk),
        });
    }
    assert_eq!(got, vec![("shared", 2), ("read", 0), ("read", 1)]);
    // A chunk that comes after it was claimed is let go at once: placed once.
    send(&chunk_message(0, sealed(CHUNK)));
    let m = wire::receive(leader.as_raw_fd()).unwrap().unwrap();
    assert_eq!((m.kind, m.chunk), (Kind::Done, 0));
    assert_eq!(f.counts(), (1, 2));
}

#[test]
fn a_second_restorer_follows_and_the_lock_goes_with_the_leader() {
    let runtime = tempfile::tempdir().unwrap();
    let s = Sharing::new(runtime.path(), "mac", Path::new("/a"));
    let v = Verification {
        dir: "/a".into(),
        files: Vec::new(),
    };
    let first = join(&s, &v).unwrap().unwrap();
    assert_eq!(first.name(), "leader");
    let second = join(&s, &v).unwrap().unwrap();
    assert_eq!(second.name(), "follower");
    let other = Sharing::new(runtime.path(), "mac", Path::new("/b"));
    assert_eq!(join(&other, &v).unwrap().unwrap().name(), "leader");
    drop((first, second));
    assert_eq!(join(&s, &v).unwrap().unwrap().name(), "leader");
    let mode = std::fs::metadata(runtime.path().join("share")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700
    );
}
