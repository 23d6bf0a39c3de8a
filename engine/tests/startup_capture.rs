//! The reference engine as a host process, driven through the control-dir protocol by
//! vsnap-protocol's capturer side, and through the released-vLLM barrier.

use std::fs::{self, DirBuilder, File};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vsnap_protocol::{
    abort_release, activate, release, release_for, wait_for, wait_ready, Activation,
    ActivationKind, CaptureReady, ControlDir, Identity, Oracle, ProtocolError, Received,
};

const ENGINE: &str = env!("CARGO_BIN_EXE_vsnap-ref-engine");
const WAIT: Duration = Duration::from_secs(60);

/// A fresh 0700 directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "vsnap-engine-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        DirBuilder::new().mode(0o700).create(&path).unwrap();
        TempDir(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A running engine; killed (by pid) and reaped on drop.
struct Engine {
    child: Child,
    log: PathBuf,
}

impl Engine {
    fn spawn(log: PathBuf, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(ENGINE);
        command
            .args(args)
            .env_remove("VSNAP_SNAPSHOT_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        for (key, value) in env {
            command.env(key, value);
        }
        Engine {
            child: command.spawn().unwrap(),
            log,
        }
    }

    /// Startup mode with a fresh control dir `control` under `tmp`.
    fn startup(tmp: &TempDir, env: &[(&str, &str)]) -> (Self, ControlDir) {
        let dir = ControlDir::create(tmp.join("control")).unwrap();
        let config = json!({
            "mode": "startup",
            "control_dir": dir.path(),
            "timeout_s": 60.0,
        })
        .to_string();
        let engine = Engine::spawn(tmp.join("engine.log"), &["--snapshot-config", &config], env);
        (engine, dir)
    }

    fn plain(tmp: &TempDir, port: u16) -> Self {
        let port = port.to_string();
        Engine::spawn(
            tmp.join("plain.log"),
            &["--host", "127.0.0.1", "--port", &port],
            &[],
        )
    }

    fn is_alive(&mut self) -> impl FnMut() -> bool + '_ {
        move || matches!(self.child.try_wait(), Ok(None))
    }

    fn wait_capture_ready(&mut self, dir: &ControlDir) -> CaptureReady {
        let deadline = Instant::now() + WAIT;
        let result = wait_for::<CaptureReady>(dir, deadline, &mut self.is_alive());
        match result {
            Ok(ready) => ready.value,
            Err(e) => panic!("capture-ready.json: {e}\n{}", self.log()),
        }
    }

    fn activate(
        &mut self,
        dir: &ControlDir,
        ready: &CaptureReady,
        id: &str,
        kind: ActivationKind,
        port: u16,
    ) -> Result<(), ProtocolError> {
        let activation = Activation::new(ready, id, kind, Some("127.0.0.1".into()), port);
        let deadline = Instant::now() + WAIT;
        activate(dir, ready, &activation, deadline, &mut self.is_alive()).map(|_| ())
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "engine did not exit\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        format!(
            "--- engine log ---\n{}",
            fs::read_to_string(&self.log).unwrap_or_default()
        )
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP exchange; retries the connection while the listener comes up.
fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, Value) {
    let deadline = Instant::now() + WAIT;
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connect 127.0.0.1:{port}: {e}"),
        }
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn complete(port: u16, prompt: &str, max_tokens: u32) -> Value {
    let body = json!({
        "model": "vsnap-ref",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "return_token_ids": true,
    });
    let (status, reply) = http(port, "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    reply["choices"][0].clone()
}

/// The public canary check of the protocol, over HTTP.
fn http_canary(port: u16) -> Oracle {
    let body = json!({
        "model": "vsnap-ref", "prompt": "The capital of France is", "min_tokens": 1,
        "max_tokens": 1, "temperature": 0, "seed": 0, "logprobs": 0, "return_token_ids": true,
    });
    let (status, reply) = http(port, "POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    Oracle {
        sampled_token_logprob: choice["logprobs"]["token_logprobs"][0].as_f64().unwrap(),
        text: choice["text"].as_str().unwrap().into(),
        token_ids: serde_json::from_value(choice["token_ids"].clone()).unwrap(),
    }
}

const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "Hello, world",
    "def main():\n    return",
    "Snapshots restore state exactly",
];

#[test]
fn donor_and_copy_answer_exactly_like_a_cold_engine() {
    let tmp_a = TempDir::new("donor");
    let (mut donor, donor_dir) = Engine::startup(&tmp_a, &[("VSNAP_ENGINE_STATE_MB", "4")]);
    let ready = donor.wait_capture_ready(&donor_dir);
    assert_eq!(ready.pid, donor.child.id());
    let donor_port = free_port();
    if let Err(e) = donor.activate(
        &donor_dir,
        &ready,
        "donor-1",
        ActivationKind::Donor,
        donor_port,
    ) {
        panic!("donor activation: {e}\n{}", donor.log());
    }
    ready
        .oracle
        .check_matches(&http_canary(donor_port), "donor http canary")
        .unwrap();

    // Without CRIU a copy is a second engine started the same way: its oracle must be
    // identical, and its control dir holds only capture-ready.json, as after a restore.
    let tmp_b = TempDir::new("copy");
    let (mut copy, copy_dir) = Engine::startup(&tmp_b, &[("VSNAP_ENGINE_STATE_MB", "4")]);
    let copy_ready = copy.wait_capture_ready(&copy_dir);
    assert_ne!(copy_ready.capture_id, ready.capture_id);
    assert_eq!(copy_ready.oracle, ready.oracle);
    assert_eq!(copy_dir.entries().unwrap(), vec!["capture-ready.json"]);
    let copy_port = free_port();
    if let Err(e) = copy.activate(
        &copy_dir,
        &copy_ready,
        "copy-1",
        ActivationKind::Copy,
        copy_port,
    ) {
        panic!("copy activation: {e}\n{}", copy.log());
    }

    let tmp_c = TempDir::new("cold");
    let cold_port = free_port();
    let _cold = Engine::plain(&tmp_c, cold_port);

    for prompt in PROMPTS {
        let cold = complete(cold_port, prompt, 8);
        assert_eq!(
            complete(copy_port, prompt, 8),
            cold,
            "copy vs cold for {prompt:?}"
        );
        assert_eq!(
            complete(donor_port, prompt, 8),
            cold,
            "donor vs cold for {prompt:?}"
        );
    }
    let (status, _) = http(copy_port, "GET", "/health", "");
    assert_eq!(status, 200);
}

#[test]
fn canary_drift_on_a_copy_fails_the_activation() {
    let tmp = TempDir::new("drift");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_CANARY_DRIFT", "1")]);
    let ready = engine.wait_capture_ready(&dir);
    let err = engine
        .activate(&dir, &ready, "copy-1", ActivationKind::Copy, free_port())
        .unwrap_err();
    let record = err.engine_record().unwrap_or_else(|| panic!("{err}"));
    assert_eq!(record.phase, "recovery: canary");
    assert_eq!(record.error_type, "CanaryMismatch");
    assert_eq!(record.activation_id.as_deref(), Some("copy-1"));
    let text = err.to_string();
    assert!(
        text.contains("canary mismatch: sampled_token_logprob"),
        "{text}"
    );
    assert_eq!(engine.wait_exit().code(), Some(1));
}

#[test]
fn token_drift_on_a_copy_names_both_tokens() {
    let tmp = TempDir::new("drift-token");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_CANARY_DRIFT", "token")]);
    let ready = engine.wait_capture_ready(&dir);
    let err = engine
        .activate(&dir, &ready, "copy-1", ActivationKind::Copy, free_port())
        .unwrap_err();
    let expected = format!("!= oracle {:?}", ready.oracle.token_ids);
    assert!(err.to_string().contains(&expected), "{err}");
}

#[test]
fn canary_drift_spares_the_donor() {
    let tmp = TempDir::new("drift-donor");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_CANARY_DRIFT", "1")]);
    let ready = engine.wait_capture_ready(&dir);
    let port = free_port();
    engine
        .activate(&dir, &ready, "donor", ActivationKind::Donor, port)
        .unwrap();
    ready
        .oracle
        .check_matches(&http_canary(port), "http")
        .unwrap();
}

#[test]
fn crash_in_recover_reports_the_engine_phase() {
    let tmp = TempDir::new("crash");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_FAIL_PHASE", "recover")]);
    let ready = engine.wait_capture_ready(&dir);
    let err = engine
        .activate(&dir, &ready, "copy-1", ActivationKind::Copy, free_port())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("engine failed in phase \"recover\": InjectedFailure"),
        "{err}"
    );
    assert_eq!(engine.wait_exit().code(), Some(1));
}

#[test]
fn silent_exit_is_reported_as_exit_without_error_json() {
    let tmp = TempDir::new("silent");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_EXIT_SILENT", "recover")]);
    let ready = engine.wait_capture_ready(&dir);
    let err = engine
        .activate(&dir, &ready, "copy-1", ActivationKind::Copy, free_port())
        .unwrap_err();
    assert!(matches!(err, ProtocolError::EngineExited { .. }), "{err:?}");
    assert!(
        err.to_string()
            .ends_with("engine exited without error.json"),
        "{err}"
    );
    assert_eq!(engine.wait_exit().code(), Some(3));
}

#[test]
fn error_without_exit_still_ends_the_activation() {
    let tmp = TempDir::new("noexit");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_ERROR_NO_EXIT", "recovery")]);
    let ready = engine.wait_capture_ready(&dir);
    let err = engine
        .activate(&dir, &ready, "copy-1", ActivationKind::Copy, free_port())
        .unwrap_err();
    assert_eq!(
        err.engine_record().unwrap().phase,
        "recovery: restore memory"
    );
    assert!(engine.is_alive()(), "the engine keeps running");
}

#[test]
fn hang_in_recovery_times_out() {
    let tmp = TempDir::new("hang");
    let (mut engine, dir) = Engine::startup(&tmp, &[("VSNAP_ENGINE_HANG_PHASE", "recover")]);
    let ready = engine.wait_capture_ready(&dir);
    let activation = Activation::new(&ready, "copy-1", ActivationKind::Copy, None, free_port());
    let deadline = Instant::now() + Duration::from_secs(2);
    let err = activate(&dir, &ready, &activation, deadline, &mut engine.is_alive()).unwrap_err();
    assert!(err.to_string().contains("status.json: timed out"), "{err}");
}

#[test]
fn failure_before_capture_is_reported_without_activation_id() {
    let tmp = TempDir::new("early");
    let (mut engine, dir) =
        Engine::startup(&tmp, &[("VSNAP_ENGINE_FAIL_PHASE", "reference canary")]);
    let err =
        wait_for::<CaptureReady>(&dir, Instant::now() + WAIT, &mut engine.is_alive()).unwrap_err();
    let record = err.engine_record().unwrap_or_else(|| panic!("{err}"));
    assert_eq!(record.phase, "reference canary");
    assert_eq!(record.activation_id, None);
}

#[test]
fn engine_refuses_a_non_empty_control_dir() {
    let tmp = TempDir::new("nonempty");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    fs::write(dir.file("leftover"), b"x").unwrap();
    let config = json!({"mode": "startup", "control_dir": dir.path()}).to_string();
    let mut engine = Engine::spawn(tmp.join("engine.log"), &["--snapshot-config", &config], &[]);
    assert_eq!(engine.wait_exit().code(), Some(1));
    assert!(
        engine.log().contains("not empty (holds leftover)"),
        "{}",
        engine.log()
    );
    assert_eq!(dir.entries().unwrap(), vec!["leftover"]);
}

#[test]
fn engine_refuses_an_activation_next_to_stale_files() {
    let tmp = TempDir::new("stale");
    let (mut engine, dir) = Engine::startup(&tmp, &[]);
    let ready = engine.wait_capture_ready(&dir);
    // Bypass the capturer's own check to see the engine's.
    dir.write_raw("status.json", b"{}").unwrap();
    let activation = Activation::new(&ready, "copy-1", ActivationKind::Copy, None, 1);
    dir.write(&activation).unwrap();
    assert_eq!(engine.wait_exit().code(), Some(1));
    let record: Received<vsnap_protocol::ErrorRecord> = dir.read().unwrap().unwrap();
    assert_eq!(record.value.phase, "capture barrier");
    assert!(
        record.value.error.contains("stale files"),
        "{}",
        record.value.error
    );
    assert!(!dir.file("challenge.json").exists());
}

#[test]
fn engine_refuses_an_activation_for_another_capture() {
    let tmp = TempDir::new("foreign");
    let (mut engine, dir) = Engine::startup(&tmp, &[]);
    let mut ready = engine.wait_capture_ready(&dir);
    ready.capture_id = "fedcba98765432104edcba9876543210".into();
    dir.write(&Activation::new(
        &ready,
        "copy-1",
        ActivationKind::Copy,
        None,
        1,
    ))
    .unwrap();
    assert_eq!(engine.wait_exit().code(), Some(1));
    let record: Received<vsnap_protocol::ErrorRecord> = dir.read().unwrap().unwrap();
    assert!(
        record.value.error.contains("capture_id mismatch"),
        "{}",
        record.value.error
    );
}

#[test]
fn barrier_mode_releases_to_a_port_or_aborts() {
    let tmp = TempDir::new("barrier");
    let ready_path = tmp.join("ready.json");
    let release_path = tmp.join("release.json");
    let args = |ready: &Path, release: &Path| {
        vec![
            "--ready-file".to_string(),
            ready.display().to_string(),
            "--release-file".to_string(),
            release.display().to_string(),
            "--release-timeout-s".to_string(),
            "60".to_string(),
            "--".to_string(),
            "serve".to_string(),
            "ignored-model".to_string(),
        ]
    };
    let a = args(&ready_path, &release_path);
    let mut engine = Engine::spawn(
        tmp.join("engine.log"),
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    let result = wait_ready(&ready_path, Instant::now() + WAIT, &mut engine.is_alive());
    let ready = result.unwrap_or_else(|e| panic!("{e}\n{}", engine.log()));
    let port = free_port();
    release(&release_path, Some("127.0.0.1".into()), port).unwrap();
    ready
        .value
        .oracle()
        .check_matches(&http_canary(port), "barrier http")
        .unwrap();

    let aborted_ready = tmp.join("ready2.json");
    let aborted_release = tmp.join("release2.json");
    let b = args(&aborted_ready, &aborted_release);
    let mut aborted = Engine::spawn(
        tmp.join("engine2.log"),
        &b.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    );
    wait_ready(
        &aborted_ready,
        Instant::now() + WAIT,
        &mut aborted.is_alive(),
    )
    .unwrap();
    abort_release(&aborted_release).unwrap();
    assert_eq!(aborted.wait_exit().code(), Some(1));
    assert!(
        aborted.log().contains("release aborted"),
        "{}",
        aborted.log()
    );
}

#[test]
fn sigterm_ends_the_engine_cleanly() {
    let tmp = TempDir::new("sigterm");
    let port = free_port();
    let mut engine = Engine::plain(&tmp, port);
    let (status, _) = http(port, "GET", "/health", "");
    assert_eq!(status, 200);
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc::kill(engine.child.id() as i32, libc::SIGTERM) };
    assert_eq!(engine.wait_exit().code(), Some(0));
}

/// `GET /v1/identity` twice (the first answer, the second draw) and the log of an engine
/// activated in startup mode, with identity.json written before activation.json if given.
fn identity_draws(identity: Option<&Identity>) -> (Value, Value, String) {
    let tmp = TempDir::new("identity");
    let (mut engine, dir) = Engine::startup(&tmp, &[]);
    let ready = engine.wait_capture_ready(&dir);
    if let Some(identity) = identity {
        dir.write(identity).unwrap();
    }
    let port = free_port();
    let activated = engine.activate(&dir, &ready, "id-1", ActivationKind::Copy, port);
    activated.unwrap_or_else(|e| panic!("{e}\n{}", engine.log()));
    let first = http(port, "GET", "/v1/identity", "").1;
    let second = http(port, "GET", "/v1/identity", "").1;
    (first, second["draw"].clone(), engine.log())
}

#[test]
fn an_identity_reseeds_the_engine_after_its_canary() {
    let identity = |digit: &str| Identity {
        hostname: "pod-b".into(),
        pod_ips: vec!["10.1.0.3".into()],
        seed: digit.repeat(64),
        version: 1,
    };
    let (a, a2, log) = identity_draws(Some(&identity("a")));
    let mut shape = a.clone();
    let draw = shape.as_object_mut().unwrap().remove("draw").unwrap();
    let expected = json!({"hostname": "pod-b", "pod_ips": ["10.1.0.3"], "seed_applied": true});
    assert_eq!(
        (shape, draw.as_str().unwrap().parse::<u64>().is_ok()),
        (expected, true)
    );
    let applied = log.find("identity: hostname pod-b").expect(&log);
    assert!(
        log.find("phase recovery: canary").unwrap() < applied,
        "{log}"
    );
    let (b, b2, _) = identity_draws(Some(&identity("a")));
    assert_eq!((&a["draw"], &a2), (&b["draw"], &b2));
    assert_ne!(a["draw"], a2);
    assert_ne!(a["draw"], identity_draws(Some(&identity("b"))).0["draw"]);
    let (plain, _, log) = identity_draws(None);
    assert_eq!(
        (&plain["hostname"], &plain["seed_applied"]),
        (&Value::Null, &json!(false))
    );
    assert!(!log.contains("identity:"), "{log}");

    // Barrier mode: the identity rides in the release file.
    let tmp = TempDir::new("barrier-identity");
    let (ready_path, release_path) = (tmp.join("ready.json"), tmp.join("release.json"));
    let args = [&ready_path, &release_path].map(|p| p.display().to_string());
    let argv = ["--ready-file", &args[0], "--release-file", &args[1]];
    let mut engine = Engine::spawn(tmp.join("engine.log"), &argv, &[]);
    wait_ready(&ready_path, Instant::now() + WAIT, &mut engine.is_alive()).unwrap();
    let port = free_port();
    let host = Some("127.0.0.1".into());
    release_for(&release_path, host, port, Some(identity("a")), None).unwrap();
    let barrier = http(port, "GET", "/v1/identity", "").1;
    assert_eq!(barrier, a);
}
