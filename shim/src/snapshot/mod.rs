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
pub mod inventory;
pub mod listener;
pub mod pages;
pub mod plan;
pub mod profile;
pub mod restore;
pub mod rootfs;
pub mod shm;
pub mod spec;
pub mod tcp_table;
pub mod vllm_command;

pub use vsnap_protocol::{CONTROL_MOUNT, SNAPSHOT_CONFIG_ENV};

/// Threads hashing an artifact's files (capture and restore): this is
/// what a 2-core machine has (BLAKE3 runs near 3.3 GB/s on one of them).
pub const DIGEST_THREADS: usize = 2;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use std::collections::HashMap;
use std::sync::Arc;
use vsnap_artifact::{
    self as artifact, layout, ArtifactError, ArtifactLock, HostIdentity, Manifest, Tools, Workload,
};
use vsnap_config::{PagePlacement, RuntimeConfig};
use vsnap_protocol::ControlDir;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use plan::{Mode, Plan};
use profile::Profile;

/// A container's snapshot plan, resolved at create.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub plan: Plan,
    /// The artifact's name: from the annotation, or derived from the
    /// workload's identity for `auto`.
    pub artifact: String,
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
    /// What identifies the workload (taken from the spec at create).
    pub workload: Workload,
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
}

/// Where a restore's Start spent its time, written to the bundle as
/// `vsnap-restore.json` (for benchmarks and diagnosis) and logged.
#[derive(Debug)]
pub struct RestoreTimings {
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
        let record = serde_json::json!({
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
    /// Reads the plan from the bundle's annotations and prepares the
    /// container for it: the control dir, the spec edits and, for a restore,
    /// the validated artifact. `None`: the container runs plain.
    /// `settings` are the `vsnap.io/` annotations merged with the labels.
    pub fn prepare(
        bundle: &Path,
        id: &str,
        namespace: &str,
        config: &RuntimeConfig,
        settings: &HashMap<String, String>,
        image_digest: Option<&str>,
        layer: rootfs::WritableLayer,
    ) -> Result<Option<Self>> {
        let started = Instant::now();
        let Some(mut plan) = plan::from_annotations(settings)? else {
            return Ok(None);
        };
        let root = config.artifact_root.clone();
        let preflight = |e| artifact_error("restore: preflight", e);
        artifact::ensure_root(&root).map_err(|e| artifact_error("create: artifact root", e))?;
        let spec = spec::read(bundle)?;
        let layer = match layer {
            rootfs::WritableLayer::Shared => match spec["root"]["path"].as_str() {
                Some(root) => rootfs::WritableLayer::of_root_folder(
                    &bundle.join(root),
                    &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
                ),
                None => rootfs::WritableLayer::Shared,
            },
            other => other,
        };
        let key = artifact::FingerprintKey::load_or_create(
            &root,
            config.fleet_fingerprint_key.as_deref(),
        )
        .map_err(|e| artifact_error("create: fingerprint key", e))?;
        let workload = Workload {
            image_digest: image_digest.unwrap_or_default().to_string(),
            namespace: namespace.to_string(),
            ..Workload::from_spec(&spec, CONTROL_MOUNT, &key)
        };
        let argv = spec::args(&spec);
        let profile = Profile::detect(plan.engine_protocol.as_deref(), &argv)?;
        let gpus = gpus_of(&spec, config)?;
        if !gpus.is_empty() && !settings.contains_key(plan::AFTER_CAPTURE) {
            // A donor that goes on serving keeps its GPU memory: a restore on
            // the same GPU would run out of it.
            plan.after_capture = plan::AfterCapture::Exit;
        }
        let env: Vec<String> = spec["process"]["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        vllm_command::check_vllm_command(&argv)?;
        for missing in vllm_command::check_vllm_env(&argv, &env)? {
            log::warn!("{id}: vLLM without {missing}: a capture may fail or a copy misbehave (docs/gpu-hosts.md)");
        }
        // `auto` without a name: the workload's identity names the artifact.
        let name = plan
            .artifact
            .clone()
            .unwrap_or_else(|| format!("auto-{}", workload.key()));
        let mode = match plan.mode {
            Mode::Auto => match Manifest::load_unverified(&root, &name) {
                Ok(_) => Mode::Restore,
                Err(ArtifactError::NotFound(_)) => Mode::Create,
                Err(e) => return Err(preflight(e)),
            },
            m => m,
        };
        let tools = Tools {
            runc: config.runc_binary.clone(),
            criu: config.criu_binary.clone(),
            cuda_plugin: config.cuda_plugin_dir.join("cuda_plugin.so"),
            cuda_checkpoint: config.cuda_checkpoint.clone(),
        };
        let mut oracle = None;
        let mut contents = None;
        let mut carried = None;
        let mut manifest_contents = None;
        let lock = match mode {
            Mode::Restore => {
                let lock = ArtifactLock::shared(&root, &name).map_err(preflight)?;
                let manifest = Manifest::load_verified(&root, &name).map_err(preflight)?;
                let mut live =
                    HostIdentity::probe_cached(&tools, env!("CARGO_PKG_VERSION"), Some(&root));
                live.gpus = artifact::gpu::entries(&gpus);
                // Compatibility, not identity (artifact/src/compat.rs): the
                // MAC above already says whose artifact this is.
                let host = artifact::compat::compare(&manifest.host, &live);
                let mut diff = host.incompatible;
                diff.extend(manifest.workload.diff(&workload));
                if !diff.is_empty() {
                    return Err(preflight(ArtifactError::Mismatch(diff.join("; "))));
                }
                if let Some(captured) = &manifest.clocks {
                    check_clocks(id, captured)?;
                }
                if !host.tolerated.is_empty() {
                    log::info!(
                        "{id}: artifact {name}: host differences a restore allows: {}",
                        host.tolerated.join("; ")
                    );
                }
                // The file set and sizes now (a truncated or missing file
                // fails the create at once); every byte's digest at Start,
                // alongside CRIU's restore, which leaves the tree stopped
                // until the digests matched (start.rs).
                let dir = artifact::path(&root, &name);
                vsnap_artifact::content::verify_sizes(&dir, &manifest.contents)
                    .map_err(preflight)?;
                if config.verify_contents {
                    contents = Some(manifest.contents.clone());
                }
                if let Some(r) = &manifest.rootfs {
                    rootfs::check_volume_files(&r.open_files, &spec)?;
                    carried = Some(r.layer.clone());
                }
                oracle = Some(manifest.oracle);
                manifest_contents = Some(manifest.contents);
                lock
            }
            _ => match ArtifactLock::exclusive(&root, &name) {
                Ok(lock) => {
                    check_replace(&root, &name, namespace, config.allow_artifact_replace)?;
                    lock
                }
                Err(ArtifactError::Locked(name)) => {
                    // Never two writers: this one starts cold and captures nothing.
                    log::warn!("{id}: artifact {name} is being written by another container: starting cold without a capture");
                    return Ok(None);
                }
                Err(e) => return Err(artifact_error("create", e)),
            },
        };
        let control_dir = root.join(".control").join(format!("{namespace}-{id}"));
        remove_control_dir(&control_dir);
        let control_owner = spec::process_owner(&spec)?;
        ControlDir::create_owned_by(&control_dir, control_owner.0, Some(control_owner.1))
            .map_err(|e| Error::FailedPrecondition(format!("create: control dir: {e}")))?;
        // Only where the tree is held stopped: the page server does not
        // follow a running tree's address space (pages/).
        let place_pages = mode == Mode::Restore
            && gpus.is_empty()
            && config.page_placement == PagePlacement::Parallel;
        let push_to = fetch::PushTarget::of(config, &plan, mode);
        let mut s = Snapshot {
            capture_timeout: plan
                .capture_timeout
                .unwrap_or(Duration::from_secs(config.capture_timeout_s)),
            activation_timeout: plan.activation_timeout.unwrap_or(Duration::from_secs(
                if gpus.is_empty() {
                    config.activation_timeout_s
                } else {
                    config.gpu_activation_timeout_s
                },
            )),
            checkpoint_timeout: Duration::from_secs(config.checkpoint_timeout_s),
            plan,
            artifact: name,
            mode,
            root,
            control_dir,
            control_owner,
            lock: Some(Arc::new(lock)),
            workload,
            tools,
            fingerprint_key: config.fleet_fingerprint_key.clone(),
            profile,
            api_key: vllm_command::api_key(&argv, &env).map(canary::ApiKey::new),
            preflight: started.elapsed(),
            gpus,
            host_shm: spec::host_dev_shm(&spec),
            oracle,
            contents,
            place_pages,
            push_to,
            layer,
            layer_limit: config.rootfs_diff_limit_bytes,
            donor_stop_grace: Duration::from_secs(config.donor_stop_grace_s),
            spec: spec.clone(),
            verified_at_create: Vec::new(),
            rootfs_unpack: Duration::ZERO,
        };
        let prepared = (|| -> Result<()> {
            if s.mode == Mode::Restore {
                // The copy sees only what was there at capture time, as
                // its own user's files.
                let owner =
                    (s.control_owner.0 != vsnap_protocol::euid()).then_some(s.control_owner);
                layout::copy_files_owned_by(
                    &s.artifact_dir().join("control"),
                    &s.control_dir,
                    owner,
                )
                .map_err(|e| artifact_error("restore", e))?;
                if let (Some(layer), Some(all)) = (&carried, &manifest_contents) {
                    let t = Instant::now();
                    s.verified_at_create = s.put_back_layer(layer, all)?;
                    s.rootfs_unpack = t.elapsed();
                }
            }
            let startup = s.profile == Profile::Startup;
            let timeout = s.capture_timeout.as_secs();
            spec::add_control_dir(bundle, &s.control_dir, startup.then_some(timeout))?;
            if s.profile == Profile::Startup && vllm_command::is_vllm_serve(&argv) {
                spec::add_snapshot_config_arg(bundle, s.capture_timeout.as_secs())?;
            }
            spec::add_criu_config(
                bundle,
                &config.criu_config,
                &config.cuda_plugin_dir,
                s.holds_stopped(),
                s.place_pages,
                s.host_shm.as_deref().filter(|_| s.mode == Mode::Create),
            )?;
            if s.mode == Mode::Restore {
                if let Some(shm) = &s.host_shm {
                    shm::put_back(&s.artifact_dir().join(shm::ARTIFACT_DIR), shm)?;
                }
            }
            spec::add_snapshot_hooks(bundle, &s, config.enforce_io_uring_sysctl)?;
            Ok(())
        })();
        if let Err(e) = prepared {
            remove_control_dir(&s.control_dir);
            return Err(e);
        }
        Ok(Some(s))
    }

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

    /// A restore: the carried writable layer, its bytes checked first,
    /// unpacked into the new container's upper dir. Returns the files it
    /// verified. A layer the new container cannot take is an error.
    fn put_back_layer(
        &self,
        layer: &vsnap_artifact::rootfs::RootfsLayer,
        contents: &vsnap_artifact::Contents,
    ) -> Result<Vec<String>> {
        use vsnap_artifact::rootfs::{RootfsLayer, DIR, UPPER_TAR};
        let RootfsLayer::OverlayUpper { .. } = layer else {
            return Ok(Vec::new());
        };
        let Ok(upper) = self.layer.to_carry() else {
            return Err(Error::FailedPrecondition(format!(
                "restore: rootfs: artifact {} carries the writable layer of an overlay snapshot, and this container has {}: restore it on an overlay snapshotter (containerd's default)",
                self.artifact,
                self.layer.describe()
            )));
        };
        let rel = format!("{DIR}/{UPPER_TAR}");
        let dir = self.artifact_dir();
        let tar = dir.join(&rel);
        let digest = contents.get(&rel).ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "restore: rootfs: {}: {rel} is not part of the artifact as captured",
                dir.display()
            ))
        })?;
        // Read once: each chunk is checked against its digest as the tar is
        // unpacked (into the new container's own snapshot, which a failed
        // create leaves to containerd to remove); nothing runs before the
        // last chunk matched.
        let file = std::fs::File::open(&tar)
            .map_err(|e| Error::io(format!("restore: rootfs: open {}", tar.display()), e))?;
        let reader = vsnap_artifact::content::VerifyingReader::new(file, &dir, &rel, digest);
        rootfs::unpack(reader, &tar, upper)?
            .finish()
            .map_err(|e| Error::io(format!("restore: rootfs: read {}", tar.display()), e))?;
        Ok(vec![rel])
    }

    pub fn artifact_dir(&self) -> PathBuf {
        artifact::path(&self.root, &self.artifact)
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

/// Before CRIU runs: a restore whose engine would wait for this host's
/// clocks to catch up with the capture's is refused (artifact/src/clocks.rs).
fn check_clocks(id: &str, captured: &artifact::Clocks) -> Result<()> {
    let live = artifact::Clocks::now();
    match artifact::clocks::check_restore(captured, &live, artifact::clocks::has_time_namespaces())
    {
        Ok(note) => {
            if let Some(note) = note {
                log::info!("{id}: {note}");
            }
            Ok(())
        }
        Err(e) => Err(Error::FailedPrecondition(format!(
            "restore: preflight: {e}"
        ))),
    }
}

/// A create may replace an artifact of its own namespace only (namespaces
/// are tenants), unless `allow_artifact_replace` says otherwise. Called
/// with the name's exclusive lock held.
fn check_replace(root: &Path, name: &str, namespace: &str, allowed: bool) -> Result<()> {
    let Ok(existing) = Manifest::load_unverified(root, name) else {
        return Ok(());
    };
    let owner = &existing.workload.namespace;
    if allowed || owner == namespace {
        return Ok(());
    }
    Err(Error::FailedPrecondition(format!(
        "create: artifact {name} was captured in namespace {owner:?}, not {namespace:?}: \
         a create replaces only its own namespace's artifacts (name another artifact, \
         or set allow_artifact_replace = true in the runtime config)"
    )))
}

/// For a container with NVIDIA devices: the CUDA preflight (plugin,
/// cuda-checkpoint, driver >= 570 for process trees) and the GPUs it was
/// given (not every GPU of the host). GPUs given by an OCI hook are refused.
fn gpus_of(spec: &serde_json::Value, config: &RuntimeConfig) -> Result<Vec<cuda::Gpu>> {
    cuda::check_no_gpu_hook(spec).map_err(|e| Error::FailedPrecondition(format!("create: {e}")))?;
    let devices = cuda::spec_nvidia_devices(spec);
    if devices.is_empty() {
        return Ok(Vec::new());
    }
    let tools = cuda::CudaTools {
        plugin_dir: config.cuda_plugin_dir.clone(),
        cuda_checkpoint: config.cuda_checkpoint.clone(),
        ..Default::default()
    };
    let identity = cuda::preflight(&tools, cuda::MIN_DRIVER_PROCESS_TREE)
        .map_err(|e| Error::FailedPrecondition(format!("create: {e}")))?;
    cuda::container_gpus(&identity, &devices, Path::new("/proc"))
        .map_err(|e| Error::FailedPrecondition(format!("create: preflight: {e}")))
}

/// Leaves `vsnap-error.json` in the bundle: the container, the phase that
/// failed (when known) and the error of its failed capture or restore.
/// Whole or absent: never half written.
pub fn record_error(bundle: &Path, id: &str, phase: Option<&str>, e: &Error) {
    let mut record = serde_json::json!({"container": id, "error": e.to_string()});
    if let Some(phase) = phase {
        record["phase"] = phase.into();
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

/// An artifact error as the shim reports it, with its phase.
pub fn artifact_error(phase: &str, e: ArtifactError) -> Error {
    match e {
        ArtifactError::NotFound(_) => Error::NotFound(format!("{phase}: {e}")),
        ArtifactError::Io { context, source } => Error::io(format!("{phase}: {context}"), source),
        e => Error::FailedPrecondition(format!("{phase}: {e}")),
    }
}

fn remove_control_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}
