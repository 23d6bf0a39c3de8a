//! What the capture carries beside CRIU's images: the host folder mounted
//! at /dev/shm, and the container's writable layer as a tar (or the record
//! of why it is not carried).

use std::time::Instant;

use async_trait::async_trait;
use log::info;
use vsnap_artifact::rootfs as artifact_rootfs;

use super::context::CaptureRun;
use crate::error::{Error, Result};
use crate::lifecycle::phase::blocking;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::{rootfs, rootfs::shm};

pub struct Carry;

#[async_trait]
impl Phase<CaptureRun> for Carry {
    fn name(&self) -> PhaseName {
        PhaseName::Carry
    }

    async fn run(&self, run: &mut CaptureRun, _: &Stop) -> Result<()> {
        let dir = run.staging().dir.clone();
        let s = &run.plan;
        if let Some(host_shm) = s.common.host_shm.clone() {
            let to = dir.join(shm::ARTIFACT_DIR);
            blocking(PhaseName::Carry, move || shm::carry(&host_shm, &to)).await?;
        }
        let packing = Instant::now();
        let layer = match s.layer.to_carry() {
            Err(record) => record,
            Ok(upper) => {
                let (upper, dir, limit) = (
                    upper.to_path_buf(),
                    dir.join(artifact_rootfs::DIR),
                    s.layer_limit,
                );
                blocking(PhaseName::Carry, move || {
                    std::fs::create_dir(&dir).map_err(|e| {
                        Error::io(format!("capture: rootfs: create {}", dir.display()), e)
                    })?;
                    rootfs::pack(&upper, &dir.join(artifact_rootfs::UPPER_TAR), limit)
                })
                .await?
            }
        };
        run.rootfs_packing = packing.elapsed();
        info!(
            "{}: writable layer in {:?}: {layer:?}",
            run.id, run.rootfs_packing
        );
        run.layer = Some(layer);
        Ok(())
    }
}
