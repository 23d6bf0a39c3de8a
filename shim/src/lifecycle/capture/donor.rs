//! After the publish, the donor: `after-capture=serve` wakes it (its
//! activation, as a restored copy's, then its canary checked), `exit`
//! stops it the way its protocol allows, then tells it, then makes it.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use log::info;
use vsnap_protocol::ActivationKind;

use super::context::CaptureRun;
use crate::error::Result;
use crate::lifecycle::phase::blocking;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::activation::barrier;
use crate::snapshot::activation::wake::{activate_and_probe, is_alive};
use crate::snapshot::plan::AfterCapture;

pub struct Donor;

#[async_trait]
impl Phase<CaptureRun> for Donor {
    fn name(&self) -> PhaseName {
        PhaseName::Donor
    }

    async fn run(&self, run: &mut CaptureRun, _: &Stop) -> Result<()> {
        match run.plan.after_capture {
            AfterCapture::Serve => serve(run).await,
            AfterCapture::Exit => stop_donor(run).await,
        }
    }
}

/// `after-capture=serve`: the donor woken and its canary checked.
async fn serve(run: &mut CaptureRun) -> Result<()> {
    let s = &run.plan;
    let (dir, target) = (
        s.common.control_dir.clone(),
        s.common.target(&run.id, run.pid),
    );
    let deadline = s.common.activation_deadline();
    let (profile, api_key) = (s.common.profile.clone(), s.common.api_key.clone());
    let message = run.ready().message.clone();
    blocking(PhaseName::Donor, move || match message {
        Some(ready) => activate_and_probe(
            "capture: donor",
            &target,
            &ready,
            ActivationKind::Donor,
            &deadline,
        )
        .map(drop),
        None => barrier::release_and_check(
            "capture: donor",
            &profile.ready_path(&dir).expect("a barrier profile"),
            &profile.release_path(&dir).expect("a barrier profile"),
            &target,
            &deadline,
            None,
            api_key,
        ),
    })
    .await?;
    info!("{}: donor serving", run.id);
    Ok(())
}

/// `after-capture=exit`: the donor asked to stop the way its protocol
/// allows, then told, then made to. The barrier gets its abort marker
/// first (vLLM's server exits without binding: it installs no SIGTERM
/// handler, and as PID 1 of its namespace the kernel drops SIGTERM); then
/// every process gets SIGTERM; past `donor_stop_grace_s` after each step,
/// SIGKILL. The task reports the donor's own exit.
async fn stop_donor(run: &CaptureRun) -> Result<()> {
    let s = &run.plan;
    let grace = s.donor_stop_grace;
    if let Some(release) = s.common.profile.release_path(&s.common.control_dir) {
        if let Err(e) = vsnap_protocol::abort_release(&release) {
            info!("{}: donor: abort marker: {e}", run.id);
        } else if exits_within(run.pid, grace).await {
            info!("{}: donor exited after the abort marker", run.id);
            return Ok(());
        }
    }
    if let Err(e) = run.runc.kill(&run.id, libc::SIGTERM as u32, true).await {
        if !is_alive(run.pid) {
            return Ok(());
        }
        return Err(e);
    }
    if exits_within(run.pid, grace).await {
        info!("{}: donor exited after SIGTERM", run.id);
        return Ok(());
    }
    info!(
        "{}: donor still running {}s after SIGTERM (donor_stop_grace_s): SIGKILL",
        run.id,
        grace.as_secs()
    );
    match run.runc.kill(&run.id, libc::SIGKILL as u32, true).await {
        Err(_) if !is_alive(run.pid) => Ok(()),
        r => r,
    }
}

/// Whether `pid` is gone (reaped by the shim) within `grace`.
async fn exits_within(pid: i32, grace: Duration) -> bool {
    let until = Instant::now() + grace;
    while is_alive(pid) {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}
