//! The inventory of the capture-ready tree: what CRIU could not restore
//! faithfully is refused before the dump (io_uring, TCP to outside, more
//! than one GPU, undumpable devices), and the volume files it holds open
//! are recorded.

use std::time::Instant;

use async_trait::async_trait;

use super::context::CaptureRun;
use crate::error::{Error, Result};
use crate::lifecycle::phase::blocking;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::{cuda, inventory, rootfs, CONTROL_MOUNT};

pub struct Inventory;

#[async_trait]
impl Phase<CaptureRun> for Inventory {
    fn name(&self) -> PhaseName {
        PhaseName::Inventory
    }

    async fn run(&self, run: &mut CaptureRun, _: &Stop) -> Result<()> {
        let t = Instant::now();
        let pids = run.runc.ps(&run.id).await?;
        inventory::check_no_io_uring(&pids)?;
        inventory::check_no_outside_tcp(&pids)?;
        let gpu = !run.snapshot.gpus.is_empty();
        if gpu {
            cuda::check_single_gpu(&cuda::cuda_holders(&pids))
                .map_err(|e| Error::FailedPrecondition(format!("capture: inventory: {e}")))?;
        }
        let (all, tool, spec) = (
            pids.clone(),
            run.snapshot.tools.cuda_checkpoint.clone(),
            run.snapshot.spec.clone(),
        );
        run.volume_files = blocking(PhaseName::Inventory, move || {
            let is_cuda = |pid: i32| cuda::cuda_restore_tid(&tool, pid).map(drop);
            let cuda_process: Option<&dyn Fn(i32) -> std::result::Result<(), String>> =
                gpu.then_some(&is_cuda);
            inventory::check_dumpable_devices(&all, cuda_process)?;
            rootfs::open_volume_files(&all, &spec, CONTROL_MOUNT)
        })
        .await?;
        run.pids = pids;
        run.times.inventory = t.elapsed();
        Ok(())
    }
}
