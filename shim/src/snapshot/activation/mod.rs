//! A copy (or a donor) made visible: woken through its control dir
//! (wake.rs) or its barrier released (barrier.rs), its canary held to the
//! manifest's oracle (canary.rs), its listener found in its own network
//! namespace (listener.rs), its own identity handed over (identity.rs).

pub(crate) mod barrier;
pub(crate) mod canary;
pub(crate) mod identity;
pub(crate) mod listener;
pub(crate) mod ns;
pub(crate) mod target;
pub(crate) mod wake;
