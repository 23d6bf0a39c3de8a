//! Startup mode: vLLM's external startup capture over a control dir.
//!
//! ```text
//! initialize -> reference canary -> release -> rehearsal (reload, canary, release)
//!   -> capture-ready.json -> [checkpoint happens here] -> activation.json
//!   -> challenge.json -> release.json -> status recovering -> reload -> canary
//!   -> identity.json applied (when present) -> status validated -> bind HTTP
//! ```

use std::process;
use std::time::Duration;

use vsnap_protocol::{
    files, new_uuid4_hex, parse, wait_for_capturer, Activation, ActivationKind, CaptureReady,
    Challenge, ControlDir, Expect, Identity, Oracle, ProtocolError, Status, StatusPhase,
    PROTOCOL_VERSION,
};

use crate::cli::{Options, SnapshotConfig};
use crate::engine::EngineConfig;
use crate::failure::Failure;
use crate::faults::Faults;
use crate::session::Session;
use crate::{bind, log, serve};

pub fn run(
    config: &SnapshotConfig,
    options: &Options,
    engine_config: EngineConfig,
    faults: Faults,
) -> ! {
    // A directory that breaks the rules is not ours to write error.json into.
    let dir = match ControlDir::open(&config.control_dir, Expect::Empty) {
        Ok(dir) => dir,
        Err(e) => {
            log(&format!("refusing control dir: {e}"));
            process::exit(1);
        }
    };
    let capture_id = match new_uuid4_hex() {
        Ok(id) => id,
        Err(e) => {
            log(&format!("cannot read /dev/urandom: {e}"));
            process::exit(1);
        }
    };
    let session = Session::with_control_dir(faults, dir.clone(), capture_id.clone());

    let (mut engine, oracle) = crate::session::prepare_for_capture(&session, engine_config);
    session.phase("prepare", || {
        dir.write(&CaptureReady {
            capture_id: capture_id.clone(),
            oracle: oracle.clone(),
            pid: process::id(),
            version: PROTOCOL_VERSION,
        })?;
        Ok(())
    });
    log("capture-ready.json written; waiting for activation.json");

    let activation = session.phase("capture barrier", || {
        await_activation(&session, &dir, &capture_id, config.timeout)
    });
    log(&format!(
        "activation {} ({}) released",
        activation.activation_id, activation.kind
    ));

    let status = |phase| Status {
        activation_id: activation.activation_id.clone(),
        capture_id: capture_id.clone(),
        phase,
    };
    session.phase("recover", || {
        dir.write(&status(StatusPhase::Recovering))?;
        Ok(())
    });
    session.phase("recovery: restore memory", || engine.load());
    session.phase("recovery: connections", || {
        session.faults().check_resources()
    });
    session.phase("recovery: canary", || {
        let mut canary = engine.canary()?;
        if activation.kind == ActivationKind::Copy {
            canary = session.faults().drifted(canary);
        }
        check_recovered(&oracle, &canary)
    });
    // Only now, with the donor's answer reproduced from the donor's state, become this
    // process's own (identity.json is absent when the capturer predates it).
    session.phase("recovery: identity", || {
        if let Some(identity) = dir.read::<Identity>()? {
            engine.userspace().apply(identity.value);
        }
        dir.write(&status(StatusPhase::Validated))?;
        Ok(())
    });
    let listener = session.phase("serve", || {
        bind(activation.host.as_deref(), activation.port)
    });
    serve(listener, &engine, options)
}

/// The engine's half of the handshake: accept one activation for this capture, challenge
/// it with a nonce drawn now (so no checkpoint image holds it), and wait for the release
/// that proves the capturer saw this very challenge.
fn await_activation(
    session: &Session,
    dir: &ControlDir,
    capture_id: &str,
    timeout: Duration,
) -> Result<Activation, Failure> {
    let activation_path = dir.file(files::ACTIVATION);
    let activation_bytes = wait_for_capturer(dir, files::ACTIVATION, timeout)?;
    let activation: Activation = parse(&activation_path, &activation_bytes)?;
    session.set_activation_id(&activation.activation_id);
    if activation.capture_id != capture_id {
        return Err(ProtocolError::Mismatch {
            path: activation_path,
            field: "capture_id",
            expected: capture_id.into(),
            got: activation.capture_id,
        }
        .into());
    }
    // Another process already used this directory: we are a copy looking at a stale one.
    let stale: Vec<&str> = dir
        .stale_files()?
        .into_iter()
        .filter(|name| *name != files::ACTIVATION)
        .collect();
    if !stale.is_empty() {
        return Err(ProtocolError::StaleFiles {
            path: dir.path().into(),
            files: stale.join(", "),
        }
        .into());
    }

    let nonce =
        new_uuid4_hex().map_err(|e| Failure::engine(format!("cannot read /dev/urandom: {e}")))?;
    let challenge = dir.write(&Challenge {
        activation_id: activation.activation_id.clone(),
        capture_id: capture_id.into(),
        nonce,
        version: PROTOCOL_VERSION,
    })?;

    let release = wait_for_capturer(dir, files::RELEASE, timeout)?;
    if release != challenge {
        return Err(ProtocolError::Invalid {
            path: dir.file(files::RELEASE),
            detail: "does not equal challenge.json byte for byte".into(),
        }
        .into());
    }
    if dir.read_raw(files::ACTIVATION)?.as_deref() != Some(&activation_bytes[..]) {
        return Err(Failure::new(
            "ProtocolError",
            format!(
                "{}: changed after the challenge was written",
                activation_path.display()
            ),
        ));
    }
    Ok(activation)
}

fn check_recovered(oracle: &Oracle, canary: &Oracle) -> Result<(), Failure> {
    Ok(oracle.check_matches(canary, "recovery canary")?)
}
