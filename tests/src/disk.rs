//! Disk use of a folder as `du` counts it (allocated blocks, each inode
//! once, no link followed), and its peak while something runs: sampled
//! from a thread at a fixed pace, since a peak between two samples is not
//! seen (the pace is that of a poll).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes allocated to everything under `dir` (files, folders, `dir`
/// itself), each inode counted once: what `du -s --block-size=1` says. A
/// file removed while the walk runs is left out, as it is gone.
pub fn disk_use(dir: &Path) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if !seen.insert((md.dev(), md.ino())) {
            continue;
        }
        total += md.blocks() * 512;
        if md.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                todo.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    total
}

/// The largest [`disk_use`] of a folder seen every `every` until stopped.
pub struct DiskPeak {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(u64, usize)>>,
}

impl DiskPeak {
    /// Samples `dir` now and then every `every`, from a thread of its own.
    pub fn start(dir: &Path, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let dir: PathBuf = dir.to_path_buf();
        let thread = std::thread::spawn(move || {
            let (mut peak, mut samples) = (0, 0);
            loop {
                // One more sample after the stop: the end state counts too.
                let last = stopped.load(Ordering::Relaxed);
                peak = peak.max(disk_use(&dir));
                samples += 1;
                if last {
                    return (peak, samples);
                }
                std::thread::sleep(every);
            }
        });
        DiskPeak {
            stop,
            thread: Some(thread),
        }
    }

    /// The peak and the number of samples taken.
    pub fn stop(mut self) -> (u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("stopped once")
            .join()
            .expect("the sampler does not panic")
    }
}

impl Drop for DiskPeak {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_file_counts_what_it_holds_and_a_hard_link_once() {
        let dir = std::env::temp_dir().join(format!("vsnap-disk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = disk_use(&dir);
        let f = std::fs::File::create(dir.join("sparse")).unwrap();
        f.set_len(64 << 20).unwrap();
        assert!(disk_use(&dir) < empty + (1 << 20), "a hole takes no blocks");
        std::fs::write(dir.join("full"), vec![1u8; 4 << 20]).unwrap();
        let with = disk_use(&dir);
        assert!(with >= empty + (4 << 20), "{with}");
        std::fs::hard_link(dir.join("full"), dir.join("again")).unwrap();
        assert_eq!(disk_use(&dir), with, "one inode, counted once");
        let peak = DiskPeak::start(&dir, Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(30));
        std::fs::remove_file(dir.join("full")).unwrap();
        std::fs::remove_file(dir.join("again")).unwrap();
        let (max, samples) = peak.stop();
        assert!(max >= with && samples >= 2, "{max} {samples}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
