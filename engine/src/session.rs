//! Runs the engine's phases: logs each one, applies injected faults, and turns a failure
//! into error.json (when there is a control dir) and a non-zero exit.

use std::cell::RefCell;
use std::process;
use std::thread;
use std::time::Duration;

use vsnap_protocol::{ControlDir, ErrorRecord, Oracle};

use crate::engine::{Engine, EngineConfig};

use crate::failure::Failure;
use crate::faults::{Faults, Injected};
use crate::log;

/// Where failures are reported besides stderr.
struct ControlDirReport {
    dir: ControlDir,
    capture_id: String,
    activation_id: RefCell<Option<String>>,
}

pub struct Session {
    faults: Faults,
    report: Option<ControlDirReport>,
}

impl Session {
    /// A session without a control dir (plain and barrier modes): failures go to stderr.
    pub fn standalone(faults: Faults) -> Self {
        Session {
            faults,
            report: None,
        }
    }

    /// A session that reports failures in `dir`'s error.json.
    pub fn with_control_dir(faults: Faults, dir: ControlDir, capture_id: String) -> Self {
        Session {
            faults,
            report: Some(ControlDirReport {
                dir,
                capture_id,
                activation_id: RefCell::new(None),
            }),
        }
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Records the activation being served, for later error records.
    pub fn set_activation_id(&self, id: &str) {
        if let Some(report) = &self.report {
            *report.activation_id.borrow_mut() = Some(id.to_string());
        }
    }

    /// Runs one phase. Never returns on failure.
    pub fn phase<T>(&self, name: &str, work: impl FnOnce() -> Result<T, Failure>) -> T {
        log(&format!("phase {name}"));
        let injected = Failure::new(
            "InjectedFailure",
            format!("injected failure in phase {name}"),
        );
        match self.faults.on_enter(name) {
            Injected::None => {}
            Injected::ExitSilently => {
                log(&format!(
                    "exiting without error.json in phase {name} (injected)"
                ));
                process::exit(3);
            }
            Injected::Hang => {
                log(&format!("hanging in phase {name} (injected)"));
                hang();
            }
            Injected::ReportAndHang => {
                self.report(name, &injected);
                log(&format!(
                    "hanging after error.json in phase {name} (injected)"
                ));
                hang();
            }
            Injected::Fail => self.fail(name, injected),
        }
        match work() {
            Ok(value) => value,
            Err(failure) => self.fail(name, failure),
        }
    }

    /// Reports a failure and exits 1 (after the injected teardown time).
    pub fn fail(&self, phase: &str, failure: Failure) -> ! {
        self.report(phase, &failure);
        if let Some(delay) = self.faults.exit_delay {
            std::thread::sleep(delay);
        }
        process::exit(1);
    }

    fn report(&self, phase: &str, failure: &Failure) {
        log(&format!("failed in phase {phase}: {failure}"));
        let Some(report) = &self.report else {
            return;
        };
        let record = ErrorRecord {
            activation_id: report.activation_id.borrow().clone(),
            capture_id: report.capture_id.clone(),
            error: failure.message.clone(),
            error_type: failure.error_type.to_string(),
            phase: phase.to_string(),
        };
        // Best effort: the directory itself may be what is broken.
        if let Err(e) = report.dir.write(&record) {
            log(&format!("could not write error.json: {e}"));
        }
    }
}

fn hang() -> ! {
    loop {
        thread::sleep(Duration::from_secs(3600));
    }
}

/// What both protocols do before they signal readiness: initialize, run the
/// private canary, release the reloadable state, rehearse (reload, canary must
/// match) and release again. Returns the engine and its canary oracle.
pub fn prepare_for_capture(session: &Session, engine_config: EngineConfig) -> (Engine, Oracle) {
    let mut engine = session.phase("initialize engine", || {
        session.faults().hold_resources()?;
        Engine::initialize(engine_config)
    });
    let oracle = session.phase("reference canary", || engine.canary());
    session.phase("release memory", || {
        engine.release();
        Ok(())
    });
    session.phase("rehearsal: restore memory", || engine.load());
    session.phase("rehearsal: canary", || {
        Ok(oracle.check_matches(&engine.canary()?, "rehearsal canary")?)
    });
    session.phase("rehearsal: release memory", || {
        engine.release();
        Ok(())
    });
    (engine, oracle)
}
