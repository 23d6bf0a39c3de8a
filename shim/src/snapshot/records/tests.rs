//! What a task leaves behind, read back as people and benchmarks read it:
//! a restore's timings, a failure's record, CRIU's log kept under the
//! root, and the metrics journal's totals.

use std::path::Path;
use std::time::{Duration, SystemTime};

use vsnap_artifact::journal::{Journal, Op};

use super::journal;
use super::reports::{keep_criu_log, record_error, RestoreTimings};
use crate::error::Error;

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_restores_timings_are_written_whole_in_milliseconds_without_page_figures_when_none_placed() {
    let dir = tempfile::tempdir().unwrap();
    let ms = Duration::from_millis;
    RestoreTimings {
        create_began: SystemTime::now(),
        preflight: ms(12),
        verify: ms(30),
        criu_restore: ms(400),
        activation: ms(90),
        listener: ms(3),
        rootfs: ms(7),
        pages: None,
        criu_began: None,
    }
    .record(dir.path());
    let r = json(&dir.path().join("vsnap-restore.json"));
    for (field, want) in [
        ("preflight_ms", 12.0),
        ("verify_ms", 30.0),
        ("criu_restore_ms", 400.0),
        ("activation_ms", 90.0),
        ("listener_ms", 3.0),
        ("rootfs_ms", 7.0),
    ] {
        assert_eq!(r[field].as_f64(), Some(want), "{field}: {r}");
    }
    assert!(
        r["page_fill_ms"].is_null() && r["pages_placed_bytes"].is_null(),
        "{r}"
    );
    assert!(r["recorded_unix_s"].as_f64().unwrap() >= r["create_began_unix_s"].as_f64().unwrap());
}

#[test]
fn a_failure_record_names_the_container_the_phase_and_the_kept_log_and_is_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    let e = Error::FailedPrecondition("restore: CRIU: broken".into());
    record_error(
        dir.path(),
        "c1",
        Some("restore: CRIU"),
        &e,
        Some(Path::new("/k/log")),
    );
    let r = json(&dir.path().join("vsnap-error.json"));
    assert_eq!(r["container"], "c1");
    assert_eq!(r["phase"], "restore: CRIU");
    assert_eq!(r["criu_log"], "/k/log");
    assert!(r["error"].as_str().unwrap().contains("broken"), "{r}");
    let again = Error::Other("create: later".into());
    record_error(dir.path(), "c1", None, &again, None);
    let r = json(&dir.path().join("vsnap-error.json"));
    assert!(
        r.get("phase").is_none() && r.get("criu_log").is_none(),
        "{r}"
    );
    assert!(r["error"].as_str().unwrap().contains("later"), "{r}");
}

#[test]
fn criu_s_log_is_kept_under_the_root_only_where_criu_left_one() {
    let root = tempfile::tempdir().unwrap();
    let bundle = tempfile::tempdir().unwrap();
    let log = bundle.path().join("restore.log");
    assert!(keep_criu_log(root.path(), "a", "c1", "restore", &log).is_none());
    std::fs::write(&log, "Error (criu.c:1): broken\n").unwrap();
    let kept = keep_criu_log(root.path(), "a", "c1", "restore", &log).expect("kept");
    assert!(kept.starts_with(root.path()), "{}", kept.display());
    assert_eq!(std::fs::read(&kept).unwrap(), std::fs::read(&log).unwrap());
    let name = kept.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.contains("c1") && name.contains("restore"), "{name}");
}

#[test]
fn a_refused_preflight_and_an_outcome_reach_the_journals_totals() {
    let root = tempfile::tempdir().unwrap();
    journal::preflight_failed(root.path(), "a", Duration::from_millis(5));
    let ok = journal::outcome(Op::Restore, "a", Duration::from_secs(2)).phase("criu", 1.5);
    journal::record_now(root.path(), &ok);
    let totals = Journal::at(root.path()).totals().unwrap();
    assert_eq!(totals.failures["restore"]["preflight"], 1);
    assert_eq!(totals.durations["restore"]["criu"].count, 1);
    assert_eq!(totals.outcomes["restore"].len(), 1, "one artifact");
}
