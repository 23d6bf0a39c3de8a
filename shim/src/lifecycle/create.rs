//! Create: the task's settings read (annotations over labels), its artifact
//! fetched when a registry holds it, its snapshot plan prepared, its init's
//! start resolved once ([`InitStart`]) and the container created. Speaks
//! domain types: task.rs converts the wire request ([`CreateRequest`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::asynchronous::io::Stdio;
use log::warn;
use vsnap_config::RuntimeConfig;

use crate::bundle_spec::{BundleSpec, CRI_CONTAINER_TYPE};
use crate::cleanup;
use crate::container::{Container, CreateConfig};
use crate::error::{Error, Result};
use crate::exits::Exits;
use crate::init_start::InitStart;
use crate::labels;
use crate::runc::{CriuTools, Runc, RuncVerbs};
use crate::snapshot::plan::{prepare, Inputs, PreparedPlan, PLAN};
use crate::snapshot::registry::fetch;
use crate::snapshot::rootfs::{RootMount, WritableLayer};

/// A Create request, unwrapped from the wire.
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<RootMount>,
    pub stdio: Stdio,
    /// containerd's checkpoint to restore (`ctr run --checkpoint`).
    pub checkpoint: Option<PathBuf>,
    pub config: RuntimeConfig,
}

/// What drives the runc a container's config names: the runc CLI itself
/// ([`runc_cli`]), or in unit tests a fake that records the calls.
pub type MakeRunc = Arc<dyn Fn(Runc) -> Arc<dyn RuncVerbs> + Send + Sync>;

/// The runc CLI, as configured.
pub fn runc_cli() -> MakeRunc {
    Arc::new(|runc| Arc::new(runc))
}

/// Where a create happens: the shim's namespace, containerd's socket (for
/// labels and the image's digest), the exit reaper runc reports to and
/// what drives runc.
pub struct Creator<'a> {
    pub namespace: &'a str,
    pub containerd_address: &'a str,
    pub exits: &'a Exits,
    pub make_runc: &'a MakeRunc,
}

impl Creator<'_> {
    /// Creates the container of `req`; on failure nothing is left behind.
    pub async fn create(&self, req: CreateRequest) -> Result<Container> {
        let began = std::time::SystemTime::now();
        let config = &req.config;
        // The config can raise the shim's log level (containerd's -debug too).
        if log::max_level() < config.log_level.filter() {
            log::set_max_level(config.log_level.filter());
        }
        let runc = Runc {
            binary: config.runc_binary.clone(),
            root: runc_root(config.runc_root.as_deref(), &req.bundle, self.namespace),
            systemd_cgroup: config.systemd_cgroup,
            log_dir: req.bundle.clone(),
            exits: self.exits.clone(),
            criu: CriuTools::new(&config.criu_binary, &config.cuda_checkpoint),
        };
        // Read once: the container keeps what it asks of it later; the
        // plan's preparation edits it and writes it back once.
        let spec = BundleSpec::read(&req.bundle)?;
        if spec.terminal() != req.stdio.terminal {
            return Err(Error::InvalidArgument(format!(
                "create: spec says terminal={} but the task asks terminal={}",
                spec.terminal(),
                req.stdio.terminal
            )));
        }
        let kept = spec.kept();
        let snapshot = self.snapshot_plan(&req, spec, began).await?;
        // What a delete after this shim's death needs (cleanup.rs).
        let record = cleanup::Record {
            runc_binary: runc.binary.clone(),
            runc_root: runc.root.clone(),
            systemd_cgroup: runc.systemd_cgroup,
            control_dir: snapshot.as_ref().map(|p| p.common().control_dir.clone()),
        };
        if let Err(e) = record.write(&req.bundle) {
            if let Some(s) = &snapshot {
                s.cleanup();
            }
            return Err(Error::io(
                format!(
                    "create: write {}",
                    req.bundle.join(cleanup::RECORD).display()
                ),
                e,
            ));
        }
        let start = InitStart::resolve(req.checkpoint, snapshot)?;
        Container::create(CreateConfig {
            id: req.id,
            bundle: req.bundle,
            rootfs: req.rootfs,
            stdio: req.stdio,
            runc: (self.make_runc)(runc),
            no_pivot: config.no_pivot_root,
            start,
            spec: kept,
        })
        .await
    }

    /// The snapshot plan of `req`, prepared (None: the container runs plain).
    async fn snapshot_plan(
        &self,
        req: &CreateRequest,
        spec: BundleSpec,
        began: std::time::SystemTime,
    ) -> Result<Option<PreparedPlan>> {
        let config = &req.config;
        let settings = self.snapshot_settings(&spec, &req.id, config).await?;
        // A container without a plan runs plain: its tenant is never read,
        // nothing is prepared, and no blocking thread lingers in its idle
        // shim.
        let Some(plan) = crate::snapshot::plan::from_annotations(&settings)? else {
            return Ok(None);
        };
        // The tenant's right to the reference is checked before any
        // connection.
        let tenant = crate::snapshot::plan::tenant::resolve(self.namespace, spec.value())?;
        crate::snapshot::plan::tenant::check_reference(config, &tenant, &plan)?;
        // A restore from a registry reference whose artifact is not here
        // pulls it first (fetch.rs), so the preflight sees a local artifact.
        let streamed = fetch::ensure_local(&req.id, config, self.exits, plan.wanted()).await?;
        let image_digest = self.image_digest(&settings, &req.id).await?;
        // Hashes of binaries, nvidia-smi, artifact and /dev/shm files: off
        // the runtime thread. The version probes and nvidia-smi spawned there
        // tolerate the shim's reaper collecting their exit first.
        let (bundle, id, ns) = (
            req.bundle.clone(),
            req.id.clone(),
            self.namespace.to_string(),
        );
        let config = config.clone();
        let layer = WritableLayer::of(&req.rootfs);
        tokio::task::spawn_blocking(move || {
            prepare(Inputs {
                bundle: &bundle,
                id: &id,
                namespace: &ns,
                tenant: &tenant,
                config: &config,
                settings: &settings,
                plan,
                image_digest: image_digest.as_deref(),
                layer,
                spec,
                create_began: began,
                netns: None,
                streamed,
            })
        })
        .await
        .map_err(|e| Error::Other(format!("create: {e}")))?
    }

    /// The `vsnap.io/` settings: the spec's annotations, over the container's
    /// and its image's labels (read from containerd unless the annotations
    /// already choose a plan, or `read_labels` is off).
    async fn snapshot_settings(
        &self,
        spec: &BundleSpec,
        id: &str,
        config: &RuntimeConfig,
    ) -> Result<HashMap<String, String>> {
        let annotations = spec.annotations();
        if !config.read_labels
            || annotations.contains_key(PLAN)
            || annotations.contains_key(CRI_CONTAINER_TYPE)
            || self.containerd_address.is_empty()
        {
            return Ok(annotations);
        }
        let labels = match labels::vsnap_labels(self.containerd_address, self.namespace, id).await {
            Ok(labels) => labels,
            Err(e) => {
                warn!("{id}: labels not read ({e}): only annotations choose a snapshot plan");
                HashMap::new()
            }
        };
        Ok(labels::merge(annotations, labels))
    }

    /// For a snapshot container: its image's digest, part of its identity.
    async fn image_digest(
        &self,
        settings: &HashMap<String, String>,
        id: &str,
    ) -> Result<Option<String>> {
        let planned = settings.get(PLAN).is_some_and(|p| p != "off");
        if !planned || self.containerd_address.is_empty() {
            return Ok(None);
        }
        labels::image_digest(self.containerd_address, self.namespace, id)
            .await
            .map_err(|e| Error::FailedPrecondition(format!("create: image identity: {e}")))
    }
}

/// runc's state root for `namespace`: `<runc_root>/<namespace>` when the
/// runtime options name a root (as containerd's runc shim reads its Root
/// option); else one per containerd instance, beside containerd's own state,
/// so two containerds on one host never see each other's containers.
pub fn runc_root(configured: Option<&Path>, bundle: &Path, namespace: &str) -> PathBuf {
    match configured {
        Some(root) => root.join(namespace),
        None => runc_root_for(bundle, namespace),
    }
}

/// `<containerd state>/io.containerd.runtime.v2.task/<ns>/<id>` is the bundle;
/// runc's root goes beside containerd's own state: `<state>/vsnap-runc/<ns>`.
fn runc_root_for(bundle: &Path, namespace: &str) -> PathBuf {
    match bundle.ancestors().nth(3) {
        Some(state)
            if bundle
                .ancestors()
                .nth(2)
                .is_some_and(|t| t.ends_with("io.containerd.runtime.v2.task")) =>
        {
            state.join("vsnap-runc").join(namespace)
        }
        _ => PathBuf::from("/run/vsnap/runc").join(namespace),
    }
}

#[cfg(test)]
#[path = "create_tests.rs"]
mod tests;
