//! A restore's plan, prepared at create under the artifact's shared lock:
//! the preflight (the manifest's MAC, the tenant's right to the artifact,
//! the host's compatibility and the workload's identity, the clocks, the
//! memory limit, the file set and sizes, the volume files the capture
//! recorded), then the control files of the capture copied in, the carried
//! layer checked and unpacked, /dev/shm put back. Every byte's digest is
//! checked at Start, beside CRIU.

use std::path::Path;
use std::time::Instant;

use vsnap_artifact::rootfs::RootfsLayer;
use vsnap_artifact::{
    self as artifact, layout, ArtifactError, ArtifactName, Contents, HostIdentity, Manifest,
    Memory, Tenant, Tools,
};
use vsnap_config::PagePlacement;
use vsnap_protocol::Oracle;

use super::bundle::{common_part, edit_spec};
use super::common::Common;
use super::engine::{tools_of, Engine, Inputs};
use super::lock::ReadLock;
use super::prepared_plan::PlanRef;
use super::refusal::{layer_cause, Cause, Refusal};
use super::restore::{ColdStart, RestorePlan};
use crate::error::{Error, Result};
use crate::snapshot::{artifact_error, criu, plan::tenant, records::journal, rootfs, rootfs::shm};

/// What the restore preflight found in the artifact.
struct Preflight {
    oracle: Oracle,
    /// Every byte's digest, for the verification at Start.
    contents: Option<Contents>,
    /// The carried writable layer, and the manifest's digests for it.
    carried: Option<(RootfsLayer, Contents)>,
    /// The artifact's owner (another tenant's where it is shared).
    owner: Tenant,
    /// What the artifact's tree held in memory at capture.
    memory: Option<Memory>,
    /// The sealed manifest's MAC: what names these bytes to the other
    /// restores of the artifact (the page share).
    mac: String,
    /// The CRIU options its dump used, where it recorded them.
    criu: Option<artifact::CriuOptions>,
    /// What opens its pages files, sealed at rest.
    sealed: Option<artifact::at_rest::Opener>,
}

fn preflight_error(e: ArtifactError) -> Error {
    artifact_error("restore: preflight", e)
}

/// The restore's plan of `name`: its preflight under the shared lock the
/// container keeps, then the container made ready for it. A refusal is
/// recorded in the metrics journal.
pub(super) fn prepare_restore(
    inputs: &mut Inputs<'_>,
    engine: &Engine,
    name: ArtifactName,
    layer: &rootfs::WritableLayer,
    started: Instant,
) -> std::result::Result<Box<RestorePlan>, Refusal> {
    let config = inputs.config;
    let root = config.artifact_root.clone();
    let tools = tools_of(config);
    let checked = read_lock(inputs, &root, name.as_str())
        .map_err(Refusal::of_artifact)
        .and_then(|lock| {
            Ok((
                lock,
                preflight(inputs, &root, name.as_str(), &tools, engine)?,
            ))
        });
    let (lock, found) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            journal::preflight_failed(&root, name.as_str(), started.elapsed());
            return Err(e);
        }
    };
    let place_pages = engine.gpus.is_empty() && config.page_placement == PagePlacement::Parallel;
    let auto = inputs.plan.mode == super::annotations::Mode::Auto;
    // Only an overlay's upper dir is unpacked into (put_back_layer).
    let unpacked = matches!(&found.carried, Some((RootfsLayer::OverlayUpper { .. }, _)));
    let cold = auto
        .then(|| ColdStart::of(inputs.bundle, layer, unpacked))
        .flatten();
    let mut common = common_part(inputs, engine, name)?;
    common.tree = inputs.streamed.as_ref().map(|s| s.tree.clone());
    let pages =
        page_plan(inputs, &common, &found, place_pages).inspect_err(|_| common.cleanup())?;
    let mut plan = RestorePlan {
        common,
        lock: Some(lock),
        owner: found.owner,
        fingerprint_key: config.fleet_fingerprint_key.clone(),
        oracle: found.oracle,
        contents: found.contents,
        verified_at_create: Vec::new(),
        // Only where the tree is held stopped: the page server does not
        // follow a running tree's address space (vsnap-pages).
        pages,
        memory: found.memory,
        create_began: inputs.create_began,
        preflight: started.elapsed(),
        rootfs_unpack: std::time::Duration::ZERO,
        auto,
        cold,
        shared_root: shared_root(inputs, layer),
        hostname: crate::snapshot::criu::pod::hostname_to_set(inputs.spec.value()),
        criu: found.criu,
        sealed: found.sealed,
    };
    if let Err(e) = make_ready(&mut plan, found.carried, layer) {
        plan.common.cleanup();
        return Err(e);
    }
    if let Some(cold) = plan.cold.take() {
        match super::cold::cold_start(inputs, engine, (&plan.common, &plan.owner), layer, cold) {
            Ok(cold) => plan.cold = Some(cold),
            Err(e) => {
                plan.common.cleanup();
                return Err(e.into());
            }
        }
    }
    edit_spec(inputs, PlanRef::Restore(&plan), &engine.command)?;
    Ok(Box::new(plan))
}

/// The page server's plan where it places the memory (`place_pages`). A
/// streamed restore's follows the pull's arrivals, or, where CRIU places
/// every page itself, waits here for all of them.
fn page_plan(
    inputs: &Inputs<'_>,
    common: &Common,
    found: &Preflight,
    place_pages: bool,
) -> std::result::Result<Option<vsnap_pages::PagePlan>, Refusal> {
    let streamed = inputs.streamed.as_ref();
    if !place_pages {
        if let Some(s) = streamed {
            // CRIU places every page itself: it starts once all arrived.
            s.wait_whole().map_err(|e| {
                Refusal::new(
                    Cause::Host,
                    Error::FailedPrecondition(format!("restore: {e}")),
                )
            })?;
        }
        return Ok(None);
    }
    let dir = common.artifact_dir();
    let sealed = found.sealed.clone();
    let mut pages = criu::pages::plan(
        inputs.config,
        &dir,
        found.contents.as_ref(),
        &found.mac,
        sealed,
    );
    if let Some(s) = streamed {
        pages.arrivals = Some(s.arrivals());
        pages.share = None;
    }
    Ok(Some(pages))
}

/// The artifact's shared lock, or for a restore streamed from a pull, its
/// hold on the pull's tree.
fn read_lock(inputs: &Inputs<'_>, root: &Path, name: &str) -> artifact::Result<ReadLock> {
    match &inputs.streamed {
        Some(s) => Ok(ReadLock::streamed(s.hold.clone())),
        None => ReadLock::take(root, name),
    }
}

/// The container made ready for the restore: the control files of the
/// capture copied in (as the engine's user's: the copy sees only what was
/// there at capture time), the carried layer unpacked, /dev/shm put back.
fn make_ready(
    plan: &mut RestorePlan,
    carried: Option<(RootfsLayer, Contents)>,
    layer: &rootfs::WritableLayer,
) -> std::result::Result<(), Refusal> {
    let c = &plan.common;
    let owner = (c.control_owner.0 != vsnap_protocol::euid()).then_some(c.control_owner);
    layout::copy_files_owned_by(&c.artifact_dir().join("control"), &c.control_dir, owner)
        .map_err(|e| artifact_error("restore", e))?;
    if let Some((carried, all)) = &carried {
        let t = Instant::now();
        plan.verified_at_create =
            put_back_layer(&plan.common, layer, carried, all).map_err(|e| {
                // A fallback starts cold on this layer: only where what was
                // unpacked of it can be emptied again.
                match layer_cause(&e) {
                    Cause::Damaged if empty_upper(layer) => Refusal::new(Cause::Damaged, e),
                    _ => Refusal::new(Cause::Container, e),
                }
            })?;
        plan.rootfs_unpack = t.elapsed();
    }
    if let Some(host_shm) = &plan.common.host_shm {
        let put = shm::put_back(
            &plan.common.artifact_dir().join(shm::ARTIFACT_DIR),
            host_shm,
        )?;
        if let Some(cold) = &mut plan.cold {
            cold.shm = put.iter().map(|name| host_shm.join(name)).collect();
        }
    }
    Ok(())
}

/// The preflight proper (see the module's head).
fn preflight(
    inputs: &Inputs<'_>,
    root: &Path,
    name: &str,
    tools: &Tools,
    engine: &Engine,
) -> std::result::Result<Preflight, Refusal> {
    let id = inputs.id;
    let manifest = match &inputs.streamed {
        Some(s) => Manifest::load_verified_in(root, name, &s.tree),
        None => Manifest::load_verified(root, name),
    }
    .map_err(Refusal::of_artifact)?;
    let owner = manifest.workload.tenant();
    tenant::check_restore(&inputs.config.tenants, inputs.tenant, &owner, name)?;
    let mut live = HostIdentity::probe_cached(tools, env!("CARGO_PKG_VERSION"), Some(root));
    live.gpus = artifact::gpu::entries(&engine.gpus);
    // Compatibility, not identity (artifact/src/compat.rs): the MAC above
    // already says whose artifact this is.
    let host = artifact::compat::compare(&manifest.host, &live);
    let workload = manifest.workload.diff(&engine.workload);
    // Another workload is a refusal under every plan; a host that only
    // differs is this node's change.
    let cause = if workload.is_empty() {
        Cause::Host
    } else {
        Cause::Container
    };
    let diff: Vec<String> = host.incompatible.iter().cloned().chain(workload).collect();
    if !diff.is_empty() {
        let e = preflight_error(ArtifactError::Mismatch(diff.join("; ")));
        return Err(Refusal::new(cause, e));
    }
    if let Some(captured) = &manifest.clocks {
        check_clocks(id, captured).map_err(|e| Refusal::new(Cause::Host, e))?;
    }
    let memory = manifest.memory;
    crate::snapshot::criu::memory::preflight(
        memory.as_ref(),
        inputs.spec.value(),
        inputs.config.memory_preflight,
    )?;
    if !host.tolerated.is_empty() {
        log::info!(
            "{id}: artifact {name}: host differences a restore allows: {}",
            host.tolerated.join("; ")
        );
    }
    // A truncated or missing file fails the create at once.
    let dir = match &inputs.streamed {
        Some(s) => s.tree.clone(),
        None => artifact::path(root, name),
    };
    artifact::content::verify_sizes(&dir, &manifest.contents).map_err(Refusal::of_artifact)?;
    let carried = match &manifest.rootfs {
        Some(r) => {
            rootfs::check_volume_files(&r.open_files, inputs.spec.value())?;
            Some((r.layer.clone(), manifest.contents.clone()))
        }
        None => None,
    };
    let sealed = opener(root, manifest.sealed.as_ref())?;
    Ok(Preflight {
        sealed,
        oracle: manifest.oracle,
        contents: inputs.config.verify_contents.then_some(manifest.contents),
        carried,
        owner,
        memory,
        mac: manifest.mac,
        criu: manifest.criu,
    })
}

/// What opens the artifact's pages files where they are sealed at rest:
/// its sealing with this host's key.
fn opener(
    root: &Path,
    sealed: Option<&artifact::at_rest::Sealed>,
) -> std::result::Result<Option<artifact::at_rest::Opener>, Refusal> {
    let Some(s) = sealed else {
        return Ok(None);
    };
    let key = artifact::HostKey::load(root).map_err(Refusal::of_artifact)?;
    s.opener(&key).map(Some).map_err(Refusal::of_artifact)
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

/// A restore: the carried writable layer, its bytes checked first,
/// unpacked into the new container's upper dir. Returns the files it
/// verified. A layer the new container cannot take is an error.
fn put_back_layer(
    c: &Common,
    own: &rootfs::WritableLayer,
    layer: &RootfsLayer,
    contents: &Contents,
) -> Result<Vec<String>> {
    use vsnap_artifact::rootfs::{DIR, UPPER_TAR};
    let RootfsLayer::OverlayUpper { .. } = layer else {
        return Ok(Vec::new());
    };
    let Ok(upper) = own.to_carry() else {
        return Err(Error::FailedPrecondition(format!(
            "restore: rootfs: artifact {} carries the writable layer of an overlay snapshot, and this container has {}: restore it on an overlay snapshotter (containerd's default)",
            c.artifact,
            own.describe()
        )));
    };
    let rel = format!("{DIR}/{UPPER_TAR}");
    let dir = c.artifact_dir();
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
    match own {
        rootfs::WritableLayer::Mounted(overlay) => overlay.refill(unpack)?,
        _ => unpack(upper)?,
    }
    Ok(vec![rel])
}

/// The container's root folder where other containers may share it: a
/// folder without mounts (`--rootfs DIR`), not the bundle's own `rootfs`.
fn shared_root(inputs: &Inputs<'_>, layer: &rootfs::WritableLayer) -> Option<std::path::PathBuf> {
    let rootfs::WritableLayer::Shared = layer else {
        return None;
    };
    let root = inputs.bundle.join(inputs.spec.root_path()?);
    let own = inputs.bundle.join(RestorePlan::SHARED_ROOT_MOUNT);
    (root.is_dir() && !same_folder(&root, &own)).then_some(root)
}

fn same_folder(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Removes what a failed unpack left in the container's own upper dir
/// (not yet mounted); false where that cannot be done safely (an overlay
/// the caller mounted already).
fn empty_upper(layer: &rootfs::WritableLayer) -> bool {
    let rootfs::WritableLayer::Upper(upper) = layer else {
        return false;
    };
    let Ok(entries) = std::fs::read_dir(upper) else {
        return false;
    };
    entries.flatten().all(|e| {
        let path = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path).is_ok(),
            _ => std::fs::remove_file(&path).is_ok(),
        }
    })
}
