//! The capturer's handshake (`activate`) against a scripted engine running in a thread.

mod common;

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{capture_ready, TempDir, NONCE, OTHER_CAPTURE_ID};
use vsnap_protocol::{
    activate, files, parse, wait_for_capturer, Activation, ActivationKind, CaptureReady, Challenge,
    ControlDir, ErrorRecord, ProtocolError, Status, StatusPhase, PROTOCOL_VERSION,
};

/// How the scripted engine behaves after it reads the activation.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    Cooperate,
    ChallengeForOtherCapture,
    ChallengeForOtherActivation,
    FailInRecovery,
    ExitSilently,
    StatusForOtherActivation,
}

struct Engine {
    alive: Arc<AtomicBool>,
    capturer: Capturer,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    fn start(dir: &ControlDir, script: Script) -> Self {
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let capturer = Capturer::default();
        let seen = capturer.clone();
        let dir = dir.clone();
        let thread = thread::spawn(move || {
            play(&dir, script, &seen);
            flag.store(false, Ordering::SeqCst);
        });
        Engine {
            alive,
            capturer,
            thread: Some(thread),
        }
    }

    /// The capturer's liveness check, counted: it asks once per poll,
    /// after its look at the file it waits for.
    fn is_alive(&self) -> impl FnMut() -> bool {
        let alive = self.alive.clone();
        let polls = self.capturer.polls.clone();
        move || {
            polls.fetch_add(1, Ordering::SeqCst);
            alive.load(Ordering::SeqCst)
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.capturer.finished.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the scripted engine sees of the capturer: its polls so far, and
/// whether it has returned.
#[derive(Clone, Default)]
struct Capturer {
    polls: Arc<AtomicUsize>,
    finished: Arc<AtomicBool>,
}

impl Capturer {
    /// Waits until the capturer has looked at the control dir since now:
    /// a poll that began after this call has ended once it asks whether
    /// the engine is alive for the second time from here. Ends too when
    /// the capturer has returned (a status it refused), or after 10 s.
    fn wait_for_a_look(&self) {
        let from = self.polls.load(Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.polls.load(Ordering::SeqCst) < from + 2
            && !self.finished.load(Ordering::SeqCst)
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

fn play(dir: &ControlDir, script: Script, capturer: &Capturer) {
    let timeout = Duration::from_secs(3);
    let Ok(bytes) = wait_for_capturer(dir, files::ACTIVATION, timeout) else {
        return;
    };
    let activation: Activation = parse(&dir.file(files::ACTIVATION), &bytes).unwrap();
    let mut challenge = Challenge {
        activation_id: activation.activation_id.clone(),
        capture_id: activation.capture_id.clone(),
        nonce: NONCE.into(),
        version: PROTOCOL_VERSION,
    };
    match script {
        Script::ChallengeForOtherCapture => challenge.capture_id = OTHER_CAPTURE_ID.into(),
        Script::ChallengeForOtherActivation => challenge.activation_id = "someone-else".into(),
        Script::ExitSilently => return,
        _ => {}
    }
    let written = dir.write(&challenge).unwrap();
    let Ok(release) = wait_for_capturer(dir, files::RELEASE, timeout) else {
        return;
    };
    assert_eq!(
        release, written,
        "release must copy the challenge byte for byte"
    );
    let mut status = Status {
        activation_id: activation.activation_id.clone(),
        capture_id: activation.capture_id.clone(),
        phase: StatusPhase::Recovering,
    };
    if script == Script::StatusForOtherActivation {
        status.activation_id = "someone-else".into();
    }
    dir.write(&status).unwrap();
    // Recovering until the capturer has seen it recovering.
    capturer.wait_for_a_look();
    if script == Script::FailInRecovery {
        dir.write(&ErrorRecord {
            activation_id: Some(activation.activation_id),
            capture_id: activation.capture_id,
            error: "canary mismatch".into(),
            error_type: "CanaryMismatch".into(),
            phase: "recovery: canary".into(),
        })
        .unwrap();
        return;
    }
    status.phase = StatusPhase::Validated;
    dir.write(&status).unwrap();
}

/// A control dir as a capture leaves it: only capture-ready.json.
fn captured_dir(tmp: &TempDir) -> (ControlDir, CaptureReady) {
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    let ready = capture_ready();
    dir.write(&ready).unwrap();
    (dir, ready)
}

fn run(
    dir: &ControlDir,
    ready: &CaptureReady,
    script: Script,
) -> Result<vsnap_protocol::Activated, ProtocolError> {
    let engine = Engine::start(dir, script);
    let activation = Activation::new(ready, "copy-1", ActivationKind::Copy, None, 8000);
    let deadline = Instant::now() + Duration::from_secs(10);
    activate(dir, ready, &activation, deadline, &mut engine.is_alive())
}

#[test]
fn cooperating_engine_is_activated() {
    let tmp = TempDir::new("hs-ok");
    let (dir, ready) = captured_dir(&tmp);
    let done = run(&dir, &ready, Script::Cooperate).unwrap();
    assert_eq!(done.status.phase, StatusPhase::Validated);
    assert_eq!(done.challenge.value.nonce, NONCE);
    assert_eq!(
        fs::read(dir.file(files::RELEASE)).unwrap(),
        fs::read(dir.file(files::CHALLENGE)).unwrap()
    );
    let activation = fs::read_to_string(dir.file(files::ACTIVATION)).unwrap();
    assert!(
        activation.starts_with(r#"{"activation_id":"copy-1","capture_id":"#),
        "{activation}"
    );
}

#[test]
fn stale_files_refuse_the_activation_before_anything_is_written() {
    for stale in [
        "activation.json",
        "challenge.json",
        "release.json",
        "status.json",
        "error.json",
    ] {
        let tmp = TempDir::new("hs-stale");
        let (dir, ready) = captured_dir(&tmp);
        fs::write(dir.file(stale), b"{}").unwrap();
        let activation = Activation::new(&ready, "copy-1", ActivationKind::Copy, None, 8000);
        let err = activate(&dir, &ready, &activation, Instant::now(), &mut || true).unwrap_err();
        assert!(
            matches!(err, ProtocolError::StaleFiles { .. }),
            "{stale}: {err}"
        );
        assert!(err.to_string().contains(stale), "{err}");
        let mut expected = vec!["capture-ready.json".to_string(), stale.to_string()];
        expected.sort();
        assert_eq!(dir.entries().unwrap(), expected);
    }
}

#[test]
fn challenge_for_another_capture_is_refused() {
    let tmp = TempDir::new("hs-cap");
    let (dir, ready) = captured_dir(&tmp);
    let err = run(&dir, &ready, Script::ChallengeForOtherCapture).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: capture_id mismatch: expected {}, got {OTHER_CAPTURE_ID}",
            dir.file(files::CHALLENGE).display(),
            ready.capture_id
        )
    );
    assert!(
        !dir.file(files::RELEASE).exists(),
        "no release for a foreign challenge"
    );
}

#[test]
fn challenge_for_another_activation_is_refused() {
    let tmp = TempDir::new("hs-act");
    let (dir, ready) = captured_dir(&tmp);
    let err = run(&dir, &ready, Script::ChallengeForOtherActivation).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("activation_id mismatch: expected copy-1, got someone-else"),
        "{err}"
    );
}

#[test]
fn status_for_another_activation_is_refused() {
    let tmp = TempDir::new("hs-status");
    let (dir, ready) = captured_dir(&tmp);
    let err = run(&dir, &ready, Script::StatusForOtherActivation).unwrap_err();
    assert!(
        err.to_string()
            .contains("status.json: activation_id mismatch"),
        "{err}"
    );
}

#[test]
fn engine_error_record_ends_the_wait() {
    let tmp = TempDir::new("hs-error");
    let (dir, ready) = captured_dir(&tmp);
    let err = run(&dir, &ready, Script::FailInRecovery).unwrap_err();
    let record = err.engine_record().expect("engine record");
    assert_eq!(record.phase, "recovery: canary");
    assert!(
        err.to_string().ends_with(
            "error.json: engine failed in phase \"recovery: canary\": CanaryMismatch: canary mismatch"
        ),
        "{err}"
    );
}

#[test]
fn engine_exit_without_error_file_ends_the_wait() {
    let tmp = TempDir::new("hs-exit");
    let (dir, ready) = captured_dir(&tmp);
    let err = run(&dir, &ready, Script::ExitSilently).unwrap_err();
    assert!(matches!(err, ProtocolError::EngineExited { .. }), "{err:?}");
    assert!(
        err.to_string()
            .ends_with("engine exited without error.json"),
        "{err}"
    );
}

#[test]
fn silent_engine_times_out() {
    let tmp = TempDir::new("hs-timeout");
    let (dir, ready) = captured_dir(&tmp);
    let activation = Activation::new(&ready, "copy-1", ActivationKind::Donor, None, 8000);
    let deadline = Instant::now() + Duration::from_millis(200);
    let err = activate(&dir, &ready, &activation, deadline, &mut || true).unwrap_err();
    assert!(
        err.to_string().contains("challenge.json: timed out after"),
        "{err}"
    );
}

#[test]
fn activation_for_another_capture_is_refused() {
    let tmp = TempDir::new("hs-wrongcap");
    let (dir, ready) = captured_dir(&tmp);
    let mut activation = Activation::new(&ready, "copy-1", ActivationKind::Copy, None, 8000);
    activation.capture_id = OTHER_CAPTURE_ID.into();
    let err = activate(&dir, &ready, &activation, Instant::now(), &mut || true).unwrap_err();
    assert!(
        err.to_string()
            .contains("activation.json: capture_id mismatch"),
        "{err}"
    );
}

#[test]
fn control_dir_of_another_capture_is_refused() {
    let tmp = TempDir::new("hs-otherdir");
    let (dir, _) = captured_dir(&tmp);
    let mut other = capture_ready();
    other.capture_id = OTHER_CAPTURE_ID.into();
    let activation = Activation::new(&other, "copy-1", ActivationKind::Copy, None, 8000);
    let err = activate(&dir, &other, &activation, Instant::now(), &mut || true).unwrap_err();
    assert!(
        err.to_string()
            .contains("capture-ready.json: capture_id mismatch"),
        "{err}"
    );
    assert!(!dir.file(files::ACTIVATION).exists());
}

#[test]
fn invalid_activation_is_not_written() {
    let tmp = TempDir::new("hs-invalid");
    let (dir, ready) = captured_dir(&tmp);
    let activation = Activation::new(&ready, "bad id", ActivationKind::Copy, None, 8000);
    let err = activate(&dir, &ready, &activation, Instant::now(), &mut || true).unwrap_err();
    assert!(
        err.to_string().contains("activation_id \"bad id\""),
        "{err}"
    );
    assert!(!Path::new(&dir.file(files::ACTIVATION)).exists());
}
