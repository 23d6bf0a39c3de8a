//! A snapshot plan prepared at create: the plan (read from the settings by
//! the caller, once), the workload's identity, the engine profile and
//! GPUs, the artifact's name and mode, then for a restore the preflight
//! (MAC, host compatibility, workload identity, clocks, memory limit,
//! sizes, volume files) or for a capture the exclusive lock; the control dir, and the
//! bundle's spec edited in memory and written once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use vsnap_artifact::rootfs::RootfsLayer;
use vsnap_artifact::{
    self as artifact, layout, ArtifactError, ArtifactLock, ArtifactName, Contents, HostIdentity,
    Manifest, Tenant, Tools, Workload,
};
use vsnap_config::{PagePlacement, RuntimeConfig};
use vsnap_protocol::{ControlDir, Oracle};

use super::plan::{self, Mode, Plan};
use super::profile::Profile;
use super::{
    artifact_error, canary, cuda, fetch, rootfs, shm, spec, tenant, vllm_command, Snapshot,
    CONTROL_MOUNT,
};
use crate::error::{Error, Result};

/// What a create hands the preparation.
pub struct Inputs<'a> {
    pub bundle: &'a Path,
    pub id: &'a str,
    pub namespace: &'a str,
    /// Whose container this is (tenant.rs).
    pub tenant: &'a Tenant,
    pub config: &'a RuntimeConfig,
    /// The `vsnap.io/` annotations merged with the labels.
    pub settings: &'a HashMap<String, String>,
    /// The plan read from them (once, by the caller).
    pub plan: Plan,
    pub image_digest: Option<&'a str>,
    pub layer: rootfs::WritableLayer,
    /// The bundle's spec as read at create: edited here, written once.
    pub spec: Value,
    /// When the shim's Create began (reported with a restore's timings).
    pub create_began: std::time::SystemTime,
}

/// What the restore preflight found in the artifact.
#[derive(Default)]
struct Preflight {
    oracle: Option<Oracle>,
    /// Every byte's digest, for the verification at Start.
    contents: Option<Contents>,
    /// The carried writable layer, and the manifest's digests for it.
    carried: Option<(RootfsLayer, Contents)>,
    /// The artifact's owner (another tenant's where it is shared).
    owner: Option<Tenant>,
    /// What the artifact's tree held in memory at capture.
    memory: Option<vsnap_artifact::Memory>,
}

/// What identifies the workload and how its engine speaks.
struct Engine {
    workload: Workload,
    argv: Vec<String>,
    env: Vec<String>,
    profile: Profile,
    gpus: Vec<cuda::Gpu>,
}

impl Snapshot {
    /// Prepares the container for its plan: the control dir, the spec
    /// edits and, for a restore, the validated artifact. `None`: the
    /// container starts cold without a capture (see `lock_and_check`).
    pub fn prepare(mut inputs: Inputs<'_>) -> Result<Option<Self>> {
        let started = Instant::now();
        let mut plan = inputs.plan.clone();
        let config = inputs.config;
        let root = config.artifact_root.clone();
        artifact::ensure_root(&root).map_err(|e| artifact_error("create: artifact root", e))?;
        let layer = resolve_layer(
            std::mem::replace(&mut inputs.layer, rootfs::WritableLayer::Shared),
            &inputs,
        );
        let mut engine = Engine::of(&inputs, &root, &mut plan)?;
        if let rootfs::WritableLayer::Mounted(overlay) = &layer {
            // dockerd's per-container merged path: the image's layers instead.
            engine.workload.rootfs = overlay.image_identity();
        }
        let name = artifact_name(&plan, &engine.workload)?;
        let mode = resolve_mode(plan.mode, &root, name.as_str())?;
        let tools = tools_of(config);
        let Some((lock, preflight)) = lock_and_check(
            &inputs,
            &root,
            &name,
            (plan.mode, mode),
            &tools,
            &engine,
            started,
        )?
        else {
            return Ok(None);
        };
        let (control_dir, control_owner) = make_control_dir(&inputs, &root)?;
        let place_pages = mode == Mode::Restore
            && engine.gpus.is_empty()
            && config.page_placement == PagePlacement::Parallel;
        let mut s = Snapshot {
            capture_timeout: plan
                .capture_timeout
                .unwrap_or(Duration::from_secs(config.capture_timeout_s)),
            activation_timeout: activation_timeout(&plan, config, &engine.gpus),
            checkpoint_timeout: Duration::from_secs(config.checkpoint_timeout_s),
            push_to: fetch::PushTarget::of(config, &plan, mode),
            plan,
            artifact: name,
            mode,
            root,
            control_dir,
            control_owner,
            lock: Some(Arc::new(lock)),
            api_key: vllm_command::api_key(&engine.argv, &engine.env).map(canary::ApiKey::new),
            owner: preflight.owner.unwrap_or_else(|| inputs.tenant.clone()),
            workload: engine.workload,
            tools,
            fingerprint_key: config.fleet_fingerprint_key.clone(),
            profile: engine.profile,
            preflight: started.elapsed(),
            create_began: inputs.create_began,
            gpus: engine.gpus,
            host_shm: spec::host_dev_shm(&inputs.spec),
            oracle: preflight.oracle,
            contents: preflight.contents,
            // Only where the tree is held stopped: the page server does not
            // follow a running tree's address space (pages/).
            place_pages,
            layer,
            layer_limit: config.rootfs_diff_limit_bytes,
            donor_stop_grace: Duration::from_secs(config.donor_stop_grace_s),
            spec: inputs.spec.clone(),
            verified_at_create: Vec::new(),
            rootfs_unpack: Duration::ZERO,
            memory: preflight.memory,
        };
        if let Err(e) = s.edit_bundle(&mut inputs, &engine.argv, preflight.carried) {
            super::remove_control_dir(&s.control_dir);
            return Err(e);
        }
        Ok(Some(s))
    }

    /// The container made ready for its plan: for a restore the control
    /// files of the capture copied in (as the engine's user's), the carried
    /// layer unpacked and /dev/shm put back; the spec's edits (control dir,
    /// snapshot config, CRIU config, preflight hooks) written at once.
    fn edit_bundle(
        &mut self,
        inputs: &mut Inputs<'_>,
        argv: &[String],
        carried: Option<(RootfsLayer, Contents)>,
    ) -> Result<()> {
        let (bundle, config) = (inputs.bundle, inputs.config);
        if self.mode == Mode::Restore {
            // The copy sees only what was there at capture time, as its
            // own user's files.
            let owner =
                (self.control_owner.0 != vsnap_protocol::euid()).then_some(self.control_owner);
            layout::copy_files_owned_by(
                &self.artifact_dir().join("control"),
                &self.control_dir,
                owner,
            )
            .map_err(|e| artifact_error("restore", e))?;
            if let Some((layer, all)) = &carried {
                let t = Instant::now();
                self.verified_at_create = self.put_back_layer(layer, all)?;
                self.rootfs_unpack = t.elapsed();
            }
        }
        let spec = &mut inputs.spec;
        let startup = self.profile == Profile::Startup;
        let timeout = self.capture_timeout.as_secs();
        spec::add_control_dir(spec, &self.control_dir, startup.then_some(timeout))?;
        if startup && vllm_command::is_vllm_serve(argv) {
            spec::add_snapshot_config_arg(spec, timeout)?;
        }
        spec::add_criu_config(
            spec,
            bundle,
            &config.criu_config,
            &config.cuda_plugin_dir,
            self.holds_stopped(),
            self.place_pages,
            self.host_shm
                .as_deref()
                .filter(|_| self.mode == Mode::Create),
        )?;
        if self.mode == Mode::Restore {
            if let Some(shm) = &self.host_shm {
                shm::put_back(&self.artifact_dir().join(shm::ARTIFACT_DIR), shm)?;
            }
        }
        spec::add_snapshot_hooks(spec, self, config.enforce_io_uring_sysctl)?;
        spec::write(bundle, spec)
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
        let unpack = |upper: &Path| {
            rootfs::unpack(reader, &tar, upper)?
                .finish()
                .map_err(|e| Error::io(format!("restore: rootfs: read {}", tar.display()), e))
        };
        match &self.layer {
            rootfs::WritableLayer::Mounted(overlay) => overlay.refill(unpack)?,
            _ => unpack(upper)?,
        }
        Ok(vec![rel])
    }
}

impl Engine {
    /// The workload's identity (keyed with the host's or the fleet's key),
    /// its command line, the engine profile and the container's GPUs.
    fn of(inputs: &Inputs<'_>, root: &Path, plan: &mut Plan) -> Result<Self> {
        let config = inputs.config;
        let spec = &inputs.spec;
        let key =
            artifact::FingerprintKey::load_or_create(root, config.fleet_fingerprint_key.as_deref())
                .map_err(|e| artifact_error("create: fingerprint key", e))?;
        let workload = Workload {
            image_digest: inputs.image_digest.unwrap_or_default().to_string(),
            ..Workload::from_spec(spec, CONTROL_MOUNT, &key)
        }
        .with_tenant(inputs.tenant);
        let argv = spec::args(spec);
        let profile = Profile::detect(plan.engine_protocol.as_deref(), &argv)?;
        let gpus = gpus_of(spec, config)?;
        if !gpus.is_empty() && !inputs.settings.contains_key(plan::AFTER_CAPTURE) {
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
            log::warn!(
                "{}: vLLM without {missing}: a capture may fail or a copy misbehave (docs/gpu-hosts.md)",
                inputs.id
            );
        }
        Ok(Engine {
            workload,
            argv,
            env,
            profile,
            gpus,
        })
    }
}

/// A fresh control dir for the container, owned by its engine's user.
fn make_control_dir(inputs: &Inputs<'_>, root: &Path) -> Result<(std::path::PathBuf, (u32, u32))> {
    let control_dir = root
        .join(".control")
        .join(format!("{}-{}", inputs.namespace, inputs.id));
    super::remove_control_dir(&control_dir);
    let owner = spec::process_owner(&inputs.spec)?;
    ControlDir::create_owned_by(&control_dir, owner.0, Some(owner.1))
        .map_err(|e| Error::FailedPrecondition(format!("create: control dir: {e}")))?;
    Ok((control_dir, owner))
}

fn preflight_error(e: ArtifactError) -> Error {
    artifact_error("restore: preflight", e)
}

/// The layer a capture carries: for a rootfs without mounts in the request,
/// the overlay the caller mounted at the spec's root path (dockerd's
/// overlay2), else a shared folder.
fn resolve_layer(layer: rootfs::WritableLayer, inputs: &Inputs<'_>) -> rootfs::WritableLayer {
    match layer {
        rootfs::WritableLayer::Shared => match inputs.spec["root"]["path"].as_str() {
            Some(root) => rootfs::WritableLayer::of_root_folder(
                &inputs.bundle.join(root),
                &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            ),
            None => rootfs::WritableLayer::Shared,
        },
        other => other,
    }
}

/// The plan's artifact; for `auto` without a name, the one the workload's
/// identity names.
fn artifact_name(plan: &Plan, workload: &Workload) -> Result<ArtifactName> {
    match plan.artifact.clone() {
        Some(name) => Ok(name),
        None => ArtifactName::new(format!("auto-{}", workload.key()))
            .map_err(|e| Error::Other(format!("create: {e}"))),
    }
}

/// `auto` resolved: a restore when the artifact exists, else a create.
fn resolve_mode(mode: Mode, root: &Path, name: &str) -> Result<Mode> {
    Ok(match mode {
        Mode::Auto => match Manifest::load_unverified(root, name) {
            Ok(_) => Mode::Restore,
            Err(ArtifactError::NotFound(_)) => Mode::Create,
            Err(e) => return Err(preflight_error(e)),
        },
        m => m,
    })
}

fn tools_of(config: &RuntimeConfig) -> Tools {
    Tools {
        runc: config.runc_binary.clone(),
        criu: config.criu_binary.clone(),
        cuda_plugin: config.cuda_plugin_dir.join("cuda_plugin.so"),
        cuda_checkpoint: config.cuda_checkpoint.clone(),
    }
}

fn activation_timeout(plan: &Plan, config: &RuntimeConfig, gpus: &[cuda::Gpu]) -> Duration {
    plan.activation_timeout
        .unwrap_or(Duration::from_secs(if gpus.is_empty() {
            config.activation_timeout_s
        } else {
            config.gpu_activation_timeout_s
        }))
}

/// The restore preflight, under the artifact's shared lock: the manifest's
/// MAC, the host's compatibility and the workload's identity, the clocks,
/// the file set and sizes (every byte's digest is checked at Start, beside
/// CRIU), the volume files the capture recorded.
/// The restore preflight under the artifact's shared lock, which the
/// container keeps.
fn locked_preflight(
    inputs: &Inputs<'_>,
    root: &Path,
    name: &str,
    tools: &Tools,
    engine: &Engine,
) -> Result<(ArtifactLock, Preflight)> {
    let lock = ArtifactLock::shared(root, name).map_err(preflight_error)?;
    Ok((lock, preflight_restore(inputs, root, name, tools, engine)?))
}

fn preflight_restore(
    inputs: &Inputs<'_>,
    root: &Path,
    name: &str,
    tools: &Tools,
    engine: &Engine,
) -> Result<Preflight> {
    let id = inputs.id;
    let manifest = Manifest::load_verified(root, name).map_err(preflight_error)?;
    let owner = manifest.workload.tenant();
    tenant::check_restore(&inputs.config.tenants, inputs.tenant, &owner, name)?;
    let mut live = HostIdentity::probe_cached(tools, env!("CARGO_PKG_VERSION"), Some(root));
    live.gpus = artifact::gpu::entries(&engine.gpus);
    // Compatibility, not identity (artifact/src/compat.rs): the MAC above
    // already says whose artifact this is.
    let host = artifact::compat::compare(&manifest.host, &live);
    let mut diff = host.incompatible;
    diff.extend(manifest.workload.diff(&engine.workload));
    if !diff.is_empty() {
        return Err(preflight_error(ArtifactError::Mismatch(diff.join("; "))));
    }
    if let Some(captured) = &manifest.clocks {
        check_clocks(id, captured)?;
    }
    let memory = manifest.memory;
    super::memory::preflight(
        memory.as_ref(),
        &inputs.spec,
        inputs.config.memory_preflight,
    )?;
    if !host.tolerated.is_empty() {
        log::info!(
            "{id}: artifact {name}: host differences a restore allows: {}",
            host.tolerated.join("; ")
        );
    }
    // A truncated or missing file fails the create at once.
    let dir = artifact::path(root, name);
    artifact::content::verify_sizes(&dir, &manifest.contents).map_err(preflight_error)?;
    let carried = match &manifest.rootfs {
        Some(r) => {
            rootfs::check_volume_files(&r.open_files, &inputs.spec)?;
            Some((r.layer.clone(), manifest.contents.clone()))
        }
        None => None,
    };
    Ok(Preflight {
        oracle: Some(manifest.oracle),
        contents: inputs.config.verify_contents.then_some(manifest.contents),
        carried,
        owner: Some(owner),
        memory,
    })
}

/// The artifact's lock and, for a restore, its preflight (the tenant's
/// right to it first); for a create, the tenant's right to create. None:
/// the container starts cold without a capture (the name is being written,
/// or `auto` in a tenant the policy lets create nothing).
fn lock_and_check(
    inputs: &Inputs<'_>,
    root: &Path,
    name: &ArtifactName,
    (asked, mode): (Mode, Mode),
    tools: &Tools,
    engine: &Engine,
    started: Instant,
) -> Result<Option<(ArtifactLock, Preflight)>> {
    let name = name.as_str();
    if mode == Mode::Restore {
        let preflight = locked_preflight(inputs, root, name, tools, engine);
        if preflight.is_err() {
            super::journal::preflight_failed(root, name, started.elapsed());
        }
        return preflight.map(Some);
    }
    if !tenant::may_create(&inputs.config.tenants, inputs.tenant) {
        let refused = tenant::create_refused(inputs.tenant, name);
        if asked != Mode::Auto {
            return Err(refused);
        }
        log::warn!("{}: auto: {refused}: starting cold", inputs.id);
        return Ok(None);
    }
    Ok(lock_for_create(inputs, root, name)?.map(|lock| (lock, Preflight::default())))
}

/// A create's exclusive lock on the artifact's name, and the check that it
/// may replace what is there. None: another container is writing it, so
/// this one starts cold and captures nothing.
fn lock_for_create(inputs: &Inputs<'_>, root: &Path, name: &str) -> Result<Option<ArtifactLock>> {
    match ArtifactLock::exclusive(root, name) {
        Ok(lock) => {
            tenant::check_replace(
                root,
                name,
                inputs.tenant,
                inputs.config.allow_artifact_replace,
            )?;
            Ok(Some(lock))
        }
        Err(ArtifactError::Locked(name)) => {
            // Never two writers.
            log::warn!(
                "{}: artifact {name} is being written by another container: starting cold without a capture",
                inputs.id
            );
            Ok(None)
        }
        Err(e) => Err(artifact_error("create", e)),
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
