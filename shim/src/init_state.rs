//! The task state machine: the only writer of a process's status. Every
//! move is a [`Transition`]; a move the state does not allow is refused
//! with the state and the move named, never written.
//!
//! ```text
//!            Start                     Pause
//!  Created ---------------> Running <-------> Paused
//!     |                        ^      Resume
//!   ^ | BeginRestore           | Visible
//!   | v                        |
//!   | Restoring --Restored--> Activating
//!   |     |                        |
//!   +-----+------- Abandon --------+
//!
//!  any state but Stopped --Exit--> Stopped
//! ```
//!
//! Abandon: under `auto`, a restore that failed is given up for a cold
//! start in the same Start (a capture's spec, or the container's own): the
//! init is made anew (a fresh pid) and started.
//!
//! Restoring: runc and CRIU are restoring the init (no pid of it yet).
//! Activating: the restored init exists (its pid is known) but is not
//! visible: its engine has not yet reproduced its canary. containerd sees
//! both as CREATED; only Running is RUNNING.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Created,
    Restoring,
    Activating,
    Running,
    Paused,
    Stopped,
}

/// A move of the state machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// `runc start` (or `runc exec`) ran.
    Start,
    /// A restore begins: runc and CRIU are about to run.
    BeginRestore,
    /// runc restore returned and the restored init's pid is known.
    Restored,
    /// The restored copy proved itself: it counts as running.
    Visible,
    /// The restore failed and is given up for a cold start: the init is
    /// to be created anew.
    Abandon,
    Pause,
    Resume,
    /// The process exited (or was recorded as killed).
    Exit,
}

/// A transition the state does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a process that is {from} cannot take {via:?}")]
pub struct Illegal {
    pub from: Status,
    pub via: Transition,
}

impl Status {
    /// The state after `via`, or why not.
    pub fn next(self, via: Transition) -> Result<Status, Illegal> {
        use Status::*;
        use Transition::*;
        let to = match (self, via) {
            (Created, Start) => Running,
            (Created, BeginRestore) => Restoring,
            (Restoring, Restored) => Activating,
            (Activating, Visible) => Running,
            (Restoring | Activating, Abandon) => Created,
            (Running, Pause) => Paused,
            (Paused, Resume) => Running,
            (Stopped, Exit) => return Err(Illegal { from: self, via }),
            (_, Exit) => Stopped,
            _ => return Err(Illegal { from: self, via }),
        };
        Ok(to)
    }

    /// Whether its processes run (or are held) and so keep it from delete.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            Status::Running | Status::Paused | Status::Restoring | Status::Activating
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Created => "created",
            Status::Restoring => "restoring",
            Status::Activating => "activating",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Status::*;
    use super::Transition::*;
    use super::*;

    const ALL: [Status; 6] = [Created, Restoring, Activating, Running, Paused, Stopped];
    const MOVES: [Transition; 8] = [
        Start,
        BeginRestore,
        Restored,
        Visible,
        Abandon,
        Pause,
        Resume,
        Exit,
    ];

    #[test]
    fn a_plain_start_and_a_restore_reach_running() {
        assert_eq!(Created.next(Start), Ok(Running));
        let restored = Created
            .next(BeginRestore)
            .and_then(|s| s.next(Restored))
            .and_then(|s| s.next(Visible));
        assert_eq!(restored, Ok(Running));
        assert_eq!(
            Running.next(Pause).and_then(|s| s.next(Resume)),
            Ok(Running)
        );
    }

    #[test]
    fn a_restore_given_up_is_created_anew_and_then_starts() {
        for failed in [Restoring, Activating] {
            let cold = failed.next(Abandon).and_then(|s| s.next(Start));
            assert_eq!(cold, Ok(Running), "{failed}");
        }
    }

    #[test]
    fn illegal_transitions_are_refused_with_both_named() {
        // A restored copy is never visible before its pid is known, a
        // plain start never runs twice, a stopped process never moves.
        for (from, via) in [
            (Restoring, Visible),
            (Created, Visible),
            (Running, Start),
            (Activating, Start),
            (Restoring, Start),
            (Paused, Start),
            (Running, BeginRestore),
            (Created, Pause),
            (Activating, Pause),
            (Stopped, Exit),
            (Stopped, Resume),
            // Only a restore is given up, and never once it is visible.
            (Created, Abandon),
            (Running, Abandon),
            (Paused, Abandon),
        ] {
            let e = from.next(via).unwrap_err();
            assert_eq!(e, Illegal { from, via });
            let text = e.to_string();
            assert!(text.contains(&from.to_string()), "{text}");
            assert!(text.contains(&format!("{via:?}")), "{text}");
        }
    }

    #[test]
    fn every_state_but_stopped_can_exit_and_stopped_is_final() {
        for s in ALL {
            match s {
                Stopped => {
                    for m in MOVES {
                        assert!(Stopped.next(m).is_err(), "{m:?}");
                    }
                }
                s => assert_eq!(s.next(Exit), Ok(Stopped), "{s}"),
            }
        }
    }

    #[test]
    fn exactly_the_drawn_edges_are_legal() {
        let legal: usize = ALL
            .iter()
            .map(|s| MOVES.iter().filter(|m| s.next(**m).is_ok()).count())
            .sum();
        // 8 edges of the picture (Abandon from two states) plus Exit from
        // the 5 states that are not Stopped.
        assert_eq!(legal, 8 + 5);
    }
}
