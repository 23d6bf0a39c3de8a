//! A restore under faults, end to end with real containerd, runc and CRIU:
//! the shim SIGKILLed in each phase of a restore, containerd SIGKILLed
//! during one, a kill during the verification, and calls to a shim that is
//! restoring; a capture stopped and deleted while it runs
//! (capture_cancel.rs). Each moment is reached by waiting for its condition (runc's
//! criu-root mount, the copy's pid file, the shim's open pages image),
//! never by sleeping. What must hold: the rootfs is intact, nothing is left
//! (process, mount, runc state, cgroup, control dir), a container is
//! RUNNING only once its engine validated, and a later restore works.

mod capture_cancel;
mod harness;

use std::path::Path;
use std::time::{Duration, Instant};

use harness::{
    assert_intact_and_clean, cleaned_up, criu_root, kill_the_shim, remove_any,
    restore_in_background, restore_works, tree, under_the_shim, wait_until,
};
use vsnap_e2e::cmd::run;
use vsnap_e2e::containerd::is_mounted;
use vsnap_e2e::engine::{answer, complete, free_port};
use vsnap_e2e::snapshot_env::{control_dirs, poll, setup, Env};

/// 1 GiB resident in the engine: CRIU's restore takes about a second here.
const BIG: &str = "VSNAP_ENGINE_RESIDENT_MB=1024";
/// 3 GiB resident: with CRIU placing the pages and the artifact out of the
/// page cache, its verification takes 3.3-3.9 s here (2 s from the cache;
/// 1 GiB: 1.5 s from disk).
const LARGE: &str = "VSNAP_ENGINE_RESIDENT_MB=3072";
/// The copy never finishes its recovery: the activation waits.
const HANG: &str = "VSNAP_ENGINE_HANG_PHASE=recover";

#[test]
fn a_shim_killed_during_criu_restore_loses_no_file_and_leaves_nothing() {
    let e = setup("k-criu");
    e.create_good("kc0", "big", &[BIG]);
    let before = tree(Path::new(&e.rootfs));
    let ctr = restore_in_background(&e, "kc1", "big", free_port(), &["--env", BIG]);
    // runc's criu-root bind mount of the rootfs is up: CRIU is restoring.
    wait_until(Duration::from_secs(60), "runc's criu-root mount", || {
        is_mounted(&criu_root(&e, "kc1"))
    });
    kill_the_shim(&e);
    let out = ctr.join().unwrap();
    assert!(!out.ok(), "a restore whose shim died never starts: {out:?}");
    remove_any(&e, "kc1");
    assert_intact_and_clean(&e, "kc1", &before);
    restore_works(&e, "kc2", "big", &[BIG]);
    e.assert_nothing_left();
}

#[test]
fn a_shim_killed_during_the_activation_leaves_no_copy_running() {
    let e = setup("k-act");
    e.create_good("ka0", "hang", &[HANG]);
    let before = tree(Path::new(&e.rootfs));
    let ctr = restore_in_background(&e, "ka1", "hang", free_port(), &["--env", HANG]);
    // runc wrote the copy's pid: CRIU is done, the activation waits.
    let pid_file = e.bundle("ka1").join("init.pid");
    wait_until(Duration::from_secs(60), "the copy's pid file", || {
        pid_file.exists() && !is_mounted(&criu_root(&e, "ka1"))
    });
    kill_the_shim(&e);
    let out = ctr.join().unwrap();
    assert!(!out.ok(), "{out:?}");
    assert_ne!(
        e.task_status("ka1").as_deref(),
        Some("RUNNING"),
        "an unvalidated copy is never RUNNING"
    );
    remove_any(&e, "ka1");
    assert_intact_and_clean(&e, "ka1", &before);
}

#[test]
fn containerd_killed_during_a_restore_never_shows_an_unvalidated_copy() {
    let mut e = setup("k-ctrd");
    e.create_good("kd0", "hang", &[HANG]);
    let bounded = [
        "--env",
        HANG,
        "--annotation",
        "vsnap.io/activation-timeout=8",
    ];
    let ctr = restore_in_background(&e, "kd1", "hang", free_port(), &bounded);
    let bundle = e.bundle("kd1");
    wait_until(Duration::from_secs(60), "the copy's pid file", || {
        bundle.join("init.pid").exists()
    });
    e.c.restart();
    let _ = ctr.join().unwrap();
    // The shim finishes the activation on its own: past its deadline the
    // copy is killed and reported exited, with its error record.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = e.task_status("kd1");
        assert_ne!(status.as_deref(), Some("RUNNING"), "never RUNNING");
        if status.as_deref() == Some("STOPPED") {
            break;
        }
        assert!(Instant::now() < deadline, "kd1 never stopped: {status:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let record = std::fs::read_to_string(bundle.join("vsnap-error.json")).unwrap();
    assert!(
        record.contains("restore: activation") && record.contains("deadline"),
        "{record}"
    );
    assert!(
        !lock_held(&e, "hang"),
        "the artifact lock went with the restore"
    );
    let deleted = e.remove("kd1");
    assert!(deleted.contains("137"), "exited killed: {deleted}");
    e.assert_nothing_left();
}

#[test]
fn containerd_killed_during_criu_restore_shows_the_copy_once_validated() {
    let mut e = setup("k-ctrd-ok");
    e.create_good("ko0", "big", &[BIG]);
    let port = free_port();
    let ctr = restore_in_background(&e, "ko1", "big", port, &["--env", BIG]);
    wait_until(Duration::from_secs(60), "runc's criu-root mount", || {
        is_mounted(&criu_root(&e, "ko1"))
    });
    e.c.restart();
    let _ = ctr.join().unwrap();
    poll(Duration::from_secs(60), "ko1 running", || {
        e.task_status("ko1").as_deref() == Some("RUNNING")
    });
    // RUNNING means validated and listening: it answers at once.
    let reply = complete(port, "The capital of France is", 4);
    assert!(answer(&reply).0.is_string(), "{reply}");
    e.remove("ko1");
    e.assert_nothing_left();
}

/// Whether /proc/locks lists an flock on artifact `name`'s lock file.
fn lock_held(e: &Env, name: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(e.artifacts.join(".locks").join(format!("{name}.lock"))).unwrap();
    let (major, minor) = (libc::major(md.dev()), libc::minor(md.dev()));
    let key = format!("{major:02x}:{minor:02x}:{}", md.ino());
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| l.contains("FLOCK") && !l.contains("->") && l.split_whitespace().any(|f| f == key))
}

/// The latency of one ctr call that must succeed.
fn timed(e: &Env, args: &[&str]) -> Duration {
    let t = Instant::now();
    e.c.ctr_ok(args);
    t.elapsed()
}

#[test]
fn a_restoring_shim_answers_at_once_and_a_kill_ends_the_restore() {
    let e = setup("busy");
    e.create_good("b0", "big", &[BIG, HANG]);
    // Two containers in one shim, as CRI groups a pod.
    let group = ["--annotation", "io.kubernetes.cri.sandbox-id=b1"];
    let rootfs = e.rootfs.clone();
    let mut plain = vec!["run", "-d", "--runtime", "io.vsnap.v1"];
    plain.extend_from_slice(&group);
    plain.extend_from_slice(&["--rootfs", &rootfs, "b1", "/bin/sleep", "1000"]);
    e.c.ctr_ok(&plain);
    let mut extra = vec!["--env", BIG, "--env", HANG];
    extra.extend_from_slice(&group);
    let ctr = restore_in_background(&e, "b2", "big", free_port(), &extra);
    wait_until(Duration::from_secs(60), "runc's criu-root mount", || {
        is_mounted(&criu_root(&e, "b2"))
    });
    assert_eq!(e.c.shim_pids().len(), 1, "one shim for both");
    // During CRIU's restore, then during the activation.
    let mut worst = Duration::ZERO;
    for phase in ["criu", "activation"] {
        if phase == "activation" {
            let pid_file = e.bundle("b2").join("init.pid");
            wait_until(Duration::from_secs(60), "the copy's pid file", || {
                pid_file.exists()
            });
        }
        let ls = e.c.ctr_ok(&["task", "ls"]);
        assert!(
            ls.lines()
                .any(|l| l.starts_with("b2") && l.contains("CREATED")),
            "{phase}: the restoring copy is CREATED, not RUNNING: {ls}"
        );
        for args in [
            &["task", "ls"][..],
            &["task", "metrics", "b1"],
            &["task", "ps", "b1"],
        ] {
            worst = worst.max(timed(&e, args));
        }
    }
    assert!(
        worst < Duration::from_secs(1),
        "calls answered in {worst:?}"
    );
    // A kill ends the restore: Start fails naming the cancellation.
    let t = Instant::now();
    e.c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "b2"]);
    let out = ctr.join().unwrap();
    eprintln!("kill to Start's end: {:?}", t.elapsed());
    assert!(!out.ok(), "{out:?}");
    assert!(out.stderr.contains("cancelled"), "{}", out.stderr);
    e.wait_stopped("b2");
    remove_any(&e, "b2");
    assert_eq!(e.cgroups("b2"), Vec::<String>::new(), "no process of b2");
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
    e.remove("b1");
    e.assert_nothing_left();
}

#[test]
fn a_kill_during_criu_restore_cancels_it_and_leaves_nothing() {
    let e = setup("k-cancel");
    e.create_good("c0", "big", &[BIG]);
    let before = tree(Path::new(&e.rootfs));
    let ctr = restore_in_background(&e, "c1", "big", free_port(), &["--env", BIG]);
    wait_until(Duration::from_secs(60), "runc's criu-root mount", || {
        is_mounted(&criu_root(&e, "c1"))
    });
    e.c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "c1"]);
    let out = ctr.join().unwrap();
    assert!(!out.ok(), "{out:?}");
    assert!(out.stderr.contains("cancelled"), "{}", out.stderr);
    remove_any(&e, "c1");
    assert_intact_and_clean(&e, "c1", &before);
    restore_works(&e, "c2", "big", &[BIG]);
}

/// Any runc invocation of `verb` in flight for the container of `bundle`.
fn in_flight(bundle: &Path, verb: &str) -> bool {
    let prefix = format!(".vsnap-inflight-{verb}-");
    vsnap_e2e::containerd::list(bundle)
        .iter()
        .any(|n| n.starts_with(&prefix))
}

/// A create whose shim is SIGKILLed once `moment` holds: the donor goes,
/// no artifact is half published, the dead writer's staging folder is
/// removed by the next writer, and the artifact can then be created and
/// restored.
/// `first_env` is the killed create's; `env` the later create's and
/// restores'.
fn shim_killed_during_capture(
    tag: &str,
    first_env: &[&str],
    env: &[&str],
    moment: impl Fn(&Env, &Path) -> bool,
) {
    let e = setup(tag);
    // Ids of this test only: cgroup paths (/<namespace>/<id>) are host-wide.
    let [w0, w1, w2, w3] = ["w0", "w1", "w2", "w3"].map(|w| format!("{tag}-{w}"));
    let mut extra = vec!["--annotation", "vsnap.io/after-capture=exit"];
    for kv in first_env {
        extra.extend_from_slice(&["--env", kv]);
    }
    let out = e.run(&w1, "create", "art", free_port(), &extra);
    assert!(out.ok(), "{out:?}");
    // After runc made its mount points (/etc/hosts, /etc/resolv.conf).
    let before = tree(Path::new(&e.rootfs));
    let bundle = e.bundle(&w1);
    wait_until(
        Duration::from_secs(120),
        "the moment to kill the shim",
        || moment(&e, &bundle),
    );
    kill_the_shim(&e);
    remove_any(&e, &w1);
    cleaned_up(&e);
    assert_eq!(&tree(Path::new(&e.rootfs)), &before, "the rootfs is intact");
    assert_eq!(e.cgroups(&w1), Vec::<String>::new(), "no process of {w1}");
    assert!(!lock_held(&e, "art"), "the dead writer's lock is free");
    if e.manifest("art").exists() {
        // Published before the kill: then whole, and it restores.
        restore_works(&e, &w0, "art", first_env);
    }
    e.create_good(&w2, "art", env);
    assert_eq!(e.staging_dirs(), Vec::<String>::new(), "no staging left");
    restore_works(&e, &w3, "art", env);
    e.assert_nothing_left();
}

#[test]
fn a_shim_killed_while_the_engine_starts_cold_leaves_nothing() {
    let slow = ["VSNAP_ENGINE_INIT_MS=60000"];
    shim_killed_during_capture("k-ready", &slow, &[], |e, _| {
        !control_dirs(&e.artifacts).is_empty()
            && e.task_status("k-ready-w1").as_deref() == Some("RUNNING")
    });
}

#[test]
fn a_shim_killed_during_the_checkpoint_publishes_nothing() {
    shim_killed_during_capture("k-dump", &[BIG], &[], |_, bundle| {
        in_flight(bundle, "checkpoint")
    });
}

#[test]
fn a_shim_killed_while_publishing_leaves_a_whole_artifact_or_none() {
    let dumped = std::cell::Cell::new(false);
    shim_killed_during_capture("k-publish", &[BIG], &[], |_, bundle| {
        // After CRIU's dump, while the images are fsynced and renamed.
        let dumping = in_flight(bundle, "checkpoint");
        if dumping {
            dumped.set(true);
        }
        dumped.get() && !dumping
    });
}

#[test]
fn a_restore_past_its_deadline_is_killed_and_leaves_nothing() {
    let e = setup("k-deadline");
    // 2 GiB: CRIU alone takes longer than the 1 s deadline here.
    let huge = "VSNAP_ENGINE_RESIDENT_MB=2048";
    e.create_good("dl0", "huge", &[huge]);
    let before = tree(Path::new(&e.rootfs));
    let bounded = [
        "--env",
        huge,
        "--annotation",
        "vsnap.io/activation-timeout=1",
    ];
    let out = e.run("dl1", "restore", "huge", free_port(), &bounded);
    assert!(!out.ok(), "{out:?}");
    for part in ["the activation timeout of 1s", "deadline exceeded"] {
        assert!(out.stderr.contains(part), "{part}: {}", out.stderr);
    }
    remove_any(&e, "dl1");
    assert_intact_and_clean(&e, "dl1", &before);
}

/// Every file under `dir` written back and dropped from the page cache
/// (fsync, then POSIX_FADV_DONTNEED): the next reads of them, and only
/// them, come from disk.
fn evict(dir: &Path) {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let (path, ft) = (entry.path(), entry.file_type().unwrap());
        if ft.is_dir() {
            evict(&path);
        } else if ft.is_file() {
            let f = std::fs::File::open(&path).unwrap();
            f.sync_all().unwrap();
            // SAFETY: an advice on an fd this function owns.
            let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(rc, 0, "posix_fadvise {}", path.display());
        }
    }
}

/// Whether a shim of this instance holds a pages image of `images` open.
/// With `page_placement = "criu"` only the verification does (no page
/// server): it opens every file first and closes them at its end.
fn shim_reads_pages(e: &Env, images: &Path) -> bool {
    e.c.shim_pids().iter().any(|&pid| {
        vsnap_host::fds::open_fds(pid).iter().any(|fd| {
            let t = &fd.target;
            t.parent() == Some(images)
                && t.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
    })
}

/// Whether CRIU runs under a shim of this instance: runc started it, so
/// runc's own preparation is over (a kill within it leaves runc's bind
/// mounts of the host's /etc files on the rootfs; not this test's moment).
fn criu_runs(e: &Env) -> bool {
    !under_the_shim(e, "criu").is_empty()
}

/// A kill while the verification beside CRIU hashes a large artifact from
/// disk (`page_placement = "criu"`: every pages image is hashed) ends the
/// start within a second, the hashing stopped between chunks with it, and
/// leaves nothing. The driver stops waiting for a phase 500 ms after a
/// stop, so the time alone would not catch a verification that ignores the
/// stop flag: that one still reads the artifact after Start failed (and
/// its lock went), and its record lacks the verification's own account.
#[test]
fn a_kill_during_the_verification_of_a_large_artifact_ends_the_start_within_a_second() {
    let e = setup("k-verify");
    let mut config = std::fs::read_to_string(&e.config).unwrap();
    config.push_str("page_placement = \"criu\"\n");
    std::fs::write(&e.config, config).unwrap();
    e.create_good("kv0", "large", &[LARGE]);
    let before = tree(Path::new(&e.rootfs));
    // The hash reads every byte from disk: the verification lasts seconds.
    evict(&e.artifact("large"));
    let cmd = e.run_command(
        "kv1",
        "restore",
        "large",
        free_port(),
        &["--env", LARGE],
        &[],
    );
    // ctr blocks in Start; its exit is timed to within run's 20 ms poll.
    let ctr =
        std::thread::spawn(move || (run(cmd, None, Duration::from_secs(180)), Instant::now()));
    let images = e.artifact("large").join("images");
    // The verification reads the artifact, and CRIU restores beside it.
    poll(Duration::from_secs(120), "the verification of kv1", || {
        shim_reads_pages(&e, &images) && criu_runs(&e)
    });
    let kill = Instant::now();
    e.c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "kv1"]);
    let killed = Instant::now();
    let (out, exited) = ctr.join().unwrap();
    // The verification ended with the start (its thread is joined before
    // Start fails): nothing reads the artifact once its lock is let go.
    let still_reading = shim_reads_pages(&e, &images);
    let took = exited.saturating_duration_since(killed);
    eprintln!(
        "ctr task kill took {:?}; from its return to the end of ctr run: {took:?} ({:?} from its start)",
        killed - kill,
        exited.saturating_duration_since(kill)
    );
    assert!(!out.ok(), "a killed restore never starts: {out:?}");
    assert!(out.stderr.contains("cancelled"), "{}", out.stderr);
    assert!(
        took < Duration::from_secs(1),
        "the start ended {took:?} after the kill, not within a second"
    );
    assert!(
        !still_reading,
        "the shim still reads the artifact after the start ended"
    );
    // The record names the phase (the verification runs inside CRIU's)
    // and the verification stopped by the kill, before its end.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(e.bundle("kv1").join("vsnap-error.json")).unwrap())
            .unwrap();
    assert_eq!(record["phase"], "restore: CRIU", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    for part in ["restore: verify", "stopped before its end", "cancelled"] {
        assert!(error.contains(part), "{part:?} missing: {record}");
    }
    remove_any(&e, "kv1");
    assert!(
        !lock_held(&e, "large"),
        "the artifact lock went with the start"
    );
    assert_intact_and_clean(&e, "kv1", &before);
}
