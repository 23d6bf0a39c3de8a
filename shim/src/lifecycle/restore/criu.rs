//! The CRIU phase: `runc restore` (vsnap's page server placing the memory
//! where it does), with the verification of every byte beside it where
//! CRIU leaves the restored tree stopped (leave-stopped): nothing of the
//! tree runs or is seen before the digests matched, and a mismatch cancels
//! the restore. Damage is named whatever CRIU made of it.

use async_trait::async_trait;

use super::context::{RestoreRun, Source};
use super::verify::joined;
use crate::error::Result;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::rootfs::shm;

pub struct CriuRestore;

#[async_trait]
impl<S: Source> Phase<RestoreRun<S>> for CriuRestore {
    fn name(&self) -> PhaseName {
        PhaseName::CriuRestore
    }

    async fn run(&self, run: &mut RestoreRun<S>, stop: &Stop) -> Result<()> {
        let verifying = run
            .source
            .verify_beside_criu()
            .map(|v| v.spawn(stop.flag(), run.job.deadline.cancel.clone()));
        run.criu_started = true;
        let ran = run.job.run().await;
        let verified = joined(verifying, stop.deadline()).await;
        if let Some(host_shm) = run.source.host_shm() {
            // CRIU has opened what it needed of them.
            shm::remove_link_remaps(host_shm);
        }
        match (ran, verified) {
            (ran, Ok(took)) => {
                run.source.verified(took);
                // A failed job undid runc's and CRIU's leftovers itself.
                run.criu_undone = ran.is_err();
                ran
            }
            (Ok(()), Err(e)) => {
                // Restored but damaged: the stopped tree goes with runc's state.
                run.job.undo().await;
                run.criu_undone = true;
                Err(e)
            }
            (Err(_), Err(e)) => {
                run.criu_undone = true;
                Err(e)
            }
        }
    }
}
