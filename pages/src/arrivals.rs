//! The arrivals a streamed restore's server waits for: a span of a pages
//! file is read only once the pull's record covers it
//! (`vsnap_artifact::arrivals`); a wait fails, naming where the bytes were
//! to come from, once the pull failed instead.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vsnap_artifact::arrivals::Follower;

use crate::error::{PageError, Phase};

/// Why the bytes will not come: the pull's failure, once it failed.
pub type Failure = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The arrivals a streamed restore's server waits for.
pub struct Arrivals {
    record: Mutex<Follower>,
    /// Where spans are asked for ahead of the pull's order.
    wanted: std::path::PathBuf,
    /// Where the bytes come from (a registry reference), named in errors.
    source: String,
    failed: Failure,
    /// Set when the server is dropped: every wait ends.
    stopped: AtomicBool,
}

impl std::fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrivals")
            .field("source", &self.source)
            .finish()
    }
}

impl Arrivals {
    /// Following the pull's record `record`; `failed` says why the pull
    /// ended without every byte, once it did.
    pub fn new(record: &Path, source: &str, failed: Failure) -> Self {
        Arrivals {
            record: Mutex::new(Follower::new(record)),
            wanted: record.with_file_name(vsnap_artifact::arrivals::WANTED),
            source: source.to_string(),
            failed,
            stopped: AtomicBool::new(false),
        }
    }

    /// Returns once bytes `[start, end)` of `file` (the artifact's name for
    /// it) are in place; fails once the pull failed, or `stop` is set.
    pub fn wait(
        &self,
        file: &str,
        start: u64,
        end: u64,
        stop: &AtomicBool,
    ) -> Result<(), PageError> {
        let mut pause = Duration::from_micros(200);
        loop {
            // The pull's failure is read before the record: bytes it
            // landed before failing still count.
            let failed = (self.failed)();
            {
                let mut record = self.record.lock().expect("lock");
                record
                    .refresh()
                    .map_err(|e| PageError::failed(Phase::Stream, &self.source, e))?;
                if record.coverage.covers(file, start, end) {
                    return Ok(());
                }
            }
            if let Some(why) = failed {
                return Err(PageError::failed(
                    Phase::Stream,
                    &self.source,
                    format!("{file} bytes {start}..{end} did not arrive: {why}"),
                ));
            }
            if stop.load(Ordering::SeqCst) || self.stopped.load(Ordering::SeqCst) {
                return Err(PageError::cancelled(Phase::Stream));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Asks the pull for `[start, end)` of `file` next, ahead of its order
    /// (a page a task touched before it arrived). Best effort: the wait
    /// that follows holds either way.
    pub fn want(&self, file: &str, start: u64, end: u64) {
        use vsnap_artifact::arrivals::{append, Arrival};
        {
            let mut record = self.record.lock().expect("lock");
            if record.refresh().is_ok() && record.coverage.covers(file, start, end) {
                return;
            }
        }
        let asked = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.wanted)
            .and_then(|mut f| append(&mut f, &[Arrival::now(file, start, end - start)]));
        if let Err(e) = asked {
            log::warn!("{}: {e}: the pull keeps its order", self.wanted.display());
        }
    }

    /// Ends every wait, now and later (the server was dropped).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }

    /// When the newest byte arrived that the server saw (ms since the
    /// epoch; 0: none).
    pub fn last_ms(&self) -> u64 {
        self.record.lock().expect("lock").coverage.last_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use vsnap_artifact::arrivals::{append, Arrival};

    #[test]
    fn a_wait_returns_once_its_span_arrived_and_fails_naming_the_source_once_the_pull_failed() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("arrived");
        let failure = Arc::new(Mutex::new(None::<String>));
        let f = failure.clone();
        let arrivals = Arc::new(Arrivals::new(
            &record,
            "reg/a:1",
            Arc::new(move || f.lock().unwrap().clone()),
        ));
        let stop = AtomicBool::new(false);
        let file = "images/pages-1.img";
        let waiter = {
            let a = arrivals.clone();
            std::thread::spawn(move || a.wait(file, 0, 8192, &AtomicBool::new(false)))
        };
        let mut w = std::fs::File::create(&record).unwrap();
        append(&mut w, &[Arrival::now(file, 0, 4096)]).unwrap();
        append(&mut w, &[Arrival::now(file, 4096, 4096)]).unwrap();
        w.flush().unwrap();
        waiter.join().unwrap().unwrap();
        assert!(arrivals.last_ms() > 0);

        *failure.lock().unwrap() =
            Some("blob sha256:ab (images/pages-1.img): connection reset".into());
        let e = arrivals
            .wait(file, 0, 12288, &stop)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "stream: reg/a:1: images/pages-1.img bytes 0..12288 did not arrive: blob sha256:ab (images/pages-1.img): connection reset"
        );
        arrivals
            .wait(file, 0, 8192, &stop)
            .expect("what landed before the failure counts");
    }

    #[test]
    fn a_span_not_there_yet_is_asked_for_and_one_there_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("arrived");
        let mut w = std::fs::File::create(&record).unwrap();
        append(&mut w, &[Arrival::now("images/pages-1.img", 0, 4096)]).unwrap();
        let arrivals = Arrivals::new(&record, "r", Arc::new(|| None));
        arrivals.want("images/pages-1.img", 0, 4096);
        assert!(!dir.path().join("wanted").exists(), "it is there");
        arrivals.want("images/pages-1.img", 8192, 12288);
        let asked = std::fs::read_to_string(dir.path().join("wanted")).unwrap();
        let a = Arrival::parse(asked.trim_end()).unwrap();
        assert_eq!(
            (a.file.as_str(), a.offset, a.len),
            ("images/pages-1.img", 8192, 4096)
        );
    }

    #[test]
    fn a_stopped_wait_is_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let arrivals = Arrivals::new(&dir.path().join("arrived"), "r", Arc::new(|| None));
        let e = arrivals
            .wait("images/pages-1.img", 0, 1, &AtomicBool::new(true))
            .unwrap_err();
        assert_eq!(e.to_string(), "stream: cancelled");
    }
}
