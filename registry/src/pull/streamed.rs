//! A pull a restore starts from before it ends (`vsnap pull --stream-fd`,
//! the shim's restore from `vsnap.io/artifact-ref`):
//!
//! 1. the chunks of every file but the pages files, then those of the
//!    pages files that CRIU reads itself (all but the tasks' lazy pages,
//!    found in the images that just landed: `vsnap_pages::lazy_spans`);
//! 2. the manifest, sealed with this host's key, put in the tree, and
//!    [`Stream::on_head`] told where the tree is: a restore can start;
//! 3. the lazy pages' chunks, in order, each recorded as it lands
//!    (`arrived`, partial.rs) for the restore's page server; a span the
//!    server asks for ahead of that order (`wanted`: a page a task touched
//!    before it arrived) is fetched next;
//! 4. once every chunk landed, the publish waits until the restore no
//!    longer reads the tree: the other end of the gate closed. A restore
//!    that refused the artifact, or failed for a reason that is the
//!    artifact's, writes a byte into the gate first
//!    (`vsnap_artifact::arrivals::ABANDON`): the pull
//!    then publishes nothing and removes its partial folder, so that what
//!    this host refused never lands under the name (where `auto` may have
//!    captured a fresh artifact meanwhile).

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use oci_client::manifest::OciDescriptor;
use vsnap_artifact::arrivals::Follower;
use vsnap_artifact::{HostKey, Manifest};

use super::fetch::{fetch_chunks, fetch_in_order};
use super::partial::Partial;
use crate::error::{RegistryError, Result};
use crate::index::ArtifactConfig;
use crate::remote::Remote;

/// A restore follows this pull.
pub struct Stream {
    /// Called once the tree holds all a restore reads before CRIU starts
    /// (its folder), and the sealed manifest.
    pub on_head: Box<dyn Fn(&Path) + Send + Sync>,
    /// Read to its end before the publish: the restore holds the other
    /// end while it reads the tree (its process dying closes it too).
    /// Anything written into it abandons the pull (step 4).
    pub gate: Option<OwnedFd>,
}

/// What a streamed fetch did: the bytes of each chunk fetched, and when
/// the head was ready (ms after the fetch began).
pub(super) struct Streamed {
    pub(super) fetched: Vec<u64>,
    pub(super) head_ms: u64,
}

/// Steps 1 to 3 of the module's head.
pub(super) async fn fetch_streamed(
    remote: &Remote,
    partial: &Arc<Partial>,
    todo: Vec<&OciDescriptor>,
    (config, jobs): (&ArtifactConfig, usize),
    (root, manifest): (&Path, &Manifest),
    stream: &Stream,
) -> Result<Streamed> {
    let began = std::time::Instant::now();
    let (early, rest) = partial.split_lazy(todo, None);
    let mut fetched = fetch_chunks(remote, partial, &early, config, jobs).await?;
    let images = partial.tree().join("images");
    let spans = tokio::task::spawn_blocking(move || vsnap_pages::lazy_spans(&images))
        .await
        .expect("the reading thread does not panic")
        .map_err(|e| RegistryError::Invalid(format!("pull: the artifact's images: {e}")))?;
    let (early, late) = partial.split_lazy(rest, Some(&spans));
    fetched.extend(fetch_chunks(remote, partial, &early, config, jobs).await?);
    partial.put_manifest(manifest.clone(), &HostKey::load_or_create(root)?)?;
    let dir = partial.tree().parent().unwrap_or(Path::new("/"));
    let wanted = dir.join(vsnap_artifact::arrivals::WANTED);
    // An earlier pull's requests are not this restore's.
    let _ = std::fs::remove_file(&wanted);
    (stream.on_head)(partial.tree());
    let head_ms = began.elapsed().as_millis() as u64;
    let schedule = Mutex::new(Schedule {
        queue: late.into(),
        wanted: Follower::new(&wanted),
    });
    let next = futures_util::stream::poll_fn(|_| {
        Poll::Ready(schedule.lock().expect("lock").next(partial))
    });
    fetched.extend(fetch_in_order(remote, partial, next, config, jobs).await?);
    Ok(Streamed { fetched, head_ms })
}

/// The lazy pages' chunks still to fetch: in order, but a chunk the page
/// server asked for (`wanted`) first.
struct Schedule<'l> {
    queue: VecDeque<&'l OciDescriptor>,
    wanted: Follower,
}

impl<'l> Schedule<'l> {
    fn next(&mut self, partial: &Partial) -> Option<&'l OciDescriptor> {
        if self.wanted.refresh().is_ok() && self.wanted.coverage.last_ms() > 0 {
            let asked = self
                .queue
                .iter()
                .position(|l| partial.wanted(&l.digest, &self.wanted.coverage));
            if let Some(i) = asked {
                return self.queue.remove(i);
            }
        }
        self.queue.pop_front()
    }
}

/// Step 4: waits (on a blocking thread) until the gate's other end
/// closed; whether anything was written into it first (the restore
/// abandoned the pull).
pub(super) async fn wait_for_readers(gate: Option<OwnedFd>) -> bool {
    let Some(gate) = gate else {
        return false;
    };
    tokio::task::spawn_blocking(move || {
        let mut file = File::from(gate);
        let (mut sink, mut written) = ([0u8; 64], false);
        // EOF once every writer closed.
        while let Ok(n @ 1..) = file.read(&mut sink) {
            written |= n > 0;
        }
        written
    })
    .await
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The gate's end of file lets the pull publish; a byte written
    /// before it (the restore gave the artifact up) abandons it, however
    /// many holders close after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_byte_in_the_gate_abandons_the_pull_and_its_end_alone_does_not() {
        let (read, write) = std::io::pipe().unwrap();
        let other = write.try_clone().unwrap();
        drop((write, other));
        assert!(!wait_for_readers(Some(read.into())).await, "closed only");

        let (read, mut write) = std::io::pipe().unwrap();
        let other = write.try_clone().unwrap();
        write.write_all(vsnap_artifact::arrivals::ABANDON).unwrap();
        drop(write);
        let waiting = tokio::spawn(wait_for_readers(Some(read.into())));
        // Still held by `other`: not over yet.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        drop(other);
        assert!(waiting.await.unwrap(), "abandoned");
        assert!(!wait_for_readers(None).await, "no gate, nothing to abandon");
    }
}
