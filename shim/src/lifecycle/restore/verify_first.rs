//! The verification phase of a GPU restore: every byte checked before CRIU
//! starts, since CRIU cannot hold a GPU tree stopped beside it.

use async_trait::async_trait;

use super::context::RestoreRun;
use super::snapshot::Snapshot;
use super::verify::joined;
use crate::error::Result;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};

/// Verification first (a GPU restore: CRIU cannot hold the tree stopped).
pub struct VerifyFirst;

#[async_trait]
impl Phase<RestoreRun<Snapshot>> for VerifyFirst {
    fn name(&self) -> PhaseName {
        PhaseName::Verify
    }

    async fn run(&self, run: &mut RestoreRun<Snapshot>, stop: &Stop) -> Result<()> {
        let Some(v) = run.source.verify.take() else {
            return Ok(());
        };
        let verifying = v.spawn(stop.flag(), run.job.deadline.cancel.clone());
        run.source.verify_took = joined(Some(verifying), stop.deadline()).await?;
        Ok(())
    }
}
