//! The activation: the restored copy woken through its control dir (or
//! its barrier released), its canary checked against the manifest's
//! oracle, its port listening. Until then it is not visible.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::context::RestoreRun;
use super::snapshot::Snapshot;
use crate::error::{Error, Result};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::activation::barrier;
use crate::snapshot::activation::wake::activate_copy;

pub struct Activation;

#[async_trait]
impl Phase<RestoreRun<Snapshot>> for Activation {
    fn name(&self) -> PhaseName {
        PhaseName::Activation
    }

    async fn run(&self, run: &mut RestoreRun<Snapshot>, stop: &Stop) -> Result<()> {
        let s = &run.source.plan;
        let (dir, target) = (
            s.common.control_dir.clone(),
            s.common.target(&run.id, run.pid),
        );
        let (profile, deadline, oracle) = (
            s.common.profile.clone(),
            stop.deadline().clone(),
            Some(s.oracle.clone()),
        );
        let api_key = s.common.api_key.clone();
        let woken = Instant::now();
        let validated = tokio::task::spawn_blocking(move || -> Result<Duration> {
            match (profile.ready_path(&dir), profile.release_path(&dir)) {
                (Some(ready), Some(release)) => {
                    let started = Instant::now();
                    barrier::release_and_check(
                        "restore", &ready, &release, &target, &deadline, oracle, api_key,
                    )
                    .map(|()| started.elapsed())
                }
                _ => activate_copy(&target, &deadline, oracle),
            }
        })
        .await
        .map_err(|e| Error::Other(e.to_string()))??;
        run.source.listener = woken.elapsed().saturating_sub(validated);
        Ok(())
    }
}
