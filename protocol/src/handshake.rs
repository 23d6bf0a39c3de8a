//! The capturer's half of an activation: activation -> challenge -> release -> status.

use std::time::Instant;

use crate::dir::ControlDir;
use crate::error::{ProtocolError, Result};
use crate::file::Received;
use crate::files;
use crate::messages::{Activation, CaptureReady, Challenge, Schema, Status, StatusPhase};
use crate::wait::{wait_for, wait_until};

/// A completed activation: the engine validated its recovery. Its HTTP listener may still
/// be coming up, so probe it before sending traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct Activated {
    pub challenge: Received<Challenge>,
    pub status: Status,
}

/// Activates the process waiting in `dir` (the donor or a restored copy of `capture`).
///
/// Refuses a directory that already holds activation, challenge, release, status or error
/// files. Then writes activation.json, waits for challenge.json (which must name the same
/// capture and activation), copies it byte for byte to release.json and waits for status
/// "validated", accepting "recovering" on the way. Fails early when the engine writes
/// error.json or exits (`is_alive` returns false), and at `deadline`.
pub fn activate(
    dir: &ControlDir,
    capture: &CaptureReady,
    activation: &Activation,
    deadline: Instant,
    is_alive: &mut dyn FnMut() -> bool,
) -> Result<Activated> {
    let activation_path = dir.file(files::ACTIVATION);
    capture
        .check()
        .map_err(|detail| ProtocolError::invalid(dir.file(files::CAPTURE_READY), detail))?;
    activation
        .check()
        .map_err(|detail| ProtocolError::invalid(&activation_path, detail))?;
    expect_same(
        &activation_path,
        "capture_id",
        &capture.capture_id,
        &activation.capture_id,
    )?;

    dir.validate()?;
    dir.ensure_no_stale_files()?;
    // When the capture's own record is present it must be this capture.
    if let Some(on_disk) = dir.read::<CaptureReady>()? {
        expect_same(
            &on_disk.path,
            "capture_id",
            &capture.capture_id,
            &on_disk.value.capture_id,
        )?;
    }

    dir.write(activation)?;

    let challenge = wait_for::<Challenge>(dir, deadline, is_alive)?;
    expect_same(
        &challenge.path,
        "capture_id",
        &activation.capture_id,
        &challenge.value.capture_id,
    )?;
    expect_same(
        &challenge.path,
        "activation_id",
        &activation.activation_id,
        &challenge.value.activation_id,
    )?;

    dir.write_raw(files::RELEASE, &challenge.bytes)?;

    let status = wait_until::<Status>(dir, deadline, is_alive, |status| {
        expect_same(
            &status.path,
            "capture_id",
            &activation.capture_id,
            &status.value.capture_id,
        )?;
        expect_same(
            &status.path,
            "activation_id",
            &activation.activation_id,
            &status.value.activation_id,
        )?;
        Ok(status.value.phase == StatusPhase::Validated)
    })?;

    Ok(Activated {
        challenge,
        status: status.value,
    })
}

fn expect_same(
    path: &std::path::Path,
    field: &'static str,
    expected: &str,
    got: &str,
) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(ProtocolError::Mismatch {
            path: path.into(),
            field,
            expected: expected.into(),
            got: got.into(),
        })
    }
}
