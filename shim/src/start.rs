//! Starting a container's init process, in its three shapes: a plain
//! `runc start`; a `create` plan (start, then capture in the background); a
//! restore (runc + CRIU, then the activation), which the shim owns rather
//! than the Start call: it runs in its own task with no lock on the
//! container, so State, Kill, Stats and the other containers answer
//! meanwhile, and it finishes or fails within its deadline even when
//! containerd dies mid-call. A restored copy counts as RUNNING only once its
//! engine validated its canary and listens; a failed one is killed and
//! reported as exited non-zero, with its error record in the bundle.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use containerd_shim_protos::events::task::TaskStart;
use log::{error, info};

use crate::container::{Container, RestoreJob};
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::exits::Mark;
use crate::shared::{ContainerRef, Shared};
use crate::snapshot::capture::Capture;
use crate::snapshot::capture::DIGEST_THREADS;
use crate::snapshot::plan::Mode;
use crate::snapshot::restore::activate_copy;
use crate::snapshot::{artifact_error, barrier, criu, cuda, listener, pages, shm};
use crate::snapshot::{record_error, RestoreTimings, Snapshot};
use vsnap_artifact::{content, ArtifactError, Contents};

/// How long a restore of a checkpoint given by containerd (no plan, so no
/// activation timeout) may take before it is given up.
const CHECKPOINT_RESTORE_LIMIT: Duration = Duration::from_secs(3600);

/// Starts (or restores) the init process of `handle`; returns its pid.
pub async fn init(shared: Shared, handle: ContainerRef, mark: Mark) -> Result<i32> {
    let mut c = handle.lock().await;
    if c.restore_from.is_none() {
        return plain(&shared, &mut c).await;
    }
    let deadline = match c.snapshot.as_ref().filter(|s| s.mode == Mode::Restore) {
        Some(s) => s.activation_deadline(),
        None => Deadline::new(
            Instant::now() + CHECKPOINT_RESTORE_LIMIT,
            "the checkpoint restore limit of 3600s",
        ),
    };
    let mut verify = c
        .snapshot
        .as_ref()
        .filter(|s| s.mode == Mode::Restore)
        .and_then(|s| {
            Some(Verify {
                dir: s.artifact_dir(),
                contents: s.contents.clone()?,
                beside_criu: s.holds_stopped(),
                hashed_elsewhere: s.verified_at_create.clone(),
            })
        });
    // The page server hashes the pages files as it places them.
    let places_pages = c.snapshot.as_ref().is_some_and(|s| s.place_pages);
    let page_verification = verify
        .as_mut()
        .filter(|_| places_pages)
        .and_then(take_pages_files);
    let host_shm = c.snapshot.as_ref().and_then(|s| s.host_shm.clone());
    let mut job = c.begin_restore(deadline)?;
    job.page_verification = page_verification;
    drop(c);
    // Owned by the shim: a dropped Start call does not stop it.
    tokio::spawn(restore(shared, handle, job, mark, verify, host_shm))
        .await
        .map_err(|e| Error::Other(format!("restore: {e}")))?
}

/// `runc start`, then, for a `create` plan, the capture in the background
/// (a cold start can take minutes: Start must not wait for it).
async fn plain(shared: &Shared, c: &mut Container) -> Result<i32> {
    let started = c.start().await;
    if started.is_ok() {
        if let Some(s) = c.snapshot.clone() {
            // The capture holds its own clone of the artifact lock.
            let capture = Capture {
                id: c.id.clone(),
                bundle: c.bundle.clone(),
                runc: c.runc.clone(),
                pid: c.init.pid,
                terminal: c.init.stdio.terminal,
                snapshot: s,
                started: Instant::now(),
            };
            tokio::spawn(capture.run());
        }
    }
    if let Some(s) = c.snapshot.as_mut() {
        s.release_lock();
    }
    started?;
    shared.watch_oom(&c.id, c.init.pid);
    // Queued under the container's lock: before any exit of the capture's.
    publish_start(shared, c).await;
    Ok(c.init.pid)
}

async fn publish_start(shared: &Shared, c: &Container) {
    shared
        .events
        .send(TaskStart {
            container_id: c.id.clone(),
            pid: c.init.pid as u32,
            ..Default::default()
        })
        .await;
}

/// What a restore verifies: every file of `dir` against `contents`, beside
/// CRIU (which leaves the tree stopped until then) or, when the tree cannot
/// be held stopped (GPUs), before CRIU starts.
struct Verify {
    dir: PathBuf,
    contents: Contents,
    beside_criu: bool,
    /// Files hashed already (the carried writable layer, at create) or by
    /// the page server as it places them (pages.rs).
    hashed_elsewhere: Vec<String>,
}

/// The tasks' pages files of `v`, with their digests, for the page server
/// to hash; `v` leaves them to it. None when the pagemaps cannot be read (not yet verified: a damaged one
/// is then named by the verification, which keeps every file).
fn take_pages_files(v: &mut Verify) -> Option<pages::Verification> {
    let names = match pages::task_pages_files(&v.dir.join("images")) {
        Ok(names) => names,
        Err(e) => {
            log::warn!("restore: page server: {e}: every file is verified apart");
            return None;
        }
    };
    let files = names
        .into_iter()
        .filter_map(|rel| v.contents.get(&rel).map(|d| (rel, d.clone())))
        .collect::<Vec<_>>();
    v.hashed_elsewhere
        .extend(files.iter().map(|(rel, _)| rel.clone()));
    Some(pages::Verification {
        dir: v.dir.clone(),
        files,
    })
}

/// The restore, from `runc restore` to a validated, listening copy.
async fn restore(
    shared: Shared,
    handle: ContainerRef,
    mut job: RestoreJob,
    mark: Mark,
    verify: Option<Verify>,
    host_shm: Option<PathBuf>,
) -> Result<i32> {
    let deadline = job.deadline.clone();
    let t = Instant::now();
    // Every byte of the artifact is hashed while CRIU restores; CRIU leaves
    // the restored tree stopped (leave-stopped), so nothing of it runs or is
    // seen before the digests matched. A mismatch cancels the restore.
    let beside_criu = verify.as_ref().is_none_or(|v| v.beside_criu);
    // The verification stops, between chunks, once the restore is killed
    // or its deadline passed: a kill ends Start at once, as in every phase.
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = {
        let (stop, cancel, at) = (stop.clone(), deadline.cancel.clone(), deadline.at);
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep_until(at.into()) => {}
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    let verifying = verify.map(|v| {
        let cancel = deadline.cancel.clone();
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let threads = if v.beside_criu {
                verify_threads_beside_criu()
            } else {
                DIGEST_THREADS
            };
            let verified = content::verify_except_until(
                &v.dir,
                &v.contents,
                threads,
                &v.hashed_elsewhere,
                &stop,
            );
            if verified.is_err() {
                cancel.cancel();
            }
            verified.map(|()| started.elapsed())
        })
    });
    let (ran, verified) = if beside_criu {
        let ran = job.run().await;
        (ran, joined(verifying, &deadline).await?)
    } else {
        // First every byte, then CRIU: a damaged artifact never reaches it.
        match joined(verifying, &deadline).await? {
            Ok(took) => (job.run().await, Ok(took)),
            Err(e) => (
                Err(Error::FailedPrecondition("restore: not run".into())),
                Err(e),
            ),
        }
    };
    stopper.abort();
    let (ran, verify_time) = match (ran, verified) {
        (ran, Ok(took)) => (ran, took),
        (Ok(()), Err(e)) => {
            // Restored but damaged: the stopped tree goes with runc's state.
            job.undo().await;
            (Err(e), Duration::ZERO)
        }
        // The damage is named, whatever CRIU made of it.
        (Err(_), Err(e)) => (Err(e), Duration::ZERO),
    };
    let restored_in = t.elapsed();
    if let Some(shm) = &host_shm {
        // CRIU has opened what it needed of them.
        shm::remove_link_remaps(shm);
    }
    let placed = job.placed;
    let (id, pid, snapshot, bundle) = {
        let mut c = handle.lock().await;
        match c.finish_restore(job, ran).await {
            Ok(pid) => {
                shared.watch(&c.id, "", pid, mark);
                if c.snapshot.as_ref().is_some_and(|s| s.mode == Mode::Restore) {
                    resume(pid);
                }
                (c.id.clone(), pid, c.snapshot.clone(), c.bundle.clone())
            }
            Err(e) => return Err(fail(&shared, &mut c, e).await),
        }
    };
    if let Some(s) = snapshot.filter(|s| s.mode == Mode::Restore) {
        if !s.gpus.is_empty() {
            if let Err(e) = gpu_resumed(&bundle, pid, &s).await {
                let mut c = handle.lock().await;
                return Err(fail(&shared, &mut c, e).await);
            }
        }
        match activate(&s, &id, pid, &deadline, restored_in).await {
            Ok(timings) => {
                let timings = RestoreTimings {
                    verify: verify_time,
                    pages: placed,
                    ..timings
                };
                info!("{id}: restored copy validated and listening: {timings:?}");
                timings.record(&bundle);
            }
            Err(e) => {
                let mut c = handle.lock().await;
                return Err(fail(&shared, &mut c, e).await);
            }
        }
    }
    let mut c = handle.lock().await;
    if deadline.cancel.is_cancelled() {
        let e = Error::Cancelled(format!("restore: {id}: cancelled: the task was killed"));
        return Err(fail(&shared, &mut c, e).await);
    }
    if let Some(exit) = c.init.exit() {
        let e = Error::FailedPrecondition(format!(
            "restore: {id}: the copy exited ({}) before it was started",
            exit.code
        ));
        return Err(fail(&shared, &mut c, e).await);
    }
    c.started();
    if let Some(s) = c.snapshot.as_mut() {
        s.release_lock();
    }
    shared.watch_oom(&c.id, pid);
    publish_start(&shared, &c).await;
    Ok(pid)
}

/// After the restore of a GPU container: CRIU reports success even when its
/// CUDA plugin failed to resume a GPU (the copy would hang until the
/// deadline), so its restore log is read, and every process cuda-checkpoint
/// knows must be running again. Fails at once, naming the GPU step.
async fn gpu_resumed(bundle: &std::path::Path, pid: i32, s: &Snapshot) -> Result<()> {
    let log = bundle.join("criu-work").join("restore.log");
    let tool = s.tools.cuda_checkpoint.clone();
    tokio::task::spawn_blocking(move || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        criu::check_cuda_resume(&text)
            .map_err(|e| Error::FailedPrecondition(format!("restore: GPU resume: {e} ({})", log.display())))?;
        let members = listener::container_pids(pid).unwrap_or_else(|_| vec![pid]);
        for p in members {
            if let Ok(state) = cuda::cuda_state(&tool, p) {
                if !state.starts_with("running") {
                    return Err(Error::FailedPrecondition(format!(
                        "restore: GPU resume: pid {p} is {state} after the restore (cuda-checkpoint --get-state)"
                    )));
                }
            }
        }
        Ok(())
    })
    .await
    .map_err(|e| Error::Other(format!("restore: GPU resume: {e}")))?
}

/// Hashing threads while CRIU restores: one core is left to CRIU, which
/// places pages with one thread (on 2 cores, two hashing threads beside it
/// made the CRIU phase of a 1 GiB restore ~1.2-1.4x a stock runc restore;
/// one BLAKE3 thread still hashes faster than CRIU places the pages).
fn verify_threads_beside_criu() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    cores.saturating_sub(1).clamp(1, DIGEST_THREADS)
}

/// The verification's result: how long it took, or the damage it found.
async fn joined(
    verifying: Option<tokio::task::JoinHandle<std::result::Result<Duration, ArtifactError>>>,
    deadline: &Deadline,
) -> Result<Result<Duration>> {
    match verifying {
        None => Ok(Ok(Duration::ZERO)),
        Some(h) => Ok(h
            .await
            .map_err(|e| Error::Other(format!("restore: verify: {e}")))?
            .map_err(|e| match e {
                // A kill or the deadline stopped it: that is the error.
                ArtifactError::Stopped(m) => deadline.fail(format!("restore: verify: {m}")),
                e => artifact_error("restore: verify", e),
            })),
    }
}

/// Lets the restored tree run: CRIU left every process of it stopped.
fn resume(pid: i32) {
    let members = listener::container_pids(pid).unwrap_or_else(|_| vec![pid]);
    for p in members {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGCONT,
        );
    }
}

/// Wakes the restored copy and waits until it validated and listens.
async fn activate(
    s: &Snapshot,
    id: &str,
    pid: i32,
    deadline: &Deadline,
    restored_in: Duration,
) -> Result<RestoreTimings> {
    let (dir, id, host, port) = (
        s.control_dir.clone(),
        id.to_string(),
        s.plan.host.clone(),
        s.plan.port,
    );
    let (profile, deadline, oracle) = (s.profile.clone(), deadline.clone(), s.oracle.clone());
    let (api_key, owner) = (s.api_key.clone(), s.control_owner.0);
    let woken = Instant::now();
    let validated = tokio::task::spawn_blocking(move || {
        match (profile.ready_path(&dir), profile.release_path(&dir)) {
            (Some(ready), Some(release)) => {
                let started = Instant::now();
                barrier::release_and_check(
                    "restore", &ready, &release, host, port, pid, &deadline, oracle, api_key,
                )
                .map(|()| started.elapsed())
            }
            _ => activate_copy(&dir, owner, &id, host, port, pid, &deadline, oracle),
        }
    })
    .await
    .map_err(|e| Error::Other(format!("restore: activation: {e}")))??;
    Ok(RestoreTimings {
        preflight: s.preflight,
        verify: Duration::ZERO,
        criu_restore: restored_in,
        activation: validated,
        listener: woken.elapsed().saturating_sub(validated),
        rootfs: s.rootfs_unpack,
        pages: None,
    })
}

/// A restore that failed: nothing of it runs or is seen. The artifact lock
/// goes, the error is recorded in the bundle, the copy is killed (its exit
/// comes through the reaper) or, with no process, the init is recorded as
/// killed and its exit published here.
async fn fail(shared: &Shared, c: &mut Container, e: Error) -> Error {
    error!("{}: {e}", c.id);
    if let Some(s) = c.snapshot.as_mut() {
        s.release_lock();
    }
    record_error(&c.bundle, &c.id, &e);
    if let Some(exit) = c.start_failed().await {
        shared.publish_exit(&c.id, "", 0, exit).await;
    }
    e
}
