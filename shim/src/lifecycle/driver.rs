//! The driver of a start's phases: it runs them in order, each bounded by
//! the start's one [`Stop`], times them, and on every path releases the
//! artifact lock exactly once; on a failure it records the error with its
//! phase and undoes what ran, so nothing of a failed start runs or is seen.
//! A kill or the deadline ends the start within [`GRACE`] whatever the
//! phase: a phase that honours the stop winds its own work down (runc and
//! CRIU killed, hashing threads stopped between chunks); one that does not
//! is no longer waited for.

use std::future::Future;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::phase::{Phase, PhaseName, Stop};
use crate::error::{Error, Result};

/// How long a stopped phase may take to wind down before the driver stops
/// waiting for it.
pub const GRACE: Duration = Duration::from_millis(500);

/// What the driver does with the start's context at its ends.
#[async_trait]
pub trait Run: Send {
    /// Lets go of the artifact lock: called once per start, on every path.
    fn release_lock(&mut self);
    /// A start that failed in `phase` with `e`, right before its lock
    /// goes: what it read from may be given up first (a restore streamed
    /// from a pull abandons it, so that the pull publishes nothing).
    fn give_up(&mut self, _phase: PhaseName, _e: &Error) {}
    /// `phase` ran (well or not) and took `took`: the times so far, for a
    /// later phase that records them (a capture's manifest).
    fn ran(&mut self, _phase: PhaseName, _took: Duration) {}
    /// Leaves the error record (`vsnap-error.json`) naming `phase`.
    fn record_error(&mut self, phase: PhaseName, e: &Error);
    /// Undoes what the phases did: what runs is killed, runc's state goes.
    async fn abort(&mut self, phase: PhaseName, e: &Error);
}

/// Where the start spent its time, phase by phase.
#[derive(Debug, Default, Clone)]
pub struct Timings(Vec<(PhaseName, Duration)>);

impl Timings {
    /// `phase` took `took` (again).
    pub fn add(&mut self, phase: PhaseName, took: Duration) {
        self.0.push((phase, took));
    }

    pub fn of(&self, phase: PhaseName) -> Duration {
        self.0
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, d)| *d)
            .sum()
    }

    /// Each phase that ran and its time, in order.
    pub fn entries(&self) -> impl Iterator<Item = (PhaseName, Duration)> + '_ {
        self.0.iter().copied()
    }

    #[cfg(test)]
    pub fn phases(&self) -> Vec<PhaseName> {
        self.0.iter().map(|(p, _)| *p).collect()
    }
}

/// A failed start: the phase and its error.
#[derive(Debug)]
pub struct Failed {
    pub phase: PhaseName,
    pub error: Error,
    pub timings: Timings,
}

/// Runs `phases` in order over `cx` within `stop`.
pub async fn drive<Cx: Run>(
    cx: &mut Cx,
    phases: &[&dyn Phase<Cx>],
    stop: &Stop,
    grace: Duration,
) -> std::result::Result<Timings, Failed> {
    let mut timings = Timings::default();
    let mut failed = None;
    for phase in phases {
        let name = phase.name();
        let started = Instant::now();
        let ran = if stop.is_stopped() {
            Err(stop.error(name))
        } else {
            bounded(phase.run(cx, stop), stop, grace, name).await
        };
        let took = started.elapsed();
        timings.0.push((name, took));
        cx.ran(name, took);
        if let Err(e) = ran {
            failed = Some((name, e.in_phase(name.as_str())));
            break;
        }
    }
    if let Some((phase, error)) = &failed {
        cx.give_up(*phase, error);
    }
    cx.release_lock();
    let Some((phase, error)) = failed else {
        return Ok(timings);
    };
    log::error!("{phase}: {error}");
    cx.record_error(phase, &error);
    cx.abort(phase, &error).await;
    Err(Failed {
        phase,
        error,
        timings,
    })
}

/// `work`, until `stop` fires; then `grace` more for it to wind down.
async fn bounded(
    work: impl Future<Output = Result<()>>,
    stop: &Stop,
    grace: Duration,
    name: PhaseName,
) -> Result<()> {
    tokio::pin!(work);
    tokio::select! {
        biased;
        ran = &mut work => return ran,
        () = stop.stopped() => {}
    }
    match tokio::time::timeout(grace, &mut work).await {
        // Its own account of the stop (runc killed, CRIU's log) when it
        // has one; a phase that finished anyway is still stopped.
        Ok(Err(e)) => Err(e),
        Ok(Ok(())) | Err(_) => Err(stop.error(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::Deadline;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};
    use tokio::sync::mpsc;

    /// A start's context that records what the driver did to it.
    #[derive(Default)]
    struct Fake {
        ran: Vec<PhaseName>,
        released: usize,
        recorded: Vec<PhaseName>,
        aborted: Vec<PhaseName>,
        /// The order of the driver's calls at the end.
        ends: Vec<&'static str>,
        /// Told the name of each phase that hangs, polls or waits for the
        /// stop, once it is under way.
        entered: Option<mpsc::UnboundedSender<PhaseName>>,
    }

    impl Fake {
        /// A signal that `phase` is under way, to send from where it waits.
        fn entering(&self, phase: PhaseName) -> impl FnOnce() + Send + 'static {
            let entered = self.entered.clone();
            move || {
                if let Some(tx) = entered {
                    let _ = tx.send(phase);
                }
            }
        }
    }

    #[async_trait]
    impl Run for Fake {
        fn release_lock(&mut self) {
            self.released += 1;
            self.ends.push("release");
        }
        fn give_up(&mut self, _: PhaseName, _: &Error) {
            self.ends.push("give up");
        }
        fn record_error(&mut self, phase: PhaseName, _: &Error) {
            self.recorded.push(phase);
            self.ends.push("record");
        }
        async fn abort(&mut self, phase: PhaseName, _: &Error) {
            self.aborted.push(phase);
            self.ends.push("abort");
        }
    }

    /// How a fake phase behaves.
    #[derive(Clone, Copy, PartialEq)]
    enum Act {
        Succeed,
        Fail,
        /// Never ends and ignores the stop (a wedged call).
        Hang,
        /// Blocking work that polls the stop flag between chunks.
        PollFlag,
        /// Ends with its own cancelled error once stopped.
        HonourStop,
    }

    struct FakePhase(PhaseName, Act);

    #[async_trait]
    impl Phase<Fake> for FakePhase {
        fn name(&self) -> PhaseName {
            self.0
        }
        async fn run(&self, cx: &mut Fake, stop: &Stop) -> Result<()> {
            cx.ran.push(self.0);
            let entered = cx.entering(self.0);
            match self.1 {
                Act::Succeed => Ok(()),
                Act::Fail => Err(Error::FailedPrecondition(format!("{}: broken", self.0))),
                Act::Hang => {
                    entered();
                    std::future::pending().await
                }
                Act::PollFlag => {
                    let flag = stop.flag();
                    tokio::task::spawn_blocking(move || {
                        entered();
                        while !flag.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    })
                    .await
                    .unwrap();
                    Err(Error::Cancelled(format!(
                        "{}: stopped between chunks",
                        self.0
                    )))
                }
                Act::HonourStop => {
                    entered();
                    stop.stopped().await;
                    Err(stop.deadline().fail(format!("{}: wound down", self.0)))
                }
            }
        }
    }

    const RESTORE: [PhaseName; 6] = [
        PhaseName::Verify,
        PhaseName::CriuRestore,
        PhaseName::Restored,
        PhaseName::GpuResume,
        PhaseName::Activation,
        PhaseName::Visible,
    ];

    fn stop_in(d: Duration) -> Stop {
        Stop::new(Deadline::new(Instant::now() + d, "the test's deadline"))
    }

    async fn run_all(
        acts: &[(PhaseName, Act)],
        stop: &Stop,
    ) -> (Fake, std::result::Result<Timings, Failed>) {
        run_in(Fake::default(), acts, stop).await
    }

    /// [`run_all`] over the context `cx`.
    async fn run_in(
        mut cx: Fake,
        acts: &[(PhaseName, Act)],
        stop: &Stop,
    ) -> (Fake, std::result::Result<Timings, Failed>) {
        let phases: Vec<FakePhase> = acts.iter().map(|(n, a)| FakePhase(*n, *a)).collect();
        let refs: Vec<&dyn Phase<Fake>> = phases.iter().map(|p| p as &dyn Phase<Fake>).collect();
        let out = drive(&mut cx, &refs, stop, GRACE).await;
        (cx, out)
    }

    #[tokio::test]
    async fn phases_run_in_order_and_the_lock_goes_once() {
        let acts: Vec<_> = RESTORE.iter().map(|n| (*n, Act::Succeed)).collect();
        let (cx, out) = run_all(&acts, &stop_in(Duration::from_secs(60))).await;
        let timings = out.unwrap();
        assert_eq!(cx.ran, RESTORE);
        assert_eq!(timings.phases(), RESTORE);
        assert_eq!(cx.released, 1);
        assert!(cx.recorded.is_empty() && cx.aborted.is_empty());
    }

    #[tokio::test]
    async fn a_failing_phase_stops_the_rest_records_and_undoes_once() {
        for (i, failing) in RESTORE.iter().enumerate() {
            let acts: Vec<_> = RESTORE
                .iter()
                .map(|n| {
                    (
                        *n,
                        if n == failing {
                            Act::Fail
                        } else {
                            Act::Succeed
                        },
                    )
                })
                .collect();
            let (cx, out) = run_all(&acts, &stop_in(Duration::from_secs(60))).await;
            let failed = out.unwrap_err();
            assert_eq!(failed.phase, *failing);
            assert!(
                failed.error.to_string().contains(failing.as_str()),
                "{}",
                failed.error
            );
            assert_eq!(cx.ran, RESTORE[..=i], "nothing after {failing}");
            assert_eq!(cx.released, 1, "{failing}");
            assert_eq!(cx.recorded, [*failing]);
            assert_eq!(cx.aborted, [*failing]);
            // What is given up is told before the lock goes (a streamed
            // pull's gate); the record exists before the undo publishes
            // the exit.
            assert_eq!(cx.ends, ["give up", "release", "record", "abort"]);
        }
    }

    #[tokio::test]
    async fn a_kill_in_every_phase_ends_the_start_within_a_second() {
        for act in [Act::Hang, Act::PollFlag, Act::HonourStop] {
            for (i, stuck) in RESTORE.iter().enumerate() {
                let acts: Vec<_> = RESTORE
                    .iter()
                    .map(|n| (*n, if n == stuck { act } else { Act::Succeed }))
                    .collect();
                let stop = stop_in(Duration::from_secs(3600));
                let cancel = stop.deadline().cancel.clone();
                let killed = Arc::new(Mutex::new(None));
                let at = killed.clone();
                let (tx, mut entered) = mpsc::unbounded_channel();
                let target = *stuck;
                // The kill lands once the stuck phase is under way.
                let killer = tokio::spawn(async move {
                    while entered.recv().await.is_some_and(|p| p != target) {}
                    *at.lock().unwrap() = Some(Instant::now());
                    cancel.cancel();
                });
                let cx = Fake {
                    entered: Some(tx),
                    ..Fake::default()
                };
                let (cx, out) = run_in(cx, &acts, &stop).await;
                killer.await.unwrap();
                let took = killed.lock().unwrap().unwrap().elapsed();
                assert!(
                    took < Duration::from_secs(1),
                    "{stuck} took {took:?} after the kill"
                );
                let failed = out.unwrap_err();
                assert_eq!(failed.phase, *stuck);
                assert!(
                    matches!(failed.error, Error::Cancelled(_)),
                    "{:?}",
                    failed.error
                );
                assert_eq!(cx.ran, RESTORE[..=i]);
                assert_eq!(cx.released, 1);
                assert_eq!(cx.aborted, [*stuck]);
            }
        }
    }

    #[tokio::test]
    async fn the_deadline_names_the_phase_it_caught() {
        let acts = [
            (PhaseName::CriuRestore, Act::Succeed),
            (PhaseName::Activation, Act::Hang),
            (PhaseName::Visible, Act::Succeed),
        ];
        let (cx, out) = run_all(&acts, &stop_in(Duration::from_millis(100))).await;
        let failed = out.unwrap_err();
        assert_eq!(failed.phase, PhaseName::Activation);
        let text = failed.error.to_string();
        assert!(matches!(failed.error, Error::DeadlineExceeded(_)), "{text}");
        assert!(
            text.contains("restore: activation") && text.contains("the test's deadline"),
            "{text}"
        );
        assert_eq!(cx.released, 1);
    }

    #[tokio::test]
    async fn a_start_stopped_before_a_phase_does_not_run_it() {
        let stop = stop_in(Duration::from_secs(60));
        stop.deadline().cancel.cancel();
        let (cx, out) = run_all(&[(PhaseName::Verify, Act::Succeed)], &stop).await;
        assert!(cx.ran.is_empty());
        assert_eq!(out.unwrap_err().phase, PhaseName::Verify);
        assert_eq!(cx.released, 1);
    }
}
