//! The last step of a restore: the copy counts as running (TaskStart is
//! queued under the container's lock, before any exit of it) unless it was
//! killed or exited meanwhile.

use async_trait::async_trait;

use super::context::{RestoreRun, Source};
use crate::container::CopyExit;
use crate::error::{Error, Result};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::lifecycle::plain::publish_start;

pub struct Visible;

#[async_trait]
impl<S: Source> Phase<RestoreRun<S>> for Visible {
    fn name(&self) -> PhaseName {
        PhaseName::Visible
    }

    async fn run(&self, run: &mut RestoreRun<S>, stop: &Stop) -> Result<()> {
        let mut c = run.handle.lock().await;
        if stop.deadline().cancel.is_cancelled() {
            return Err(Error::Cancelled(format!(
                "restore: {}: cancelled: the task was killed",
                c.id
            )));
        }
        if let CopyExit::Hold(Some(exit)) = &c.copy_exit {
            return Err(Error::FailedPrecondition(format!(
                "restore: {}: the copy exited ({}) before it was started",
                c.id, exit.code
            )));
        }
        c.copy_exit = CopyExit::Publish;
        if let Some(exit) = c.init.exit() {
            return Err(Error::FailedPrecondition(format!(
                "restore: {}: the copy exited ({}) before it was started",
                c.id, exit.code
            )));
        }
        c.visible()?;
        run.shared.watch_oom(&c.id, run.pid);
        publish_start(&run.shared, &c).await;
        Ok(())
    }
}
