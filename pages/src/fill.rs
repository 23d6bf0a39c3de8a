//! The fillers: once the restore finished, `threads` threads take the
//! pages files chunk by chunk (each under a slot of the host's budget),
//! while one more serves the faults of tasks waiting for a page. Alone or
//! as the share's leader they take every chunk in order; as a follower
//! they take what the share gives them (`share::Follower::next`).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::chunks::{fillers, Buffer, Chunks, PIECE};
use crate::error::{PageError, Phase};

use super::budget::Budget;
use super::place::{serve_faults, wait};
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
    ) -> Result<(), PageError> {
        let sizes: Vec<u64> = self.files.iter().map(|f| f.size).collect();
        let chunks = Chunks::of(&sizes);
        if let Some(Role::Follower(f)) = self.share {
            f.begin();
        }
        let done = AtomicBool::new(false);
        let tasks = self.tasks;
        std::thread::scope(|s| {
            // Meanwhile: the faults of tasks waiting for a page.
            let serving = s.spawn(|| -> Result<(), PageError> {
                while !done.load(Ordering::SeqCst) {
                    for i in wait(-1, tasks)? {
                        serve_faults(&tasks[i], fault_buf, faults)?;
                    }
                }
                Ok(())
            });
            let result = fillers(
                threads,
                |k| self.fill(k, &chunks),
                || {
                    self.stop.store(true, Ordering::SeqCst);
                    // Fillers waiting for bytes to arrive stop too.
                    for a in self.files.iter().filter_map(|f| f.stream.as_ref()) {
                        a.stop();
                    }
                },
            );
            done.store(true, Ordering::SeqCst);
            let served = serving.join().unwrap_or_else(|_| {
                Err(PageError::failed(
                    Phase::Place,
                    "the fault thread",
                    "panicked",
                ))
            });
            result.and(served)
        })
    }

    /// What filler does next: as a follower, what the share gives it;
    /// else the next chunk of `chunks`. `None`: nothing left.
    fn next(&self, chunks: &Chunks) -> Result<Option<Job>, PageError> {
        if let Some(Role::Follower(f)) = self.share {
            return f.next(self.stop, self.dir);
        }
        Ok(chunks.next().map(|c| Job::Read {
            file: c.file,
            chunk: c.index,
        }))
    }

    /// Filler `k`: takes the next chunk until none is left or the server
    /// stops, each placed under a slot of the budget (never waiting for the
    /// share's leader while it holds one).
    fn fill(&self, k: usize, chunks: &Chunks) -> Result<(), PageError> {
        let mut buf = Buffer::new(PIECE as usize);
        // Restores start their fillers on different slots.
        let from = std::process::id() as usize + k;
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return Err(PageError::cancelled(Phase::Place));
            }
            let Some(job) = self.next(chunks)? else {
                return Ok(());
            };
            let slot = self.budget.map(|b| b.take(from)).transpose()?;
            if let Some(s) = &slot {
                self.waited
                    .fetch_add(s.waited.as_nanos() as u64, Ordering::Relaxed);
                if self.stop.load(Ordering::SeqCst) {
                    return Err(PageError::cancelled(Phase::Place));
                }
            }
            self.place(job, buf.as_mut_slice())?;
            if slot.is_some() {
                // The waiters were woken as it went: one of them, not this
                // filler again, should have it next.
                drop(slot);
                std::thread::yield_now();
            }
        }
    }

    /// One chunk placed: read (and shared, by a leader) or from the share.
    fn place(&self, job: Job, buf: &mut [u8]) -> Result<(), PageError> {
        match job {
            Job::Read { file, chunk } => {
                let f = &self.files[file];
                let task = f.task.map(|t| &self.tasks[t]);
                match self.share {
                    Some(Role::Leader(l)) => l.place(f, file, chunk, task, self.dir, buf),
                    _ => place_chunk(f, chunk, task, self.dir, buf, self.stop),
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
