//! The background half of the `create` plan: once the cold-started engine is
//! capture-ready, take the inventory, checkpoint the tree with runc + CRIU
//! (leaving it running), publish the artifact, then wake the donor or stop it.
//! Any failure publishes nothing, leaves an error record naming the phase,
//! and kills the task so it exits non-zero.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use log::{error, info};
use vsnap_protocol::{wait_for, ActivationKind, CaptureReady, ControlDir, Expect};

use super::inventory;
use super::plan::AfterCapture;
use super::restore::{activate_and_probe, is_alive};
use super::Snapshot;
use super::{artifact_error, barrier, criu, cuda, rootfs, shm};
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::runc::{CheckpointFlags, Runc};
use vsnap_artifact::rootfs as artifact_rootfs;
use vsnap_artifact::{
    ensure_root, layout, HostIdentity, HostKey, Manifest, Staging, Timings, SCHEMA_VERSION,
};
use vsnap_protocol::{new_uuid4_hex, wait_ready, Oracle};

/// Threads hashing an artifact's files (capture and restore): this is
/// what a 2-core machine has (BLAKE3 runs near 3.3 GB/s on one of them).
pub const DIGEST_THREADS: usize = 2;

pub struct Capture {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Runc,
    pub pid: i32,
    pub terminal: bool,
    pub snapshot: Snapshot,
    pub started: Instant,
}

impl Capture {
    /// Runs the capture to the end; on failure records it and kills the task.
    pub async fn run(self) {
        match self.capture().await {
            Ok(path) => {
                info!("{}: artifact published at {}", self.id, path.display());
                if let Some(target) = self.snapshot.push_to.clone() {
                    // After this capture (and its lock) is gone.
                    let id = self.id.clone();
                    drop(self);
                    target.push_in_background(id);
                }
            }
            Err(e) => {
                error!("{}: {e}", self.id);
                super::record_error(&self.bundle, &self.id, None, &e);
                let _ = self.runc.kill(&self.id, libc::SIGKILL as u32, true).await;
            }
        }
    }

    async fn capture(&self) -> Result<PathBuf> {
        let s = &self.snapshot;
        let plan = &s.plan;
        let (dir_path, owner, pid) = (s.control_dir.clone(), s.control_owner.0, self.pid);
        let deadline = Instant::now() + s.capture_timeout;
        let profile = s.profile.clone();
        let ready = blocking(move || -> Result<(String, Option<CaptureReady>, Oracle)> {
            let waiting = |what: &str, e: String| {
                Error::FailedPrecondition(format!("capture: waiting for {what}: {e}"))
            };
            match profile.ready_path(&dir_path) {
                // The barrier: the ready file holds the canary answer alone.
                Some(ready) => {
                    let r = wait_ready(&ready, deadline, &mut || is_alive(pid))
                        .map_err(|e| waiting("the ready file", e.to_string()))?;
                    let id = new_uuid4_hex().map_err(|e| Error::io("capture: capture id", e))?;
                    Ok((id, None, r.value.oracle()))
                }
                None => {
                    let dir = ControlDir::open_owned_by(&dir_path, owner, Expect::AnyContents)
                        .map_err(|e| {
                            Error::FailedPrecondition(format!("capture: control dir: {e}"))
                        })?;
                    wait_for::<CaptureReady>(&dir, deadline, &mut || is_alive(pid))
                        .map(|r| {
                            (
                                r.value.capture_id.clone(),
                                Some(r.value.clone()),
                                r.value.oracle,
                            )
                        })
                        .map_err(|e| waiting("capture-ready", e.to_string()))
                }
            }
        })
        .await?;
        let (capture_id, capture_ready, oracle) = ready;
        let cold_start = self.started.elapsed();
        info!(
            "{}: capture-ready after {cold_start:?} (capture {capture_id})",
            self.id
        );

        let t = Instant::now();
        let pids = self.runc.ps(&self.id).await?;
        inventory::check_no_io_uring(&pids)?;
        inventory::check_no_outside_tcp(&pids)?;
        let gpu = !s.gpus.is_empty();
        if gpu {
            cuda::check_single_gpu(&cuda::cuda_holders(&pids))
                .map_err(|e| Error::FailedPrecondition(format!("capture: inventory: {e}")))?;
        }
        {
            let (pids, tool) = (pids.clone(), s.tools.cuda_checkpoint.clone());
            blocking(move || {
                let is_cuda = |pid: i32| cuda::cuda_restore_tid(&tool, pid).map(drop);
                let cuda_process: Option<&dyn Fn(i32) -> std::result::Result<(), String>> =
                    gpu.then_some(&is_cuda);
                inventory::check_dumpable_devices(&pids, cuda_process)
            })
            .await?;
        }
        let volume_files = {
            let (pids, spec) = (pids.clone(), s.spec.clone());
            blocking(move || rootfs::open_volume_files(&pids, &spec, super::CONTROL_MOUNT)).await?
        };
        let inventory_time = t.elapsed();

        ensure_root(&s.root).map_err(|e| artifact_error("capture", e))?;
        let key =
            HostKey::load_or_create(&s.root).map_err(|e| artifact_error("capture: host key", e))?;
        let staging =
            Staging::new(&s.root, &s.artifact).map_err(|e| artifact_error("capture", e))?;
        let t = Instant::now();
        let flags = CheckpointFlags {
            leave_running: true,
            ..criu::snapshot_flags(self.terminal)
        };
        let deadline = Deadline::new(
            Instant::now() + s.checkpoint_timeout,
            format!(
                "the checkpoint timeout of {}s (checkpoint_timeout_s)",
                s.checkpoint_timeout.as_secs()
            ),
        );
        // Right before the dump: CRIU freezes the tree within moments of
        // runc starting it, so the engine's timers were set on these clocks.
        let clocks = vsnap_artifact::Clocks::now();
        let dumped = self
            .runc
            .checkpoint(
                &self.id,
                &staging.images(),
                &staging.work(),
                &flags,
                Some(&deadline),
            )
            .await;
        if let Err(e) = dumped {
            if matches!(e, Error::DeadlineExceeded(_)) {
                // runc and CRIU are gone; the tree may be frozen, its GPU
                // locked: let it go on before it is stopped.
                self.thaw(&pids).await;
            }
            // runc's own message is generic; CRIU's log says what it could not dump.
            let mut criu = criu::log_errors(&staging.work().join("dump.log"));
            criu.push_str(&criu::dump_hint(&criu));
            return Err(match e {
                Error::DeadlineExceeded(m) => {
                    Error::DeadlineExceeded(format!("capture: {m}{criu}"))
                }
                e => Error::Other(format!("capture: {e}{criu}")),
            });
        }
        if gpu {
            let log = std::fs::read_to_string(staging.work().join("dump.log")).unwrap_or_default();
            criu::check_cuda_plugin_ran(&log)
                .map_err(|e| Error::FailedPrecondition(format!("capture: checkpoint: {e}")))?;
        }
        if let Some(host_shm) = s.host_shm.clone() {
            let to = staging.dir.join(shm::ARTIFACT_DIR);
            blocking(move || shm::carry(&host_shm, &to)).await?;
        }
        let packing = Instant::now();
        let layer = match s.layer.to_carry() {
            Err(record) => record,
            Ok(upper) => {
                let (upper, dir, limit) = (
                    upper.to_path_buf(),
                    staging.dir.join(artifact_rootfs::DIR),
                    s.layer_limit,
                );
                blocking(move || {
                    std::fs::create_dir(&dir).map_err(|e| {
                        Error::io(format!("capture: rootfs: create {}", dir.display()), e)
                    })?;
                    rootfs::pack(&upper, &dir.join(artifact_rootfs::UPPER_TAR), limit)
                })
                .await?
            }
        };
        let rootfs_time = packing.elapsed();
        info!("{}: writable layer in {rootfs_time:?}: {layer:?}", self.id);
        let checkpoint_time = t.elapsed();

        let t = Instant::now();
        layout::copy_files(&s.control_dir, &staging.control())
            .map_err(|e| artifact_error("capture", e))?;
        let dir = staging.dir.clone();
        let contents = blocking(move || {
            vsnap_artifact::content::digest(&dir, DIGEST_THREADS)
                .map_err(|e| artifact_error("capture: content digests", e))
        })
        .await?;
        info!("{}: content digests in {:?}", self.id, t.elapsed());
        let mut manifest = Manifest {
            schema_version: SCHEMA_VERSION,
            name: s.artifact.clone(),
            created_at: time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            capture_id,
            oracle,
            source_container: self.id.clone(),
            image_bytes: layout::bytes_under(&staging.images()),
            contents,
            timings_ms: Timings {
                cold_start_to_capture_ready: ms(cold_start),
                inventory: ms(inventory_time),
                checkpoint: ms(checkpoint_time),
                rootfs: ms(rootfs_time),
            },
            host: HostIdentity {
                gpus: s.gpus.clone(),
                ..HostIdentity::probe_cached(&s.tools, env!("CARGO_PKG_VERSION"), Some(&s.root))
            },
            workload: s.workload.clone(),
            clocks: Some(clocks),
            origin: None,
            rootfs: Some(artifact_rootfs::Rootfs {
                layer,
                open_files: volume_files,
            }),
            mac: String::new(),
        };
        manifest.seal(&key);
        let root = s.root.clone();
        let published = blocking(move || {
            staging
                .publish(&root, &manifest.to_bytes())
                .map_err(|e| artifact_error("capture: publish", e))
        })
        .await?;
        info!("{}: published in {:?}", self.id, t.elapsed());

        match plan.after_capture {
            AfterCapture::Serve => {
                let (dir, host, port, id) = (
                    s.control_dir.clone(),
                    plan.host.clone(),
                    plan.port,
                    self.id.clone(),
                );
                let deadline = s.activation_deadline();
                let (profile, api_key) = (s.profile.clone(), s.api_key.clone());
                blocking(move || match capture_ready {
                    Some(ready) => activate_and_probe(
                        "capture: donor",
                        &dir,
                        owner,
                        &ready,
                        ActivationKind::Donor,
                        &id,
                        host,
                        port,
                        pid,
                        &deadline,
                    )
                    .map(drop),
                    None => barrier::release_and_check(
                        "capture: donor",
                        &profile.ready_path(&dir).expect("a barrier profile"),
                        &profile.release_path(&dir).expect("a barrier profile"),
                        host,
                        port,
                        pid,
                        &deadline,
                        None,
                        api_key,
                    ),
                })
                .await?;
                info!("{}: donor serving", self.id);
            }
            AfterCapture::Exit => self.stop_donor().await?,
        }
        Ok(published)
    }
}

impl Capture {
    /// `after-capture=exit`: the donor asked to stop the way its protocol
    /// allows, then told, then made to. The barrier gets its abort marker
    /// first (vLLM's server exits without binding: it installs no SIGTERM
    /// handler, and as PID 1 of its namespace the kernel drops SIGTERM);
    /// then every process gets SIGTERM; past `donor_stop_grace_s` after
    /// each step, SIGKILL. The task reports the donor's own exit.
    async fn stop_donor(&self) -> Result<()> {
        let s = &self.snapshot;
        let grace = s.donor_stop_grace;
        if let Some(release) = s.profile.release_path(&s.control_dir) {
            if let Err(e) = vsnap_protocol::abort_release(&release) {
                info!("{}: donor: abort marker: {e}", self.id);
            } else if exits_within(self.pid, grace).await {
                info!("{}: donor exited after the abort marker", self.id);
                return Ok(());
            }
        }
        if let Err(e) = self.runc.kill(&self.id, libc::SIGTERM as u32, true).await {
            if !is_alive(self.pid) {
                return Ok(());
            }
            return Err(e);
        }
        if exits_within(self.pid, grace).await {
            info!("{}: donor exited after SIGTERM", self.id);
            return Ok(());
        }
        info!(
            "{}: donor still running {}s after SIGTERM (donor_stop_grace_s): SIGKILL",
            self.id,
            grace.as_secs()
        );
        match self.runc.kill(&self.id, libc::SIGKILL as u32, true).await {
            Err(_) if !is_alive(self.pid) => Ok(()),
            r => r,
        }
    }

    /// After a dump killed past its deadline: the tree thawed (CRIU froze
    /// its cgroup), every process continued, and for GPUs every process
    /// cuda-checkpoint reports locked or checkpointed resumed. Best effort.
    async fn thaw(&self, pids: &[i32]) {
        if let Err(e) = self.runc.resume(&self.id).await {
            info!("{}: thaw after the killed dump: {e}", self.id);
        }
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
        if !self.snapshot.gpus.is_empty() {
            let (tool, pids) = (self.snapshot.tools.cuda_checkpoint.clone(), pids.to_vec());
            if let Ok(done) =
                tokio::task::spawn_blocking(move || cuda::resume_gpu_best_effort(&tool, &pids))
                    .await
            {
                info!("{}: GPU after the killed dump: {done:?}", self.id);
            }
        }
    }
}

/// Whether `pid` is gone (reaped by the shim) within `grace`.
async fn exits_within(pid: i32, grace: Duration) -> bool {
    let until = Instant::now() + grace;
    while is_alive(pid) {
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Other(format!("snapshot: {e}")))?
}
