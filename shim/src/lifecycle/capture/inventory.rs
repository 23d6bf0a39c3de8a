//! The inventory of the capture-ready tree: what CRIU could not restore
//! faithfully is refused before the dump (io_uring, TCP to outside, a socket
//! on the pod's own address, more
//! than one GPU, undumpable devices), the paths of its inotify and
//! fanotify watches handed to CRIU (it cannot open an overlayfs handle
//! itself), and the volume files it holds open are recorded.

use async_trait::async_trait;

use super::context::CaptureRun;
use crate::error::{Error, Result};
use crate::lifecycle::phase::blocking;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::{criu, gpu, inventory, inventory::fsnotify, rootfs, CONTROL_MOUNT};

pub struct Inventory;

#[async_trait]
impl Phase<CaptureRun> for Inventory {
    fn name(&self) -> PhaseName {
        PhaseName::Inventory
    }

    async fn run(&self, run: &mut CaptureRun, _: &Stop) -> Result<()> {
        let pids = run.runc.ps(&run.id).await?;
        inventory::check_no_io_uring(&pids)?;
        let sockets = inventory::socket_holders(&pids);
        inventory::check_no_outside_tcp(&pids, &sockets)?;
        inventory::check_no_pod_address(&pids, &sockets, &run.plan.spec)?;
        let gpu = !run.plan.common.gpus.is_empty();
        if gpu {
            gpu::check_single_gpu(&gpu::cuda_holders(&pids))
                .map_err(|e| Error::FailedPrecondition(e.to_string()))?;
        }
        let (all, tool, spec) = (
            pids.clone(),
            run.plan.common.tools.cuda_checkpoint.clone(),
            run.plan.spec.clone(),
        );
        let (init, config) = (run.pid, run.bundle.join(criu::BUNDLE_CONFIG));
        run.volume_files = blocking(PhaseName::Inventory, move || {
            let is_cuda = |pid: i32| gpu::cuda_restore_tid(&tool, pid).map(drop);
            let cuda_process: Option<&dyn Fn(i32) -> std::result::Result<(), String>> =
                gpu.then_some(&is_cuda);
            inventory::check_dumpable_devices(&all, cuda_process)?;
            watched_paths_to_criu(&all, init, &config)?;
            rootfs::open_volume_files(&all, &spec, CONTROL_MOUNT)
        })
        .await?;
        run.pids = pids;
        Ok(())
    }
}

/// Every inotify and fanotify watch of the tree (`pids`; `init`'s root is
/// the container's) resolved to its path, each handed to CRIU's config
/// (`config`) as an `irmap-scan-path`; or the refusal naming the process
/// and the watch that cannot be captured.
fn watched_paths_to_criu(pids: &[i32], init: i32, config: &std::path::Path) -> Result<()> {
    let watches = fsnotify::watches(pids);
    if watches.is_empty() {
        return Ok(());
    }
    let mountinfo = std::fs::read_to_string(format!("/proc/{init}/mountinfo")).unwrap_or_default();
    let root = std::path::PathBuf::from(format!("/proc/{init}/root"));
    let paths = fsnotify::scan_paths(&watches, &root, &|dev| fsnotify::fs_type(&mountinfo, dev))
        .map_err(Error::FailedPrecondition)?;
    log::info!(
        "capture: inventory: {} watches, paths for CRIU: {paths:?}",
        watches.len()
    );
    criu::add_irmap_scan_paths(config, &paths)
        .map_err(|e| Error::io(format!("write {}", config.display()), e))
}
