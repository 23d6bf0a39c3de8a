//! What a capture or a restore leaves once the task is gone: its outcome in
//! the metrics journal `vsnap metrics` reads (journal.rs), a restore's
//! timings, a failure's record and CRIU's log of a failed run (reports.rs).

pub(crate) mod journal;
pub(crate) mod reports;

#[cfg(test)]
mod tests;
