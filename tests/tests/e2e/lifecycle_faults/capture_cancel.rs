//! A capture its container owns, stopped and deleted while it runs, in a
//! shim that lives on (a pod's, as CRI groups it: a kubelet restarting the
//! container): the kill cancels the capture and the delete answers only
//! once its work is undone. So the moment `ctr task delete` returns,
//! nothing of the capture is left: no runc or CRIU of the shim's, no
//! staging dir, no artifact of the name, no mount under the bundle, the
//! artifact's lock free; and a second create of the name captures and
//! publishes.

use std::cell::Cell;
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

/// A create of `art` with 1 GiB resident (CRIU's dump and the digests take
/// about a second each), sent `signal` once `moment` holds, then deleted
/// once stopped.
fn stopped_and_deleted_during_capture(
    tag: &str,
    signal: &str,
    moment: impl Fn(&Env, &Path) -> bool,
) {
    let e = vsnap_e2e::snapshot_env::setup(tag);
    // Ids of this test only: cgroup paths (/<namespace>/<id>) are host-wide.
    let [pod, w1, w2] = ["pod", "w1", "w2"].map(|w| format!("{tag}-{w}"));
    // One shim for both, as CRI groups a pod's containers: it outlives w1.
    let group = format!("io.kubernetes.cri.sandbox-id={pod}");
    let rootfs = e.rootfs.clone();
    let mut plain = vec!["run", "-d", "--runtime", "io.vsnap.v1"];
    plain.extend_from_slice(&["--annotation", &group, "--rootfs", &rootfs]);
    plain.extend_from_slice(&[&pod, "/bin/sleep", "1000"]);
    e.c.ctr_ok(&plain);
    let extra = ["--env", BIG, "--annotation", &group];
    let out = e.run(&w1, "create", "art", free_port(), &extra);
    assert!(out.ok(), "{out:?}");
    let bundle = e.bundle(&w1);
    wait_until(Duration::from_secs(120), "the moment to stop it", || {
        moment(&e, &bundle)
    });
    let (runc, criu) = (under_the_shim(&e, "runc"), under_the_shim(&e, "criu"));
    e.c.ctr_ok(&["task", "kill", "-s", signal, &w1]);
    e.wait_stopped(&w1);
    let deleted = e.c.ctr(&["task", "delete", &w1]);
    // Read at once: what the capture had not undone when the delete answered.
    let under_bundle = bundle.display().to_string();
    let left = Left {
        runc: still_running(&runc, "runc"),
        criu: still_running(&criu, "criu"),
        staging: e.staging_dirs(),
        artifacts: e.artifact_names(),
        mounts: e
            .c
            .mounts()
            .into_iter()
            .filter(|m| m.starts_with(&under_bundle))
            .collect(),
        lock_held: lock_held(&e, "art"),
    };
    eprintln!(
        "{tag}: runc {runc:?}, CRIU {criu:?} at the {signal}; the delete ({deleted:?}) left {left:?}"
    );
    assert_eq!(left, Left::default(), "{}", e.c.log_tail());
    e.c.ctr_ok(&["c", "rm", &w1]);
    e.remove(&pod);
    // The name is free: a second create captures and publishes it.
    e.create_good(&w2, "art", &[]);
    e.assert_nothing_left();
}

/// CRIU's dump of the engine under way.
fn dumping(e: &Env, bundle: &Path) -> bool {
    in_flight(bundle, "checkpoint") && super::criu_runs(e)
}

/// containerd's stop (SIGTERM first) while CRIU dumps the tree: the dump
/// must not go on into an artifact of a container being stopped.
#[test]
fn a_stop_during_the_dump_publishes_nothing_and_leaves_nothing() {
    stopped_and_deleted_during_capture("x-dump", "SIGTERM", dumping);
}

/// After the dump, while the capture carries and digests: work that no
/// longer needs the tree, which its death alone would not end.
#[test]
fn a_kill_and_delete_after_the_dump_publish_nothing_and_leave_nothing() {
    let dumped = Cell::new(false);
    stopped_and_deleted_during_capture("x-digest", "SIGKILL", |e, bundle| {
        dumped.set(dumped.get() || in_flight(bundle, "checkpoint"));
        dumped.get() && !in_flight(bundle, "checkpoint") && !e.staging_dirs().is_empty()
    });
}

#[test]
fn a_kill_and_delete_once_the_engine_is_capture_ready_leave_nothing() {
    stopped_and_deleted_during_capture("x-ready", "SIGKILL", |e, _| {
        control_dirs(&e.artifacts).iter().any(|d| {
            e.artifacts
                .join(".control")
                .join(d)
                .join("capture-ready.json")
                .exists()
        })
    });
}
