//! Asking NVIDIA's cuda-checkpoint about a process (its restore thread,
//! its CUDA state) and, after a failed dump, restoring and unlocking it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use vsnap_artifact::spawn::{self, Ran, RunError};

/// How long one cuda-checkpoint query may take.
pub const CUDA_CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `cuda_checkpoint args` within [`CUDA_CHECKPOINT_TIMEOUT`], its
/// status possibly taken by the shim's reaper (see [`spawn`]).
fn run_cuda_checkpoint(cuda_checkpoint: &Path, args: &[&str]) -> Result<Ran, RunError> {
    spawn::run(
        Command::new(cuda_checkpoint).args(args),
        CUDA_CHECKPOINT_TIMEOUT,
    )
}

/// Asks cuda-checkpoint whether `pid` is a CUDA process: its restore
/// thread's id when it is, else cuda-checkpoint's own message (what the CUDA
/// plugin asks first of every process it would checkpoint).
pub fn cuda_restore_tid(cuda_checkpoint: &Path, pid: i32) -> Result<i32, String> {
    let pid_text = pid.to_string();
    let args = ["--get-restore-tid", "--pid", pid_text.as_str()];
    let ran = run_cuda_checkpoint(cuda_checkpoint, &args).map_err(|e| match e {
        RunError::Spawn(e) | RunError::Wait(e) => {
            format!("{}: {e}", cuda_checkpoint.display())
        }
        RunError::Timeout => format!(
            "{} did not answer within {}s",
            cuda_checkpoint.display(),
            CUDA_CHECKPOINT_TIMEOUT.as_secs()
        ),
    })?;
    if let Some((status, output)) = ran.failure() {
        return Err(format!("{output} ({status})"));
    }
    ran.stdout
        .trim()
        .parse()
        .map_err(|_| format!("unexpected answer {:?}", ran.stdout.trim()))
}

/// The state cuda-checkpoint reports for `pid` (running, locked,
/// checkpointed), or why it could not tell.
pub fn cuda_state(cuda_checkpoint: &Path, pid: i32) -> Result<String, String> {
    let pid_text = pid.to_string();
    let args = ["--get-state", "--pid", pid_text.as_str()];
    let ran = run_cuda_checkpoint(cuda_checkpoint, &args)
        .map_err(|_| format!("{} --get-state failed to run", cuda_checkpoint.display()))?;
    match ran.failure() {
        Some((status, output)) => Err(format!("{output} ({status})")),
        None => Ok(ran.stdout.trim().to_string()),
    }
}

/// Best effort after a dump that failed or was killed: every process of
/// `pids` that cuda-checkpoint reports locked or checkpointed is restored
/// and unlocked, so the engine's GPU work goes on. Returns what it did.
pub fn resume_gpu_best_effort(cuda_checkpoint: &Path, pids: &[i32]) -> Vec<String> {
    let mut done = Vec::new();
    for &pid in pids {
        let Ok(state) = cuda_state(cuda_checkpoint, pid) else {
            continue;
        };
        let actions: &[&str] = match state.as_str() {
            s if s.starts_with("checkpointed") => &["restore", "unlock"],
            s if s.starts_with("locked") => &["unlock"],
            _ => &[],
        };
        for action in actions {
            let pid_text = pid.to_string();
            let args = ["--action", action, "--pid", pid_text.as_str()];
            let ok =
                run_cuda_checkpoint(cuda_checkpoint, &args).is_ok_and(|r| r.failure().is_none());
            done.push(format!(
                "pid {pid}: {action} {}",
                if ok { "done" } else { "failed" }
            ));
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::super::testutil::write_script;
    use super::*;

    #[test]
    fn cuda_checkpoint_answers_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("cuda-checkpoint");
        write_script(
            &tool,
            "case \"$1 $3\" in\n\
             '--get-restore-tid 41') echo 57 ;;\n\
             '--get-state 41') echo running ;;\n\
             *) echo \"Error: pid $3 is not a CUDA process\" >&2; exit 1 ;;\n\
             esac",
        );
        assert_eq!(cuda_restore_tid(&tool, 41), Ok(57));
        let e = cuda_restore_tid(&tool, 42).unwrap_err();
        assert_eq!(e, "Error: pid 42 is not a CUDA process (exit status: 1)");
        assert_eq!(cuda_state(&tool, 41).as_deref(), Ok("running"));
        assert!(
            resume_gpu_best_effort(&tool, &[41, 42]).is_empty(),
            "nothing locked"
        );
        let e = cuda_restore_tid(&dir.path().join("missing"), 1).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }
}
