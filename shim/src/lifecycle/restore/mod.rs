//! A restore's start, from `runc restore` to a validated, listening copy,
//! as phases (one file each) run by the driver (../driver.rs) in a task the
//! shim owns, with no lock on the container: State, Kill, Stats and the
//! other containers answer meanwhile, and it finishes or fails within its
//! deadline even when containerd dies mid-call. A restored copy counts as
//! RUNNING only once its engine validated its canary and listens; a failed
//! one is killed and reported as exited non-zero, with its error record
//! (naming the phase) in the bundle.

mod activation;
mod context;
mod criu;
mod gpu;
pub mod job;
mod restored;
#[cfg(test)]
mod undo_tests;
mod verify;
mod verify_first;
mod visible;

use log::info;

use super::driver;
use super::phase::Phase;
use crate::error::Result;
pub use context::{Kind, RestoreRun};

type Units = &'static [&'static dyn Phase<RestoreRun>];

/// The phases of a restore, in order: what `kind` runs.
pub fn phases(kind: Kind) -> Units {
    match kind {
        Kind::Checkpoint => &[&criu::CriuRestore, &restored::Restored, &visible::Visible],
        // CRIU holds the tree stopped: the verification runs beside it.
        Kind::Snapshot { gpu: false } => &[
            &criu::CriuRestore,
            &restored::Restored,
            &activation::Activation,
            &visible::Visible,
        ],
        // It cannot with GPUs: every byte first, then CRIU.
        Kind::Snapshot { gpu: true } => &[
            &verify_first::VerifyFirst,
            &criu::CriuRestore,
            &restored::Restored,
            &gpu::GpuResume,
            &activation::Activation,
            &visible::Visible,
        ],
    }
}

/// Runs the phases; the restored init's pid, or the start's error.
pub async fn drive(mut run: RestoreRun) -> Result<i32> {
    let (stop, units) = (run.stop.clone(), phases(run.kind()));
    match driver::drive(&mut run, units, &stop, driver::GRACE).await {
        Ok(phases) => {
            // The copy holds its stdio now: the shim's hold must not keep
            // its output open after it exits.
            drop(run.job.spare_stdio.take());
            log::debug!("{}: restore phases: {phases:?}", run.id);
            run.record_timings(&phases);
            Ok(run.pid)
        }
        Err(failed) => {
            info!(
                "{}: restore failed in {} after {:?} there",
                run.id,
                failed.phase,
                failed.timings.of(failed.phase)
            );
            run.journal_failure(&failed);
            // Under `auto`, the start went on cold (context.rs).
            run.cold_pid.ok_or(failed.error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::phase::PhaseName::{self, *};

    fn names(kind: Kind) -> Vec<PhaseName> {
        phases(kind).iter().map(|p| p.name()).collect()
    }

    #[test]
    fn a_gpu_restore_verifies_before_criu_and_checks_the_gpus() {
        let p = names(Kind::Snapshot { gpu: true });
        let at = |n| p.iter().position(|x| *x == n).unwrap();
        assert!(at(Verify) < at(CriuRestore));
        assert!(at(CriuRestore) < at(GpuResume) && at(GpuResume) < at(Activation));
    }

    #[test]
    fn a_cpu_restore_verifies_inside_the_criu_phase() {
        let p = names(Kind::Snapshot { gpu: false });
        assert_eq!(p, [CriuRestore, Restored, Activation, Visible]);
    }

    #[test]
    fn every_restore_ends_visible_after_taking_its_init_and_a_checkpoint_has_no_activation() {
        for kind in [
            Kind::Checkpoint,
            Kind::Snapshot { gpu: false },
            Kind::Snapshot { gpu: true },
        ] {
            let p = names(kind);
            assert_eq!(p.last(), Some(&Visible), "{kind:?}");
            let at = |n| p.iter().position(|x| *x == n).unwrap();
            assert!(at(CriuRestore) < at(Restored), "{kind:?}");
            assert_eq!(
                p.contains(&Activation),
                kind != Kind::Checkpoint,
                "{kind:?}"
            );
            assert!(
                p.iter().all(|n| n.as_str().starts_with("restore: ")),
                "{p:?}"
            );
        }
    }
}
