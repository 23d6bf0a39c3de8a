//! The checkpoint: `runc checkpoint` (CRIU) of the running tree into a
//! fresh staging dir, left running, within the checkpoint timeout. A dump
//! killed at its deadline, or by a kill or delete of the task, leaves the
//! tree thawed (CRIU froze its cgroup) and its GPUs resumed; CRIU's log
//! says what it could not dump.

use std::time::Instant;

use async_trait::async_trait;
use log::info;
use vsnap_artifact::{ensure_root, Clocks, Staging};

use super::context::CaptureRun;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::runc::CheckpointFlags;
use crate::snapshot::{artifact_error, criu, gpu, inventory::fsnotify};

pub struct Checkpoint;

#[async_trait]
impl Phase<CaptureRun> for Checkpoint {
    fn name(&self) -> PhaseName {
        PhaseName::Checkpoint
    }

    async fn run(&self, run: &mut CaptureRun, stop: &Stop) -> Result<()> {
        let s = &run.plan;
        ensure_root(&s.common.root).map_err(|e| artifact_error("capture", e))?;
        let staging = Staging::new(&s.common.root, s.common.artifact.as_str())
            .map_err(|e| artifact_error("capture", e))?;
        let flags = CheckpointFlags {
            leave_running: true,
            ..criu::options::flags(Some(&run.plan.criu), run.terminal)
        };
        let mut deadline = Deadline::new(
            Instant::now() + s.checkpoint_timeout,
            format!(
                "the checkpoint timeout of {}s (checkpoint_timeout_s)",
                s.checkpoint_timeout.as_secs()
            ),
        );
        // A kill of the task or its delete kills runc and CRIU at once.
        deadline.cancel = stop.deadline().cancel.child_token();
        // Right before the dump: CRIU freezes the tree within moments of
        // runc starting it, so the engine's timers were set on these clocks.
        run.clocks = Some(Clocks::now());
        let dumped = run
            .runc
            .checkpoint(
                &run.id,
                &staging.images(),
                &staging.work(),
                &flags,
                Some(&deadline),
            )
            .await;
        let dump_log = staging.work().join("dump.log");
        run.staging = Some(staging);
        if let Err(e) = dumped {
            if matches!(e, Error::DeadlineExceeded(_) | Error::Cancelled(_)) {
                // runc and CRIU are gone; the tree may be frozen, its GPU
                // locked: let it go on before it is stopped.
                thaw(run).await;
            }
            // runc's own message is generic; CRIU's log says what it could not dump.
            let mut criu = criu::log_errors(&dump_log);
            criu.push_str(&criu::dump_hint(&criu));
            criu.push_str(&watches_not_dumped(run, &dump_log).await);
            return Err(match e {
                Error::DeadlineExceeded(m) => Error::DeadlineExceeded(format!("{m}{criu}")),
                Error::Cancelled(m) => Error::Cancelled(format!("{m}{criu}")),
                e => Error::Other(format!("{e}{criu}")),
            });
        }
        if !run.plan.common.gpus.is_empty() {
            let log = std::fs::read_to_string(&dump_log).unwrap_or_default();
            criu::check_cuda_plugin_ran(&log)
                .map_err(|e| Error::FailedPrecondition(e.to_string()))?;
        }
        Ok(())
    }
}

/// The watched files a failed dump could not reopen, named (a walk of the
/// container's root, off the runtime's threads); empty when its log names
/// none.
async fn watches_not_dumped(run: &CaptureRun, dump_log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(dump_log).unwrap_or_default();
    if fsnotify::unopened(&text).is_empty() {
        return String::new();
    }
    let root = std::path::PathBuf::from(format!("/proc/{}/root", run.pid));
    let pids = run.pids.clone();
    tokio::task::spawn_blocking(move || fsnotify::explain_dump_failure(&text, &root, &pids))
        .await
        .unwrap_or_default()
}

/// After a dump killed (its deadline, a cancel): the tree thawed (CRIU
/// froze its cgroup), every process continued, and for GPUs every process
/// cuda-checkpoint reports locked or checkpointed resumed. Best effort.
async fn thaw(run: &CaptureRun) {
    if let Err(e) = run.runc.resume(&run.id).await {
        info!("{}: thaw after the killed dump: {e}", run.id);
    }
    for p in &run.pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
    if !run.plan.common.gpus.is_empty() {
        let (tool, pids) = (
            run.plan.common.tools.cuda_checkpoint.clone(),
            run.pids.clone(),
        );
        if let Ok(done) =
            tokio::task::spawn_blocking(move || gpu::resume_gpu_best_effort(&tool, &pids)).await
        {
            info!("{}: GPU after the killed dump: {done:?}", run.id);
        }
    }
}
