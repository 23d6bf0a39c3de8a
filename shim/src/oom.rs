//! OOM notifications for a container's memory cgroup.
//!
//! [`watch`] finds the memory cgroup of a process and spawns one task on the
//! shim's runtime that waits (through the reactor, no thread of its own) on
//! the kernel's notification and sends `()` on a channel per OOM:
//!
//! - cgroup v1: an eventfd registered through `cgroup.event_control` on
//!   `memory.oom_control`, as containerd's Go runc shim does; one message per
//!   wakeup. The kernel also signals the eventfd when the cgroup is removed:
//!   the watcher tells that apart by reading `memory.oom_control` through the
//!   descriptor it holds, which fails (ENODEV) once the cgroup is gone, even if
//!   a cgroup of the same name has been created again since (a restore).
//! - cgroup v2: inotify on `memory.events` and `cgroup.events`; one message per
//!   increase of `oom_kill`. The watcher ends once the cgroup has no process.
//!
//! When the watcher ends, the channel closes. A dropped receiver stops the
//! watcher. Call [`watch`] inside the runtime.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::cgroup_stats::{cgroups_of, parse_flat_keyed, Cgroups};
use crate::error::{Error, Result};

/// Starts watching the memory cgroup of process `pid` for OOMs.
///
/// The receiver gets one `()` per OOM in that cgroup and is closed (`recv()`
/// returns `None`) when the cgroup goes away (v1) or has no process left
/// (v2). Does a few small cgroupfs reads and writes synchronously; the
/// waiting happens in a task.
pub fn watch(pid: u32) -> Result<UnboundedReceiver<()>> {
    let cgroups = cgroups_of(pid, "oom")?;
    let dir = cgroups
        .memory_dir()
        .ok_or_else(|| Error::NotFound(format!("oom: pid {pid} has no memory cgroup")))?
        .to_path_buf();
    let (tx, rx) = unbounded_channel();
    match cgroups {
        Cgroups::V1(_) => start_v1(dir, tx)?,
        Cgroups::V2(_) => start_v2(dir, tx)?,
    }
    Ok(rx)
}

/// Registers an eventfd for `memory.oom_control` of the v1 cgroup `dir` and
/// spawns the task that waits on it.
fn start_v1(dir: PathBuf, tx: UnboundedSender<()>) -> Result<()> {
    let io_err = |what: &str, e| Error::io(format!("oom: {what} in {}", dir.display()), e);
    let oom_control = File::open(dir.join("memory.oom_control"))
        .map_err(|e| io_err("opening memory.oom_control", e))?;
    let efd = eventfd().map_err(|e| io_err("creating an eventfd", e))?;
    let registration = format!("{} {}", efd.as_raw_fd(), oom_control.as_raw_fd());
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.event_control"))
        .and_then(|mut f| f.write_all(registration.as_bytes()))
        .map_err(|e| io_err("writing cgroup.event_control", e))?;
    let efd = readable(efd).map_err(|e| io_err("polling the eventfd", e))?;
    tokio::spawn(v1_loop(efd, oom_control, tx));
    Ok(())
}

/// Sends one message per eventfd wakeup while the cgroup still exists.
async fn v1_loop(efd: AsyncFd<File>, oom_control: File, tx: UnboundedSender<()>) {
    let mut counter = [0u8; 8];
    let mut contents = [0u8; 256];
    loop {
        if read_when_ready(&efd, &mut counter, &tx).await.is_none() {
            return;
        }
        // A removed cgroup's files fail to read: that wakeup was the removal.
        if oom_control.read_at(&mut contents, 0).is_err() {
            return;
        }
        if tx.send(()).is_err() {
            return;
        }
    }
}

/// `file` registered with the runtime's reactor for reading.
pub(crate) fn readable(file: File) -> std::io::Result<AsyncFd<File>> {
    // SAFETY: the AsyncFd owns the File: its descriptor stays open and the
    // same for the AsyncFd's whole life.
    unsafe { AsyncFd::register_with_interest(file, Interest::READABLE) }
        .map_err(std::io::Error::from)
}

/// One read of `fd` once it is readable; None when it fails or nobody
/// listens any more.
async fn read_when_ready(
    fd: &AsyncFd<File>,
    buf: &mut [u8],
    tx: &UnboundedSender<()>,
) -> Option<usize> {
    loop {
        let mut guard = tokio::select! {
            ready = fd.readable() => ready.ok()?,
            () = tx.closed() => return None,
        };
        match guard.try_io(|f| f.get_ref().read(buf)) {
            Ok(Ok(n)) if n > 0 => return Some(n),
            Ok(Err(e)) if e.kind() == ErrorKind::Interrupted => {}
            Ok(_) => return None,
            Err(_would_block) => {}
        }
    }
}

/// A new close-on-exec, non-blocking eventfd, as a `File` to read its
/// counter from.
pub(crate) fn eventfd() -> std::io::Result<File> {
    let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    Ok(File::from(OwnedFd::from(fd)))
}

/// Starts watching `memory.events` and `cgroup.events` of the v2 cgroup
/// `dir` with inotify, counting `oom_kill` from its current value.
fn start_v2(dir: PathBuf, tx: UnboundedSender<()>) -> Result<()> {
    let io_err = |what: &str, e| Error::io(format!("oom: {what} in {}", dir.display()), e);
    let events = std::fs::read_to_string(dir.join("memory.events"))
        .map_err(|e| io_err("reading memory.events", e))?;
    let kills = parse_oom_kills(&events);
    let inotify = inotify_watching(&[dir.join("memory.events"), dir.join("cgroup.events")])
        .map_err(|e| io_err("watching memory.events and cgroup.events", e))?;
    let inotify = readable(inotify).map_err(|e| io_err("polling inotify", e))?;
    tokio::spawn(async move { v2_loop(inotify, &dir, kills, tx).await });
    Ok(())
}

/// Sends one message per new OOM kill until the cgroup is empty or gone.
async fn v2_loop(inotify: AsyncFd<File>, dir: &Path, mut kills: u64, tx: UnboundedSender<()>) {
    let mut buf = [0u8; 4096];
    loop {
        // Emptiness first: every kill before it is then in memory.events.
        let done =
            !std::fs::read_to_string(dir.join("cgroup.events")).is_ok_and(|c| parse_populated(&c));
        let Ok(events) = std::fs::read_to_string(dir.join("memory.events")) else {
            return;
        };
        let now = parse_oom_kills(&events);
        for _ in kills..now {
            if tx.send(()).is_err() {
                return;
            }
        }
        kills = kills.max(now);
        if done {
            return;
        }
        if read_when_ready(&inotify, &mut buf, &tx).await.is_none() {
            return;
        }
    }
}

/// A new close-on-exec, non-blocking inotify instance with an `IN_MODIFY` watch on each of
/// `paths`, as a `File` to read events from.
fn inotify_watching(paths: &[PathBuf]) -> std::io::Result<File> {
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
    for path in paths {
        inotify.add_watch(path.as_path(), AddWatchFlags::IN_MODIFY)?;
    }
    Ok(File::from(OwnedFd::from(inotify)))
}

/// The `oom_kill` count of a v2 `memory.events` (or v1 `memory.oom_control`),
/// 0 when absent.
pub(crate) fn parse_oom_kills(content: &str) -> u64 {
    parse_flat_keyed(content)
        .get("oom_kill")
        .copied()
        .unwrap_or(0)
}

/// Whether a v2 `cgroup.events` says the cgroup still has processes.
fn parse_populated(content: &str) -> bool {
    parse_flat_keyed(content)
        .get("populated")
        .is_some_and(|&p| p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup_stats::test_support::*;
    use std::time::Duration;
    use tokio::time::timeout;

    #[test]
    fn parses_oom_kill_counts_and_population() {
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(events), 2);
        assert_eq!(
            parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"),
            7
        );
        assert_eq!(parse_oom_kills(""), 0);
        assert!(parse_populated("populated 1\nfrozen 0\n"));
        assert!(!parse_populated("populated 0\nfrozen 0\n"));
        assert!(!parse_populated(""));
    }

    #[test]
    fn a_missing_process_is_an_error_naming_it() {
        let err = watch(4_194_399).unwrap_err().to_string();
        assert!(err.starts_with("oom: "), "{err}");
        assert!(err.contains("4194399"), "{err}");
    }

    /// A memory cgroup limited to 16 MiB, without swap beyond it.
    fn limited_cgroup(tag: &str) -> TestCgroup {
        let cgroup = TestCgroup::create(&["memory"], tag);
        let dir = cgroup.dir("memory");
        let limits: &[(&str, &str)] = if cgroup.v2 {
            &[("memory.max", "16777216"), ("memory.swap.max", "0")]
        } else {
            // memsw, where present, is memory + swap: the same value means no swap.
            &[
                ("memory.limit_in_bytes", "16777216"),
                ("memory.memsw.limit_in_bytes", "16777216"),
            ]
        };
        for (file, value) in limits {
            let path = dir.join(file);
            if path.exists() {
                std::fs::write(&path, value)
                    .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            }
        }
        cgroup
    }

    /// Waits for the end of the watcher's channel, counting the messages.
    async fn messages_until_closed(rx: &mut UnboundedReceiver<()>) -> usize {
        let mut n = 0;
        while rx.recv().await.is_some() {
            n += 1;
        }
        n
    }

    #[tokio::test]
    async fn an_oom_kill_is_reported_and_removal_ends_the_watch() {
        require_root();
        let cgroup = limited_cgroup("oom");
        let mut child =
            Shell::spawn("read x; x=$(head -c 64000000 /dev/zero | tr '\\0' a); echo ${#x}");
        cgroup.add(child.pid());
        let mut rx = watch(child.pid()).expect("watch");
        child.go();

        let got = timeout(Duration::from_secs(20), rx.recv()).await;
        assert_eq!(got, Ok(Some(())), "no OOM message within 20 s");
        let status = child.0.wait().unwrap();
        assert!(
            !status.success(),
            "the allocating shell was not killed: {status}"
        );

        drop(child);
        drop(cgroup);
        // Further OOMs of the same allocation may have been reported; then the
        // removal of the cgroup closes the channel.
        timeout(Duration::from_secs(10), messages_until_closed(&mut rx))
            .await
            .expect("the watch did not end after the cgroup was removed");
    }

    #[tokio::test]
    async fn a_cgroup_removed_without_oom_sends_nothing() {
        require_root();
        let cgroup = limited_cgroup("no-oom");
        let child = Shell::spawn("read x");
        cgroup.add(child.pid());
        let mut rx = watch(child.pid()).expect("watch");

        drop(child);
        drop(cgroup);
        let n = timeout(Duration::from_secs(10), messages_until_closed(&mut rx))
            .await
            .expect("the watch did not end after the cgroup was removed");
        assert_eq!(n, 0, "the removal was reported as an OOM");
    }
}
