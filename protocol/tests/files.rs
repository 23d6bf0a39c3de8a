//! Strict reading and atomic writing of protocol files.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

use common::{capture_ready, TempDir, CAPTURE_ID};
use vsnap_protocol::{
    abort_release, abort_release_for, parse, read_bytes, read_json, release, release_for,
    write_atomic, Activation, ActivationKind, CaptureReady, Challenge, ControlDir, ErrorRecord,
    ProtocolError, ReadyFile, ReleaseFile, Status, StatusPhase,
};

const GOOD_ACTIVATION: &str = r#"{"activation_id":"copy-1","capture_id":"0123456789abcdef4123456789abcdef","host":null,"kind":"copy","native_complete":true,"port":8000,"version":1}"#;

fn activation_err(json: &str) -> String {
    parse::<Activation>(Path::new("/c/activation.json"), json.as_bytes())
        .unwrap_err()
        .to_string()
}

#[test]
fn missing_file_reads_as_none() {
    let tmp = TempDir::new("missing");
    assert!(read_bytes(&tmp.join("nothing.json")).unwrap().is_none());
    assert!(read_json::<Status>(&tmp.join("nothing.json"))
        .unwrap()
        .is_none());
}

#[test]
fn symlinked_file_is_refused() {
    let tmp = TempDir::new("filelink");
    fs::write(tmp.join("real.json"), GOOD_ACTIVATION).unwrap();
    symlink(tmp.join("real.json"), tmp.join("activation.json")).unwrap();
    let err = read_bytes(&tmp.join("activation.json")).unwrap_err();
    assert!(matches!(err, ProtocolError::Symlink { .. }));
    assert_eq!(
        err.to_string(),
        format!("{}: symlink refused", tmp.join("activation.json").display())
    );
}

#[test]
fn dangling_symlink_is_refused_not_treated_as_missing() {
    let tmp = TempDir::new("dangling");
    symlink("/nonexistent", tmp.join("status.json")).unwrap();
    assert!(matches!(
        read_bytes(&tmp.join("status.json")),
        Err(ProtocolError::Symlink { .. })
    ));
}

#[test]
fn oversized_file_is_refused() {
    let tmp = TempDir::new("big");
    fs::write(tmp.join("big.json"), vec![b' '; 70_000]).unwrap();
    let err = read_bytes(&tmp.join("big.json")).unwrap_err().to_string();
    assert!(
        err.ends_with("big.json: 70000 bytes exceeds 65536"),
        "{err}"
    );
}

#[test]
fn file_of_exactly_the_limit_is_read() {
    let tmp = TempDir::new("limit");
    fs::write(tmp.join("f.json"), vec![b' '; 65_536]).unwrap();
    assert_eq!(
        read_bytes(&tmp.join("f.json")).unwrap().unwrap().len(),
        65_536
    );
}

#[test]
fn directory_and_fifo_are_not_regular_files() {
    let tmp = TempDir::new("types");
    fs::create_dir(tmp.join("dir.json")).unwrap();
    let err = read_bytes(&tmp.join("dir.json")).unwrap_err().to_string();
    assert!(err.ends_with("not a regular file (directory)"), "{err}");

    let fifo = tmp.join("fifo.json");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let err = read_bytes(&fifo).unwrap_err().to_string();
    assert!(err.ends_with("not a regular file (fifo)"), "{err}");
}

#[test]
fn half_written_json_is_a_hard_failure() {
    let half = &GOOD_ACTIVATION[..GOOD_ACTIVATION.len() / 2];
    let err = activation_err(half);
    assert!(
        err.starts_with("/c/activation.json: EOF while parsing"),
        "{err}"
    );
}

#[test]
fn empty_file_and_non_objects_are_refused() {
    assert!(activation_err("").ends_with("empty file"));
    assert!(activation_err("  \n").ends_with("empty file"));
    assert!(activation_err("[]").ends_with("not a JSON object"));
    // serde would accept a struct spelled as an array; the protocol does not.
    assert!(activation_err(r#"["copy-1"]"#).ends_with("not a JSON object"));
    assert!(activation_err("null").ends_with("not a JSON object"));
}

#[test]
fn two_json_objects_are_refused() {
    let err = activation_err(&format!("{GOOD_ACTIVATION}{GOOD_ACTIVATION}"));
    assert!(err.contains("trailing characters"), "{err}");
}

#[test]
fn extra_keys_are_refused() {
    let json = GOOD_ACTIVATION.replace(r#""version":1"#, r#""version":1,"foo":2"#);
    let err = activation_err(&json);
    assert!(err.contains("unknown field `foo`"), "{err}");
}

#[test]
fn duplicate_keys_are_refused() {
    let json = GOOD_ACTIVATION.replace(r#""port":8000"#, r#""port":8000,"port":8001"#);
    assert!(activation_err(&json).contains("duplicate field `port`"));
}

#[test]
fn wrong_version_is_refused() {
    let json = GOOD_ACTIVATION.replace(r#""version":1"#, r#""version":2"#);
    assert_eq!(
        activation_err(&json),
        "/c/activation.json: version 2 is not supported (expected 1)"
    );
}

#[test]
fn activation_host_key_is_required_but_may_be_null() {
    let parsed: Activation =
        parse(Path::new("/c/activation.json"), GOOD_ACTIVATION.as_bytes()).unwrap();
    assert_eq!(parsed.host, None);
    assert_eq!(parsed.kind, ActivationKind::Copy);
    let json = GOOD_ACTIVATION.replace(r#""host":null,"#, "");
    assert!(activation_err(&json).contains("missing field `host`"));
}

#[test]
fn activation_values_are_checked() {
    let cases = [
        (r#""port":8000"#, r#""port":0"#, "port 0"),
        (r#""port":8000"#, r#""port":70000"#, "70000"),
        (r#""port":8000"#, r#""port":-1"#, "-1"),
        (
            r#""kind":"copy""#,
            r#""kind":"clone""#,
            "unknown variant `clone`",
        ),
        (
            r#""activation_id":"copy-1""#,
            r#""activation_id":"a/b""#,
            "activation_id \"a/b\"",
        ),
        (
            r#""activation_id":"copy-1""#,
            r#""activation_id":"""#,
            "activation_id \"\"",
        ),
        (
            CAPTURE_ID,
            "0123456789ABCDEF4123456789abcdef",
            "not a uuid4 hex",
        ),
        (r#""host":null"#, r#""host":"""#, "host \"\""),
        (
            r#""native_complete":true"#,
            r#""native_complete":1"#,
            "invalid type",
        ),
    ];
    for (from, to, expected) in cases {
        let err = activation_err(&GOOD_ACTIVATION.replace(from, to));
        assert!(err.contains(expected), "{to}: {err}");
    }
}

#[test]
fn capture_ready_checks_pid_and_oracle() {
    let mut ready = capture_ready();
    let path = Path::new("/c/capture-ready.json");
    let good = serde_json::to_string(&ready).unwrap();
    parse::<CaptureReady>(path, good.as_bytes()).unwrap();

    ready.pid = 0;
    let err =
        parse::<CaptureReady>(path, serde_json::to_string(&ready).unwrap().as_bytes()).unwrap_err();
    assert!(err.to_string().contains("pid 0"), "{err}");

    let two_tokens = good.replace("[48]", "[48,49]");
    let err = parse::<CaptureReady>(path, two_tokens.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("exactly one token"), "{err}");

    let huge = good.replace("-1.5", "-1e400");
    assert!(parse::<CaptureReady>(path, huge.as_bytes()).is_err());
}

#[test]
fn error_record_tolerates_extra_keys_and_null_activation() {
    let json = format!(
        r#"{{"activation_id":null,"capture_id":"{CAPTURE_ID}","error":"boom","error_type":"RuntimeError","phase":"initialize engine","traceback":"..."}}"#
    );
    let record: ErrorRecord = parse(Path::new("/c/error.json"), json.as_bytes()).unwrap();
    assert_eq!(record.activation_id, None);
    assert_eq!(record.phase, "initialize engine");
}

#[test]
fn status_phases_parse() {
    let json =
        format!(r#"{{"activation_id":"a","capture_id":"{CAPTURE_ID}","phase":"recovering"}}"#);
    let status: Status = parse(Path::new("/c/status.json"), json.as_bytes()).unwrap();
    assert_eq!(status.phase, StatusPhase::Recovering);
    let bad = json.replace("recovering", "done");
    assert!(parse::<Status>(Path::new("/c/status.json"), bad.as_bytes()).is_err());
}

#[test]
fn challenge_nonce_must_be_uuid_hex() {
    let json = format!(
        r#"{{"activation_id":"a","capture_id":"{CAPTURE_ID}","nonce":"short","version":1}}"#
    );
    let err = parse::<Challenge>(Path::new("/c/challenge.json"), json.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("nonce \"short\""), "{err}");
}

#[test]
fn written_messages_are_compact_sorted_and_private() {
    let tmp = TempDir::new("write");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    let bytes = dir.write(&capture_ready()).unwrap();
    assert_eq!(
        String::from_utf8(bytes.clone()).unwrap(),
        format!(
            r#"{{"capture_id":"{CAPTURE_ID}","oracle":{{"sampled_token_logprob":-1.5,"text":" P","token_ids":[48]}},"pid":1,"version":1}}"#
        )
    );
    let path = dir.file("capture-ready.json");
    assert_eq!(fs::read(&path).unwrap(), bytes);
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(dir.entries().unwrap(), vec!["capture-ready.json"]);
    let back = dir.read::<CaptureReady>().unwrap().unwrap();
    assert_eq!(back.value, capture_ready());
}

#[test]
fn overwriting_replaces_the_whole_file() {
    let tmp = TempDir::new("overwrite");
    let path = tmp.join("status.json");
    write_atomic(&path, b"{\"a\":1111111111}").unwrap();
    write_atomic(&path, b"{}").unwrap();
    assert_eq!(fs::read(&path).unwrap(), b"{}");
}

#[test]
fn leftover_tmp_file_blocks_the_write() {
    let tmp = TempDir::new("tmpexists");
    fs::write(tmp.join("status.json.tmp"), b"junk").unwrap();
    let err = write_atomic(&tmp.join("status.json"), b"{}").unwrap_err();
    assert!(err.to_string().contains("status.json.tmp: create"), "{err}");
    assert!(!tmp.join("status.json").exists());
}

#[test]
fn tmp_symlink_is_not_followed() {
    let tmp = TempDir::new("tmplink");
    symlink(tmp.join("target"), tmp.join("status.json.tmp")).unwrap();
    assert!(write_atomic(&tmp.join("status.json"), b"{}").is_err());
    assert!(!tmp.join("target").exists());
}

#[test]
fn invalid_message_is_not_written() {
    let tmp = TempDir::new("nowrite");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    let mut ready = capture_ready();
    ready.oracle.sampled_token_logprob = f64::NAN;
    let err = dir.write(&ready).unwrap_err();
    assert!(err.to_string().contains("refusing to write"), "{err}");
    assert!(dir.entries().unwrap().is_empty());
}

#[test]
fn release_file_round_trips_release_and_abort() {
    let tmp = TempDir::new("release");
    let path = tmp.join("release.json");
    release(&path, None, 8123).unwrap();
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        r#"{"host":null,"port":8123,"release":true}"#
    );
    let back = read_json::<ReleaseFile>(&path).unwrap().unwrap().value;
    assert_eq!(
        back,
        ReleaseFile::Release {
            host: None,
            port: 8123,
            identity: None
        }
    );

    fs::remove_file(&path).unwrap();
    abort_release(&path).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), r#"{"release":false}"#);
    assert_eq!(
        read_json::<ReleaseFile>(&path).unwrap().unwrap().value,
        ReleaseFile::Abort
    );
}

#[test]
fn release_file_is_strict() {
    let p = Path::new("/r/release.json");
    let with_host: ReleaseFile =
        parse(p, br#"{"host":"127.0.0.1","port":1,"release":true}"#).unwrap();
    assert_eq!(
        with_host,
        ReleaseFile::Release {
            host: Some("127.0.0.1".into()),
            port: 1,
            identity: None
        }
    );
    // A copy's identity rides in the release; vLLM's marker ignores keys it does not know.
    let seed = "ab".repeat(32);
    let text = format!(
        r#"{{"host":null,"identity":{{"hostname":"pod-b","pod_ips":["10.1.0.3"],"seed":"{seed}","version":1}},"port":2,"release":true}}"#
    );
    let Ok(ReleaseFile::Release {
        identity: Some(identity),
        ..
    }) = parse::<ReleaseFile>(p, text.as_bytes())
    else {
        panic!("a release with an identity: {text}");
    };
    assert_eq!((identity.hostname.as_str(), identity.seed), ("pod-b", seed));
    let bad = text.replace("10.1.0.3", "pod-b");
    assert!(parse::<ReleaseFile>(p, bad.as_bytes())
        .unwrap_err()
        .to_string()
        .contains("identity: pod_ips"));
    assert!(parse::<ReleaseFile>(p, br#"{"release":true}"#)
        .unwrap_err()
        .to_string()
        .contains("needs a port"));
    assert!(parse::<ReleaseFile>(p, br#"{"release":true,"port":0}"#).is_err());
    assert!(parse::<ReleaseFile>(p, br#"{"release":false,"x":1}"#)
        .unwrap_err()
        .to_string()
        .contains("unknown field `x`"));
    assert!(parse::<ReleaseFile>(p, br#"{"release":"yes"}"#).is_err());
}

#[test]
fn ready_file_is_the_oracle() {
    let p = Path::new("/r/ready.json");
    let ready: ReadyFile = parse(
        p,
        br#"{"sampled_token_logprob":-0.25,"text":"x","token_ids":[3]}"#,
    )
    .unwrap();
    assert_eq!(ready.oracle().token_ids, vec![3]);
    assert!(parse::<ReadyFile>(
        p,
        br#"{"sampled_token_logprob":-0.25,"text":"x","token_ids":[]}"#
    )
    .is_err());
    assert!(parse::<ReadyFile>(p, br#"{"sampled_token_logprob":-0.25,"text":"x"}"#).is_err());
}

/// The capturer (root) writes into the control dir of an engine running as another user:
/// what it writes is the engine's to read, the barrier's release file too.
#[test]
fn files_written_for_another_users_engine_are_that_users() {
    if vsnap_protocol::euid() != 0 {
        eprintln!("skipped: needs root to hand files to another uid");
        return;
    }
    let tmp = TempDir::new("foruser");
    let dir = ControlDir::create_owned_by(tmp.join("control"), 54321, Some(54321)).unwrap();
    dir.write(&capture_ready()).unwrap();
    let meta = fs::metadata(dir.file("capture-ready.json")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (54321, 0o600));
    release_for(&dir.file("release.json"), None, 8123, None, Some(54321)).unwrap();
    assert_eq!(fs::metadata(dir.file("release.json")).unwrap().uid(), 54321);
    abort_release_for(&dir.file("abort.json"), Some(54321)).unwrap();
    assert_eq!(fs::metadata(dir.file("abort.json")).unwrap().uid(), 54321);
    // The capturer's own files stay its own.
    write_atomic(&tmp.join("mine.json"), b"{}").unwrap();
    assert_eq!(fs::metadata(tmp.join("mine.json")).unwrap().uid(), 0);
}
