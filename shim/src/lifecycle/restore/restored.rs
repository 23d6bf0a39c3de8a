//! The restored init taken over: its terminal and pid, its exit watched,
//! and, for a snapshot restore, every process of the tree let run (CRIU
//! left them stopped).

use async_trait::async_trait;

use super::context::{RestoreRun, Source};
use crate::container::CopyExit;
use crate::error::Result;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::activation::{identity, listener};

pub struct Restored;

#[async_trait]
impl<S: Source> Phase<RestoreRun<S>> for Restored {
    fn name(&self) -> PhaseName {
        PhaseName::Restored
    }

    async fn run(&self, run: &mut RestoreRun<S>, _: &Stop) -> Result<()> {
        let prepared = run.job.prepared.take().expect("taken once");
        let mut c = run.handle.lock().await;
        let pid = c.finish_restore(prepared, Ok(())).await?;
        run.pid = pid;
        if run.source.may_go_cold() {
            // Should the copy fail, the start goes on cold: its exit is
            // not the container's until it is visible.
            c.copy_exit = CopyExit::Hold(None);
        }
        run.shared.watch(&c.id, "", pid, run.mark);
        if let Some(hostname) = run.source.hostname() {
            // Before the tree runs: it never sees the donor's name.
            identity::set_hostname_of(pid, hostname).map_err(|e| {
                crate::error::Error::FailedPrecondition(format!("restore: hostname: {e}"))
            })?;
        }
        if run.source.left_stopped() {
            resume(pid);
        }
        Ok(())
    }
}

/// Lets the restored tree run: CRIU left every process of it stopped.
fn resume(pid: i32) {
    let members = listener::container_pids(pid).unwrap_or_else(|_| vec![pid]);
    for p in members {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}
