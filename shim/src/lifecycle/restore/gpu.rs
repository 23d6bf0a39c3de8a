//! After the restore of a GPU container: CRIU reports success even when its
//! CUDA plugin failed to resume a GPU (the copy would hang until the
//! deadline), so its restore log is read, and every process cuda-checkpoint
//! knows must be running again. Fails at once, naming the GPU step.

use async_trait::async_trait;

use super::context::RestoreRun;
use super::snapshot::Snapshot;
use crate::error::{Error, Result};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::{activation::listener, criu, gpu};

pub struct GpuResume;

#[async_trait]
impl Phase<RestoreRun<Snapshot>> for GpuResume {
    fn name(&self) -> PhaseName {
        PhaseName::GpuResume
    }

    async fn run(&self, run: &mut RestoreRun<Snapshot>, _: &Stop) -> Result<()> {
        let s = &run.source.plan;
        let log = run.job.work.join("restore.log");
        let (tool, pid) = (s.common.tools.cuda_checkpoint.clone(), run.pid);
        tokio::task::spawn_blocking(move || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            criu::check_cuda_resume(&text)
                .map_err(|e| Error::FailedPrecondition(format!("{e} ({})", log.display())))?;
            let members = listener::container_pids(pid).unwrap_or_else(|_| vec![pid]);
            for p in members {
                if let Ok(state) = gpu::cuda_state(&tool, p) {
                    if !state.starts_with("running") {
                        return Err(Error::FailedPrecondition(format!(
                            "pid {p} is {state} after the restore (cuda-checkpoint --get-state)"
                        )));
                    }
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Other(e.to_string()))?
    }
}
