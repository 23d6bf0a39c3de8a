//! Waiting until the cold-started engine is capture-ready: its ready file
//! (the barrier profile: the canary's answer alone) or its capture-ready
//! message in the control dir, within the capture timeout, while it lives.

use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;
use log::info;
use vsnap_protocol::{new_uuid4_hex, wait_for, wait_ready, CaptureReady, ControlDir, Expect};

use super::context::{CaptureRun, Ready};
use crate::error::{Error, Result};
use crate::lifecycle::phase::blocking;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::activation::wake::is_alive;

pub struct WaitReady;

#[async_trait]
impl Phase<CaptureRun> for WaitReady {
    fn name(&self) -> PhaseName {
        PhaseName::WaitReady
    }

    async fn run(&self, run: &mut CaptureRun, stop: &Stop) -> Result<()> {
        let s = &run.plan;
        let (dir_path, owner, pid) = (
            s.common.control_dir.clone(),
            s.common.control_owner.0,
            run.pid,
        );
        let deadline = Instant::now() + s.capture_timeout;
        let profile = s.common.profile.clone();
        // The wait ends with the capture's stop, not only with the engine.
        let stopped = stop.flag();
        let mut waits = move || is_alive(pid) && !stopped.load(Ordering::Relaxed);
        let waiting = |what: &str, e: String| {
            Error::FailedPrecondition(format!("capture: waiting for {what}: {e}"))
        };
        let waited = blocking(PhaseName::WaitReady, move || {
            match profile.ready_path(&dir_path) {
                // The barrier: the ready file holds the canary answer alone.
                Some(ready) => {
                    let r = wait_ready(&ready, deadline, &mut waits)
                        .map_err(|e| waiting("the ready file", e.to_string()))?;
                    let id = new_uuid4_hex().map_err(|e| Error::io("capture: capture id", e))?;
                    Ok((id, None, r.value.oracle()))
                }
                None => {
                    let dir = ControlDir::open_owned_by(&dir_path, owner, Expect::AnyContents)
                        .map_err(|e| {
                            Error::FailedPrecondition(format!("capture: control dir: {e}"))
                        })?;
                    wait_for::<CaptureReady>(&dir, deadline, &mut waits)
                        .map(|r| {
                            (
                                r.value.capture_id.clone(),
                                Some(r.value.clone()),
                                r.value.oracle,
                            )
                        })
                        .map_err(|e| waiting("capture-ready", e.to_string()))
                }
            }
        })
        .await;
        if stop.is_stopped() {
            return Err(stop.error(self.name()));
        }
        let (capture_id, message, oracle) = waited?;
        let cold_start = run.started.elapsed();
        info!(
            "{}: capture-ready after {cold_start:?} (capture {capture_id})",
            run.id
        );
        run.ready = Some(Ready {
            capture_id,
            message,
            oracle,
            cold_start,
        });
        Ok(())
    }
}
