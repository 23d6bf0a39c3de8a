//! A restore that starts while its artifact still arrives (a pull from a
//! registry, `vsnap.io/artifact-ref`): what the pull must have in place
//! before CRIU starts, and the bytes the server waits for as it reads.
//!
//! CRIU reads every image itself except the lazy pages of the tasks'
//! private anonymous memory, which it leaves to this server: those, and
//! only those, may still be on their way when CRIU starts
//! ([`lazy_spans`]); the server's fillers and its early faults wait for
//! them as they arrive (arrivals.rs).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{PageError, Phase};
use crate::images;
use crate::task::task_pages_files;

/// Per pages file of `images` (as the artifact names it,
/// `images/pages-<id>.img`), the merged `[start, end)` spans of its task's
/// lazy pages: what a streamed restore may receive after CRIU started.
/// Every other byte of the image folder CRIU reads itself.
pub fn lazy_spans(images: &Path) -> Result<BTreeMap<String, Vec<(u64, u64)>>, PageError> {
    let mut spans: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for pid in task_pids(images)? {
        let lazy = images::lazy_pages(images, pid)?;
        let file = spans
            .entry(format!("images/pages-{}.img", lazy.pages_id))
            .or_default();
        for r in &lazy.ranges {
            match file.last_mut() {
                Some(last) if last.1 == r.offset => last.1 = r.offset + r.len,
                _ => file.push((r.offset, r.offset + r.len)),
            }
        }
    }
    // Pages files of no task (shared memory's) hold no lazy span.
    for name in task_pages_files(images)? {
        spans.entry(name).or_default();
    }
    Ok(spans)
}

/// The pids of the tasks whose pagemaps `images` holds.
fn task_pids(images: &Path) -> Result<Vec<i32>, PageError> {
    let fail = |e: std::io::Error| {
        PageError::failed(Phase::Images, images.display(), format!("read: {e}"))
    };
    let mut pids = Vec::new();
    for entry in std::fs::read_dir(images).map_err(fail)? {
        let name = entry.map_err(fail)?.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("pagemap-"))
            .and_then(|n| n.strip_suffix(".img"))
            .and_then(|n| n.parse::<i32>().ok());
        pids.extend(pid);
    }
    pids.sort_unstable();
    Ok(pids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::testing::{entry, image, mm};
    use crate::images::{MM_MAGIC, PAGEMAP_MAGIC, PAGE_SIZE, PE_LAZY, PE_PRESENT};

    #[test]
    fn only_the_lazy_pages_of_a_task_may_arrive_after_criu_started() {
        let dir = tempfile::tempdir().unwrap();
        let page = PAGE_SIZE;
        let lazy = Some(PE_PRESENT | PE_LAZY);
        // Pages 0-3 lazy, 4-5 CRIU's own (a stack, say), 6-9 lazy again:
        // two spans of the pages file, around the eager pages.
        let pagemap = image(
            PAGEMAP_MAGIC,
            &[
                vec![8, 3],
                entry(0x10000, 4, lazy),
                entry(0x14000, 2, Some(PE_PRESENT)),
                entry(0x16000, 4, lazy),
            ],
        );
        std::fs::write(dir.path().join("pagemap-7.img"), pagemap).unwrap();
        std::fs::write(
            dir.path().join("mm-7.img"),
            image(MM_MAGIC, &[mm(0x10000, 0x20000)]),
        )
        .unwrap();
        let spans = lazy_spans(dir.path()).unwrap();
        assert_eq!(
            spans["images/pages-3.img"],
            [(0, 4 * page), (6 * page, 10 * page)]
        );
        assert_eq!(spans.len(), 1);
    }

    /// A region's images whose pages file is as a pull makes it (at its
    /// size, nothing in it), a server streaming it, the task sent and the
    /// restore finished; the file's real bytes.
    fn streamed(
        dir: &Path,
        r: &crate::uffd::Region,
        failed: crate::Failure,
    ) -> (crate::PageServer, Vec<u8>, Vec<u8>) {
        use crate::protocol::RESTORE_FINISHED;
        use crate::testing::{connect, send_task, write_images};
        use std::io::Write;
        let data = write_images(dir, 7, r);
        let pages = dir.join("pages-1.img");
        let bytes = std::fs::read(&pages).unwrap();
        std::fs::write(&pages, vec![0u8; bytes.len()]).unwrap();
        let mut plan = crate::PagePlan::new(dir, 2);
        let record = dir.join("arrived");
        plan.arrivals = Some(std::sync::Arc::new(crate::Arrivals::new(
            &record, "reg/a:1", failed,
        )));
        let server = crate::PageServer::start(plan, dir).unwrap();
        let mut conn = connect(dir);
        send_task(&mut conn, 7, r.fd());
        conn.write_all(&RESTORE_FINISHED.to_ne_bytes()).unwrap();
        (server, data, bytes)
    }

    /// Lands `bytes[from..to]` of the pages file a MiB at a time, each
    /// recorded as the pull records it.
    fn land(dir: &Path, bytes: &[u8], from: usize, to: usize) {
        use std::os::unix::fs::FileExt;
        use vsnap_artifact::arrivals::{append, Arrival};
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("pages-1.img"))
            .unwrap();
        let mut record = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("arrived"))
            .unwrap();
        let mut at = from;
        while at < to {
            let end = (at + (1 << 20)).min(to);
            file.write_all_at(&bytes[at..end], at as u64).unwrap();
            let a = Arrival::now("images/pages-1.img", at as u64, (end - at) as u64);
            append(&mut record, &[a]).unwrap();
            at = end;
        }
    }

    #[tokio::test]
    async fn a_streamed_restore_places_the_pages_as_they_arrive() {
        let dir = tempfile::tempdir().unwrap();
        let r = crate::testing::region((3 << 20) + 5 * PAGE_SIZE as usize, 0);
        let (server, data, bytes) = streamed(dir.path(), &r, std::sync::Arc::new(|| None));
        land(dir.path(), &bytes, 0, bytes.len());
        let placed = server.finish(crate::testing::deadline()).await.unwrap();
        assert!(
            placed.last_arrival_ms.is_some_and(|ms| ms > 0),
            "{placed:?}"
        );
        // SAFETY: the region is mapped and every page of it is now present.
        let memory = unsafe { std::slice::from_raw_parts(r.addr, r.len) };
        assert!(memory == &data[..], "the region holds the arrived bytes");
    }

    #[tokio::test]
    async fn a_pull_that_fails_mid_stream_fails_the_placement_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let r = crate::testing::region((3 << 20) + 5 * PAGE_SIZE as usize, 0);
        let failure = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let f = failure.clone();
        let failed: crate::Failure = std::sync::Arc::new(move || f.lock().unwrap().clone());
        let (server, _, bytes) = streamed(dir.path(), &r, failed);
        land(dir.path(), &bytes, 0, 1 << 20);
        *failure.lock().unwrap() = Some("blob sha256:ab: connection reset".into());
        let e = server
            .finish(crate::testing::deadline())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("stream: reg/a:1: images/pages-1.img bytes 0..")
                && e.ends_with("did not arrive: blob sha256:ab: connection reset"),
            "{e}"
        );
    }
}
