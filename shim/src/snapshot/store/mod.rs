//! What leaves the node or outlives the task: an artifact fetched from or
//! pushed to a registry (fetch.rs), the metrics journal (journal.rs), the
//! records of a restore's timings and a failure (records.rs).

pub(crate) mod fetch;
pub(crate) mod journal;
pub(crate) mod records;
