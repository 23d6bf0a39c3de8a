//! The fillers: once the restore finished, `threads` threads take the
//! pages files chunk by chunk (each under a slot of the host's budget),
//! while one more serves the faults of tasks waiting for a page. Alone or
//! as the share's leader they take every chunk in order; as a follower
//! they take what the share gives them (`share::Follower::next`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use vsnap_artifact::content::CHUNK;

use super::budget::Budget;
use super::outcome::PlaceError;
use super::place::{serve_faults, wait, Buffer, FILL_CHUNK};
use super::share::{Job, Role};
use super::task::Task;
use super::verify::{place_checked, place_chunk, PagesFile};

/// The pages files to place once the restore finished.
pub(super) struct Fill<'a> {
    pub(super) files: &'a [PagesFile],
    pub(super) tasks: &'a [Task],
    /// The artifact, named in a damaged chunk's error.
    pub(super) dir: &'a Path,
    pub(super) stop: &'a AtomicBool,
    /// The host's filler budget: a slot held for each chunk.
    pub(super) budget: Option<&'a Budget>,
    /// What this restore is to the others of its artifact.
    pub(super) share: Option<&'a Role>,
    /// Nanoseconds the fillers waited for a slot, all together.
    pub(super) waited: AtomicU64,
}

impl Fill<'_> {
    /// Every chunk of every file placed by `threads` fillers, while one more
    /// thread serves the faults of tasks waiting for a page. The first error
    /// stops the fillers.
    pub(super) fn run(
        &self,
        threads: usize,
        fault_buf: &mut Buffer,
        faults: &AtomicU64,
    ) -> Result<(), PlaceError> {
        let work: Vec<(usize, usize)> = self
            .files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| (0..f.size.div_ceil(CHUNK) as usize).map(move |c| (i, c)))
            .collect();
        if let Some(Role::Follower(f)) = self.share {
            f.begin();
        }
        let next = AtomicUsize::new(0);
        let done = AtomicBool::new(false);
        let tasks = self.tasks;
        std::thread::scope(|s| {
            let fillers: Vec<_> = (0..threads)
                .map(|k| {
                    let (work, next) = (&work, &next);
                    s.spawn(move || self.fill(k, work, next))
                })
                .collect();
            // Meanwhile: the faults of tasks waiting for a page.
            let serving = s.spawn(|| -> Result<(), PlaceError> {
                while !done.load(Ordering::SeqCst) {
                    for i in wait(-1, tasks)? {
                        serve_faults(&tasks[i], fault_buf, faults)?;
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
                    self.stop.store(true, Ordering::SeqCst);
                }
            }
            done.store(true, Ordering::SeqCst);
            let served = serving
                .join()
                .unwrap_or_else(|_| Err("the fault thread panicked".into()));
            result.and(served)
        })
    }

    /// What filler does next: as a follower, what the share gives it;
    /// else the next `(file, chunk)` of `work`. `None`: nothing left.
    fn next(&self, work: &[(usize, usize)], next: &AtomicUsize) -> Result<Option<Job>, PlaceError> {
        if let Some(Role::Follower(f)) = self.share {
            return f.next(self.stop, self.dir);
        }
        let job = work
            .get(next.fetch_add(1, Ordering::Relaxed))
            .map(|&(file, chunk)| Job::Read { file, chunk });
        Ok(job)
    }

    /// Filler `k`: takes the next chunk until none is left or the server
    /// stops, each placed under a slot of the budget (never waiting for the
    /// share's leader while it holds one).
    fn fill(
        &self,
        k: usize,
        work: &[(usize, usize)],
        next: &AtomicUsize,
    ) -> Result<(), PlaceError> {
        let mut buf = Buffer::new(FILL_CHUNK as usize);
        // Restores start their fillers on different slots.
        let from = std::process::id() as usize + k;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Err(PlaceError::from("cancelled"));
            }
            let Some(job) = self.next(work, next)? else {
                return Ok(());
            };
            let slot = self.budget.map(|b| b.take(from)).transpose()?;
            if let Some(s) = &slot {
                self.waited
                    .fetch_add(s.waited.as_nanos() as u64, Ordering::Relaxed);
                if self.stop.load(Ordering::SeqCst) {
                    return Err(PlaceError::from("cancelled"));
                }
            }
            self.place(job, buf.as_mut())?;
            if slot.is_some() {
                // The waiters were woken as it went: one of them, not this
                // filler again, should have it next.
                drop(slot);
                std::thread::yield_now();
            }
        }
    }

    /// One chunk placed: read (and shared, by a leader) or from the share.
    fn place(&self, job: Job, buf: &mut [u8]) -> Result<(), PlaceError> {
        match job {
            Job::Read { file, chunk } => {
                let f = &self.files[file];
                let task = f.task.map(|t| &self.tasks[t]);
                match self.share {
                    Some(Role::Leader(l)) => l.place(f, file, chunk, task, self.dir, buf),
                    _ => place_chunk(f, chunk, task, self.dir, buf),
                }
            }
            Job::Shared { file, chunk, map } => {
                let f = &self.files[file];
                let task = f.task.map(|t| &self.tasks[t]);
                place_checked(f, chunk, task, map.as_slice())?;
                drop(map);
                if let Some(Role::Follower(fl)) = self.share {
                    fl.done(file, chunk);
                }
                Ok(())
            }
        }
    }
}
