//! A capture its container owns, killed and deleted while it runs: the
//! kill cancels it and the delete answers only once the capture's work is
//! undone. So the moment `ctr task delete` returns, nothing of the capture
//! is left: no runc or CRIU of the shim's, no staging dir, no artifact of
//! the name, no mount under the bundle, the artifact's lock free; and a
//! second create of the name captures and publishes.

use std::path::Path;
use std::time::Duration;

use super::harness::{still_running, under_the_shim, wait_until};
use super::{in_flight, lock_held, BIG};
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{control_dirs, Env};

/// What a capture left when its container's delete answered.
#[derive(Debug, Default, PartialEq)]
struct Left {
    runc: Vec<i32>,
    criu: Vec<i32>,
    staging: Vec<String>,
    artifacts: Vec<String>,
    mounts: Vec<String>,
    lock_held: bool,
}

/// A create of `art` with 1 GiB resident (CRIU's dump takes about a
/// second), killed then deleted once `moment` holds.
fn killed_and_deleted_during_capture(tag: &str, moment: impl Fn(&Env, &Path) -> bool) {
    let e = vsnap_e2e::snapshot_env::setup(tag);
    // Ids of this test only: cgroup paths (/<namespace>/<id>) are host-wide.
    let [w1, w2] = ["w1", "w2"].map(|w| format!("{tag}-{w}"));
    let out = e.run(&w1, "create", "art", free_port(), &["--env", BIG]);
    assert!(out.ok(), "{out:?}");
    let bundle = e.bundle(&w1);
    wait_until(Duration::from_secs(120), "the moment to kill", || {
        moment(&e, &bundle)
    });
    let (runc, criu) = (under_the_shim(&e, "runc"), under_the_shim(&e, "criu"));
    e.c.ctr_ok(&["task", "kill", "-s", "SIGKILL", &w1]);
    e.wait_stopped(&w1);
    let deleted = e.c.ctr(&["task", "delete", &w1]);
    // Read at once: what the capture had not undone when the delete answered.
    let bundle_prefix = bundle.display().to_string();
    let left = Left {
        runc: still_running(&runc, "runc"),
        criu: still_running(&criu, "criu"),
        staging: e.staging_dirs(),
        artifacts: e.artifact_names(),
        mounts: e
            .c
            .mounts()
            .into_iter()
            .filter(|m| m.starts_with(&bundle_prefix))
            .collect(),
        lock_held: lock_held(&e, "art"),
    };
    eprintln!(
        "{tag}: runc {runc:?}, CRIU {criu:?} at the kill; the delete ({deleted:?}) left {left:?}"
    );
    assert_eq!(left, Left::default(), "{}", e.c.log_tail());
    e.c.ctr_ok(&["c", "rm", &w1]);
    // The name is free: a second create captures and publishes it.
    e.create_good(&w2, "art", &[]);
    e.assert_nothing_left();
}

#[test]
fn a_kill_and_delete_during_the_dump_leave_nothing_and_publish_nothing() {
    killed_and_deleted_during_capture("x-dump", |e, bundle| {
        in_flight(bundle, "checkpoint") && super::criu_runs(e)
    });
}

#[test]
fn a_kill_and_delete_once_the_engine_is_capture_ready_leave_nothing() {
    killed_and_deleted_during_capture("x-ready", |e, _| {
        control_dirs(&e.artifacts).iter().any(|d| {
            e.artifacts
                .join(".control")
                .join(d)
                .join("capture-ready.json")
                .exists()
        })
    });
}
