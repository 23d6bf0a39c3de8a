//! The lifecycle of a container's init, over its vocabulary one floor
//! below (../init_start.rs: how it starts, resolved once at create;
//! ../init_state.rs: the state machine that is the only writer of its
//! status): create (create.rs), and the start as phases run by one driver
//! (driver.rs): a plain `runc start` (plain.rs), then for a capture plan
//! the capture in the background (capture/), or a restore (restore/),
//! each phase a small unit, the driver owning the deadline, the cancel
//! token, the error record, the timings and the artifact lock's release.
//! docs/architecture.md draws it.

pub mod capture;
pub mod create;
pub mod driver;
pub mod phase;
mod plain;
pub mod restore;
#[cfg(test)]
pub(crate) mod test_support;

use crate::error::{Error, Result};
use crate::exits::Mark;
use crate::shared::{ContainerRef, Shared};

/// Starts (or restores) the init of `handle`; returns its pid. A restore
/// runs in a task of its own, owned by the shim: a dropped Start call does
/// not stop it, and no lock on the container is held while it runs.
pub async fn start_init(shared: Shared, handle: ContainerRef, mark: Mark) -> Result<i32> {
    let mut c = handle.lock().await;
    if !c.start.restores() {
        return plain::start(&shared, &mut c).await;
    }
    let run = restore::begin(&mut c, shared, handle.clone(), mark)?;
    drop(c);
    tokio::spawn(run.drive())
        .await
        .map_err(|e| Error::Other(format!("restore: {e}")))?
}
