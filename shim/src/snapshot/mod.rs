//! Snapshot plans: a container annotated for `create` is cold-started, captured
//! with runc + CRIU once its engine is capture-ready, and published as an
//! artifact; a container annotated for `restore` is restored from one and
//! becomes visible only after its engine validated its canary and listens.

pub mod argparse;
pub mod barrier;
pub mod canary;
pub mod criu;
pub mod criu_image;
pub mod cuda;
pub mod fetch;
pub mod fsnotify;
pub mod inventory;
pub mod journal;
pub mod listener;
pub mod memory;
pub mod pages;
pub mod plan;
pub mod prepare;
pub mod proc_fds;
pub mod profile;
pub mod restore;
pub mod restore_oom;
pub mod rootfs;
pub mod shm;
pub mod sock_diag;
pub mod spec;
pub mod tcp_table;
pub mod tenant;
pub mod vllm_command;

pub use vsnap_protocol::{CONTROL_MOUNT, SNAPSHOT_CONFIG_ENV};

/// Threads hashing an artifact's files (capture and restore): this is
/// what a 2-core machine has (BLAKE3 runs near 3.3 GB/s on one of them).
pub const DIGEST_THREADS: usize = 2;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::sync::Arc;
use vsnap_artifact::{
    self as artifact, ArtifactError, ArtifactLock, ArtifactName, Tools, Workload,
};

use crate::deadline::Deadline;
use crate::error::Error;
use plan::{Mode, Plan};
use profile::Profile;

/// A container's snapshot plan, resolved at create.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub plan: Plan,
    /// The artifact's name: from the annotation, or derived from the
    /// workload's identity for `auto`.
    pub artifact: ArtifactName,
    /// Create or Restore (Auto is resolved at create).
    pub mode: Mode,
    pub root: PathBuf,
    pub control_dir: PathBuf,
    /// The (uid, gid) the control dir and the files vsnap puts in it belong
    /// to: the engine's (`process.user`, as the host sees it), so that an
    /// engine that is not root can use it.
    pub control_owner: (u32, u32),
    pub capture_timeout: Duration,
    pub activation_timeout: Duration,
    /// Bound on `runc checkpoint` (checkpoint_timeout_s).
    pub checkpoint_timeout: Duration,
    /// The artifact lock: exclusive while creating, shared while restoring.
    pub lock: Option<Arc<ArtifactLock>>,
    /// What identifies the workload (taken from the spec at create); its
    /// tenant is the container's.
    pub workload: Workload,
    /// Whose artifact this is: the container's tenant, or for a restore of
    /// an artifact shared with it, the owner's (the fingerprint hook checks
    /// the manifest's owner against it).
    pub owner: vsnap_artifact::Tenant,
    /// The binaries the artifact depends on.
    pub tools: Tools,
    /// The fleet's shared fingerprint key (`fleet_fingerprint_key`), which
    /// keyed `workload`'s secret fingerprints instead of the host key.
    pub fingerprint_key: Option<PathBuf>,
    /// How the engine speaks with vsnap.
    pub profile: Profile,
    /// The key the engine's API requires (`--api-key`, `VLLM_API_KEY`),
    /// for vsnap's HTTP canary of the barrier profile. Redacted in Debug.
    pub api_key: Option<canary::ApiKey>,
    /// Time spent validating the artifact at create (a restore's preflight).
    pub preflight: Duration,
    /// When the shim's Create of the container began.
    pub create_began: std::time::SystemTime,
    /// The container's GPUs, when it has NVIDIA devices.
    pub gpus: Vec<cuda::Gpu>,
    /// The host folder mounted at /dev/shm, when it is one.
    pub host_shm: Option<PathBuf>,
    /// For a restore: the canary answer from the MAC'd manifest, the only
    /// oracle a copy is held to (never a file of the control dir).
    pub oracle: Option<vsnap_protocol::Oracle>,
    /// For a restore with `verify_contents`: the digests every file of the
    /// artifact is checked against while CRIU restores.
    pub contents: Option<vsnap_artifact::Contents>,
    /// vsnap's page server places the restore's memory (pages/).
    pub place_pages: bool,
    /// Where an `auto` create pushes its artifact once published
    /// (`push_created` and `vsnap.io/artifact-ref`; fetch.rs).
    pub push_to: Option<fetch::PushTarget>,
    /// The container's writable layer (rootfs.rs): what a capture carries.
    pub layer: rootfs::WritableLayer,
    /// `rootfs_diff_limit_bytes`.
    pub layer_limit: u64,
    /// `donor_stop_grace_s`.
    pub donor_stop_grace: Duration,
    /// The spec as read at create (its mounts: the volumes).
    pub spec: serde_json::Value,
    /// Files of the artifact checked at create already (the carried layer,
    /// unpacked before Start): Start's verification skips them.
    pub verified_at_create: Vec<String>,
    /// How long checking and unpacking the carried layer took.
    pub rootfs_unpack: Duration,
    /// For a restore: what the artifact's tree held in memory at capture
    /// (its manifest's, when recorded), named when the restore runs out of
    /// memory.
    pub memory: Option<vsnap_artifact::Memory>,
}

/// Where a restore's Start spent its time, written to the bundle as
/// `vsnap-restore.json` (for benchmarks and diagnosis) and logged.
#[derive(Debug)]
pub struct RestoreTimings {
    /// When the shim's Create began; the timings are recorded (now) just
    /// before Start answers. A benchmark places them against `ctr`'s own
    /// clock: what came before and after is ctr's and containerd's time.
    pub create_began: std::time::SystemTime,
    pub preflight: Duration,
    /// Hashing every file, alongside CRIU's restore.
    pub verify: Duration,
    pub criu_restore: Duration,
    pub activation: Duration,
    pub listener: Duration,
    /// Checking and unpacking the carried writable layer (at create).
    pub rootfs: Duration,
    /// What vsnap's page server placed (inside `criu_restore`).
    pub pages: Option<pages::Placed>,
}

impl RestoreTimings {
    pub fn record(&self, bundle: &Path) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        let record = serde_json::json!({
            "create_began_unix_s": unix(self.create_began),
            "recorded_unix_s": unix(std::time::SystemTime::now()),
            "preflight_ms": ms(self.preflight),
            "verify_ms": ms(self.verify),
            "criu_restore_ms": ms(self.criu_restore),
            "activation_ms": ms(self.activation),
            "listener_ms": ms(self.listener),
            "rootfs_ms": ms(self.rootfs),
            "page_fill_ms": self.pages.map(|p| ms(p.fill)),
            "pages_placed_bytes": self.pages.map(|p| p.bytes),
            "page_faults_served": self.pages.map(|p| p.faults),
            "page_server_tasks": self.pages.map(|p| p.tasks),
        });
        let tmp = bundle.join(".vsnap-restore.json");
        let _ = std::fs::write(&tmp, record.to_string())
            .and_then(|_| std::fs::rename(&tmp, bundle.join("vsnap-restore.json")));
    }
}

impl Snapshot {
    /// Whether CRIU leaves the restored tree stopped (`leave-stopped`)
    /// until vsnap verified every byte beside it. Not with GPUs: CRIU stops
    /// the tasks before its late device hook, in which the CUDA plugin must
    /// run each process's restore thread; a GPU restore verifies first.
    pub fn holds_stopped(&self) -> bool {
        self.mode == Mode::Restore && self.gpus.is_empty()
    }

    /// The activation deadline, from now. A restore's Start runs CRIU's
    /// restore and then the activation within this one deadline.
    pub fn activation_deadline(&self) -> Deadline {
        let source = if self.plan.activation_timeout.is_some() {
            plan::ACTIVATION_TIMEOUT
        } else if self.gpus.is_empty() {
            "activation_timeout_s"
        } else {
            "gpu_activation_timeout_s"
        };
        Deadline::new(
            Instant::now() + self.activation_timeout,
            format!(
                "the activation timeout of {}s ({source})",
                self.activation_timeout.as_secs()
            ),
        )
    }

    pub fn artifact_dir(&self) -> PathBuf {
        artifact::path(&self.root, self.artifact.as_str())
    }

    /// Lets go of the container's hold on the artifact lock once Start is
    /// done: a restore no longer reads the artifact, and a capture holds its
    /// own clone until it has published or failed.
    pub fn release_lock(&mut self) {
        drop(self.lock.take());
    }

    pub fn cleanup(&self) {
        remove_control_dir(&self.control_dir);
    }
}

/// Leaves `vsnap-error.json` in the bundle: the container, the phase that
/// failed (when known), the error of its failed capture or restore and,
/// when CRIU ran, where its log was kept ([`keep_criu_log`]).
/// Whole or absent: never half written.
pub fn record_error(
    bundle: &Path,
    id: &str,
    phase: Option<&str>,
    e: &Error,
    criu_log: Option<&Path>,
) {
    let mut record = serde_json::json!({"container": id, "error": e.to_string()});
    if let Some(phase) = phase {
        record["phase"] = phase.into();
    }
    if let Some(log) = criu_log {
        record["criu_log"] = log.display().to_string().into();
    }
    let (tmp, path) = (
        bundle.join(".vsnap-error.json.tmp"),
        bundle.join("vsnap-error.json"),
    );
    if let Err(e) =
        std::fs::write(&tmp, record.to_string()).and_then(|_| std::fs::rename(&tmp, &path))
    {
        log::error!("{id}: write {}: {e}", path.display());
    }
}

/// Keeps CRIU's `log` of a failed `kind` ("dump" or "restore") of the
/// plan's artifact by container `id` under the artifact root, where it
/// outlives the task (vsnap_artifact::criu_logs); the kept file, or `None`
/// (no log: CRIU never ran; a failure to keep it is logged).
pub fn keep_criu_log(s: &Snapshot, id: &str, kind: &str, log: &Path) -> Option<PathBuf> {
    if !log.exists() {
        return None;
    }
    let now = time::OffsetDateTime::now_utc();
    let stamp = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.millisecond()
    );
    match vsnap_artifact::criu_logs::keep(&s.root, &stamp, s.artifact.as_str(), id, kind, log) {
        Ok(kept) => {
            log::warn!("{id}: CRIU's {kind} log kept as {}", kept.display());
            Some(kept)
        }
        Err(e) => {
            log::error!("{id}: keep CRIU's log {}: {e}", log.display());
            None
        }
    }
}

/// An artifact error as the shim reports it, with its phase.
pub fn artifact_error(phase: &str, e: ArtifactError) -> Error {
    match e {
        ArtifactError::NotFound(_) => Error::NotFound(format!("{phase}: {e}")),
        ArtifactError::Io { context, source } => Error::io(format!("{phase}: {context}"), source),
        e => Error::FailedPrecondition(format!("{phase}: {e}")),
    }
}

pub(crate) fn remove_control_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}
