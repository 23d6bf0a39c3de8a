//! A restore's start, from `runc restore` to a validated, listening copy,
//! as phases (one file each) run by the driver (../driver.rs) in a task the
//! shim owns, with no lock on the container: State, Kill, Stats and the
//! other containers answer meanwhile, and it finishes or fails within its
//! deadline even when containerd dies mid-call. A restored copy counts as
//! RUNNING only once its engine validated its canary and listens; a failed
//! one is killed and reported as exited non-zero, with its error record
//! (naming the phase) in the bundle.

mod activation;
mod begin;
mod context;
mod criu;
mod go_cold;
#[cfg(test)]
mod go_cold_tests;
mod gpu;
pub mod job;
mod restored;
mod snapshot;
#[cfg(test)]
mod undo_tests;
mod verify;
mod verify_first;
mod visible;

use log::info;

use super::driver::{self, Failed, Run};
use super::phase::Phase;
use crate::error::Result;
pub use begin::{begin, Begun};
pub use context::{Checkpoint, RestoreRun, Source};
pub use snapshot::Snapshot;

type Units<S> = &'static [&'static dyn Phase<RestoreRun<S>>];

/// The phases of a containerd checkpoint's restore, in order.
pub fn checkpoint_phases() -> Units<Checkpoint> {
    &[&criu::CriuRestore, &restored::Restored, &visible::Visible]
}

/// The phases of an artifact's restore, in order.
pub fn snapshot_phases(gpu: bool) -> Units<Snapshot> {
    match gpu {
        // CRIU holds the tree stopped: the verification runs beside it.
        false => &[
            &criu::CriuRestore,
            &restored::Restored,
            &activation::Activation,
            &visible::Visible,
        ],
        // It cannot with GPUs: every byte first, then CRIU.
        true => &[
            &verify_first::VerifyFirst,
            &criu::CriuRestore,
            &restored::Restored,
            &gpu::GpuResume,
            &activation::Activation,
            &visible::Visible,
        ],
    }
}

impl Begun {
    /// Runs the phases; the restored init's pid, or the start's error.
    pub async fn drive(self) -> Result<i32> {
        match self {
            Begun::Checkpoint(mut run) => {
                let failed = match drive_phases(run.as_mut(), checkpoint_phases()).await {
                    Ok(()) => return Ok(run.pid),
                    Err(failed) => failed,
                };
                Err(failed.error)
            }
            Begun::Snapshot(mut run) => {
                let units = snapshot_phases(run.source.gpu());
                match drive_phases(run.as_mut(), units).await {
                    Ok(()) => Ok(run.pid),
                    Err(failed) => {
                        run.journal_failure(&failed);
                        // Under `auto`, the start went on cold (go_cold.rs).
                        run.source.cold_pid.ok_or(failed.error)
                    }
                }
            }
        }
    }
}

/// The phases driven over `run`, its records left on success.
async fn drive_phases<S: Source>(
    run: &mut RestoreRun<S>,
    units: Units<S>,
) -> std::result::Result<(), Failed>
where
    RestoreRun<S>: Run + Recorded,
{
    let stop = run.stop.clone();
    match driver::drive(run, units, &stop, driver::GRACE).await {
        Ok(phases) => {
            // The copy holds its stdio now: the shim's hold must not keep
            // its output open after it exits.
            drop(run.job.spare_stdio.take());
            log::debug!("{}: restore phases: {phases:?}", run.id);
            run.recorded(&phases);
            Ok(())
        }
        Err(failed) => {
            info!(
                "{}: restore failed in {} after {:?} there",
                run.id,
                failed.phase,
                failed.timings.of(failed.phase)
            );
            Err(failed)
        }
    }
}

/// What a restore that succeeded leaves: an artifact's its timings and
/// journal record; a checkpoint's nothing.
trait Recorded {
    fn recorded(&self, phases: &driver::Timings);
}

impl Recorded for RestoreRun<Checkpoint> {
    fn recorded(&self, _: &driver::Timings) {}
}

impl Recorded for RestoreRun<Snapshot> {
    fn recorded(&self, phases: &driver::Timings) {
        self.record_timings(phases);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::phase::PhaseName::{self, *};

    /// What each restore runs: a checkpoint's, an artifact's without and
    /// with GPUs.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Kind {
        Checkpoint,
        Snapshot { gpu: bool },
    }

    fn names(kind: Kind) -> Vec<PhaseName> {
        match kind {
            Kind::Checkpoint => checkpoint_phases().iter().map(|p| p.name()).collect(),
            Kind::Snapshot { gpu } => snapshot_phases(gpu).iter().map(|p| p.name()).collect(),
        }
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
