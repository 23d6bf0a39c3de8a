//! `vsnap pull REF [NAME]`: an artifact from a registry onto this host.
//!
//! 1. Resolve REF to its manifest and digest; refuse anything that is not a
//!    vsnap artifact. 2. Fetch the config blob (bounded, digest checked) and
//!    check the file index against the layers and the artifact manifest.
//! 3. Open the partial pull of NAME (partial.rs): made afresh, or taken
//!    over from an earlier pull of the same digest that died, keeping the
//!    chunks it landed that still hold. 4. Fetch the other chunks, a few at
//!    a time, each checked against its digest as it streams, opened when
//!    sealed and written at its places in the partial pull's tree: once, no
//!    other copy; each content chunk of the manifest is checked against
//!    its digest once its last byte landed (not while a restore streams
//!    from the pull: it checks what it reads). 5. Under the artifact's
//!    exclusive lock, check the bytes not checked so against the
//!    manifest's content digests, seal the manifest with THIS
//!    host's key and publish the tree atomically. Any failure leaves no
//!    artifact half-published and the previous one of that name as it was;
//!    what landed stays for the next pull of NAME to resume from.

mod fetch;
mod partial;
mod report;
mod resolve;
mod streamed;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use vsnap_artifact::journal::{Op, Record};
use vsnap_artifact::manifest::Origin;
use vsnap_artifact::signature::TrustedKeys;
use vsnap_artifact::Manifest;

use crate::crypt::{self, FleetKeys, Sealer};
use crate::error::{RegistryError, Result};
use crate::index::ArtifactConfig;
use crate::remote::Remote;
use fetch::{check_sizes, fetch_chunks};
use partial::{Partial, Spec};
use report::ms;
pub use report::{PullReport, PullTimings};
pub use resolve::resolve;
use resolve::{choose_key, fetch_config, verify_signature};
pub use streamed::Stream;

pub struct PullOptions {
    /// Downloads in flight at once.
    pub jobs: usize,
    /// Threads checking the reassembled files' content digests.
    pub verify_threads: usize,
    /// The fleet keys a pulled artifact must be signed by
    /// (`fleet_trusted_keys`); none configured refuses every pull.
    pub trusted: TrustedKeys,
    /// The fleet encryption keys (`fleet_encryption_key`, and the previous
    /// `fleet_decryption_keys`) an encrypted artifact is opened with.
    pub keys: FleetKeys,
    /// A restore starts from this pull before it ends (streamed.rs).
    pub stream: Option<Stream>,
    /// Seal the pulled copy's pages files at rest with this host's key
    /// (`seal_at_rest`).
    pub seal_at_rest: bool,
}

impl PullOptions {
    /// With the runtime config's `fleet_trusted_keys`.
    pub fn from_config(
        config: &vsnap_config::RuntimeConfig,
        jobs: usize,
        verify_threads: usize,
    ) -> std::result::Result<Self, String> {
        let trusted = TrustedKeys::load(&config.fleet_trusted_keys)
            .map_err(|e| format!("fleet_trusted_keys: {e}"))?;
        Ok(PullOptions {
            jobs,
            verify_threads,
            trusted,
            keys: FleetKeys::from_config(config)?,
            stream: None,
            seal_at_rest: config.seal_at_rest,
        })
    }
}

/// Pulls `remote` into `root` as `name` (or the name it was pushed with);
/// the outcome, its bytes and phases go to the metrics journal of `root`.
pub async fn pull(
    root: &Path,
    name: Option<&str>,
    remote: &Remote,
    opts: &PullOptions,
) -> Result<PullReport> {
    let started = std::time::Instant::now();
    let pulled = pull_unrecorded(root, name, remote, opts).await;
    let seconds = started.elapsed().as_secs_f64();
    let artifact = match (&pulled, name) {
        (Ok(r), _) => r.name.clone(),
        (Err(_), Some(name)) => name.to_string(),
        (Err(_), None) => crate::journal::repository_name(remote),
    };
    let record = match &pulled {
        Ok(r) => {
            let t = &r.timings_ms;
            let secs = |ms: u64| ms as f64 / 1000.0;
            Record::now(Op::Pull, &artifact, true, seconds)
                .bytes(r.fetched_bytes)
                .phase("resolve", secs(t.resolve))
                .phase("fetch", secs(t.fetch))
                .phase("assemble", secs(t.assemble))
                .phase("verify", secs(t.verify))
                .phase("publish", secs(t.publish))
        }
        Err(_) => Record::now(Op::Pull, &artifact, false, seconds).failed_in("pull"),
    };
    crate::journal::record(root, record).await;
    pulled
}

async fn pull_unrecorded(
    root: &Path,
    name: Option<&str>,
    remote: &Remote,
    opts: &PullOptions,
) -> Result<PullReport> {
    check_target(root, name)?;
    let started = std::time::Instant::now();
    let mut timings = PullTimings::default();
    remote.login(oci_client::RegistryOperation::Pull).await?;
    let (oci, digest) = resolve(remote).await?;
    // Trust before content: nothing of an unsigned or untrusted artifact is
    // fetched, not even its config.
    let signed_by = verify_signature(remote, &opts.trusted, &digest).await?;
    let sealer = choose_key(remote, &opts.keys, &oci)?;
    let decrypted_with = sealer.as_ref().map(|s| s.key_id().to_string());
    let (config, mut manifest, layers) = describe(remote, &oci, sealer.as_ref()).await?;
    let name = pulled_name(name, &manifest)?;
    timings.resolve = ms(started);

    let preparing = std::time::Instant::now();
    let spec = Spec {
        root: root.to_path_buf(),
        name: name.clone(),
        digest: digest.clone(),
        config: config.clone(),
        layers: layers.clone(),
        sealer,
        threads: opts.verify_threads,
        seal_at_rest: opts.seal_at_rest,
        check_landing: opts.stream.is_none().then(|| manifest.contents.clone()),
    };
    let (partial, landed) = open_partial(spec).await?;
    // Another pull of the name held its lock: it may have published this
    // digest meanwhile (two containers of one node needing it at once).
    if partial.waited() && published_at(root, &name, &digest) {
        partial.remove();
        let found = (name.as_str(), &config, digest, signed_by);
        return Ok(already_here(remote, root, found));
    }
    timings.assemble = ms(preparing);
    let fetching = std::time::Instant::now();
    let todo = partial.to_fetch(&oci.layers, &landed);
    manifest.name = name.clone();
    manifest.origin = Some(origin(remote, &digest, signed_by.clone()));
    let on = (
        (&config, opts.jobs),
        (root, &manifest),
        opts.stream.as_ref(),
    );
    let fetched = fetch_all(remote, &partial, todo, on, &mut timings).await?;
    // Not the wait for a streamed restore to let go (`readers`).
    timings.fetch = ms(fetching).saturating_sub(timings.readers.unwrap_or(0));
    let mut report = PullReport {
        name: name.clone(),
        reference: remote.name(),
        path: vsnap_artifact::path(root, &name).display().to_string(),
        files: config.files.len(),
        bytes: config.files.iter().map(|f| f.size).sum(),
        chunks: oci.layers.len(),
        fetched: fetched.len(),
        fetched_bytes: fetched.iter().sum(),
        reused: landed.len(),
        reused_bytes: landed.iter().map(|d| layers[d]).sum(),
        signed_by: signed_by.clone(),
        decrypted_with,
        digest,
        timings_ms: timings,
    };
    let partial = Arc::into_inner(partial).expect("every landing thread is done");
    let (root, threads) = (root.to_path_buf(), opts.verify_threads);
    let (verify, publish) =
        tokio::task::spawn_blocking(move || partial.publish(&root, manifest, threads))
            .await
            .expect("the publishing thread does not panic")?;
    report.timings_ms.verify = verify;
    report.timings_ms.publish = publish;
    Ok(report)
}

/// What a fetch lands by: the artifact's config and the downloads at once;
/// the root and the manifest (a streamed pull puts it in the tree early);
/// the restore that follows, if any.
type On<'a> = (
    (&'a ArtifactConfig, usize),
    (&'a Path, &'a Manifest),
    Option<&'a Stream>,
);

/// Every chunk of `todo` fetched and landed, streamed when a restore
/// follows (streamed.rs): then the publish waits for it to let go.
async fn fetch_all(
    remote: &Remote,
    partial: &Arc<Partial>,
    todo: Vec<&OciDescriptor>,
    ((config, jobs), (root, manifest), stream): On<'_>,
    timings: &mut PullTimings,
) -> Result<Vec<u64>> {
    let Some(stream) = stream else {
        return fetch_chunks(remote, partial, &todo, config, jobs).await;
    };
    let s = streamed::fetch_streamed(
        remote,
        partial,
        todo,
        (config, jobs),
        (root, manifest),
        stream,
    )
    .await?;
    timings.head = Some(s.head_ms);
    let waiting = std::time::Instant::now();
    let gate = stream.gate.as_ref().and_then(|g| g.try_clone().ok());
    let abandoned = streamed::wait_for_readers(gate).await;
    timings.readers = Some(ms(waiting));
    if abandoned {
        partial.remove();
        return Err(RegistryError::Invalid(format!(
            "pull {}: abandoned by the restore that streamed from it (it refused the artifact, or failed for a reason that is the artifact's): nothing published, the partial pull removed",
            remote.name()
        )));
    }
    Ok(s.fetched)
}

/// The artifact root made when missing, and the name asked for (if any)
/// checked, before anything is fetched.
fn check_target(root: &Path, name: Option<&str>) -> Result<()> {
    if let Some(name) = name {
        vsnap_artifact::layout::check_name(name).map_err(RegistryError::Invalid)?;
    }
    Ok(vsnap_artifact::ensure_root(root)?)
}

/// The name to publish as: the one asked for, else the one it was pushed with.
fn pulled_name(name: Option<&str>, manifest: &Manifest) -> Result<String> {
    let name = name.unwrap_or(&manifest.name).to_string();
    vsnap_artifact::layout::check_name(&name)
        .map_err(|m| RegistryError::Invalid(format!("pull: the artifact's name: {m}")))?;
    Ok(name)
}

/// Whether `root` holds `name` as pulled from the OCI manifest `digest`.
fn published_at(root: &Path, name: &str, digest: &str) -> bool {
    Manifest::load_unverified(root, name)
        .ok()
        .and_then(|m| m.origin)
        .is_some_and(|o| o.manifest_digest == digest)
}

/// The report of a pull that found its artifact published by another.
fn already_here(
    remote: &Remote,
    root: &Path,
    (name, config, digest, signed_by): (&str, &ArtifactConfig, String, String),
) -> PullReport {
    PullReport {
        name: name.to_string(),
        reference: remote.name(),
        path: vsnap_artifact::path(root, name).display().to_string(),
        files: config.files.len(),
        bytes: config.files.iter().map(|f| f.size).sum(),
        chunks: 0,
        fetched: 0,
        fetched_bytes: 0,
        reused: 0,
        reused_bytes: 0,
        signed_by,
        decrypted_with: None,
        digest,
        timings_ms: PullTimings::default(),
    }
}

/// The config blob, opened and checked against the layers (their sizes
/// too: none larger than a chunk may be); the artifact manifest it
/// carries, and each layer's size.
async fn describe(
    remote: &Remote,
    oci: &OciImageManifest,
    sealer: Option<&Sealer>,
) -> Result<(ArtifactConfig, Manifest, BTreeMap<String, u64>)> {
    check_sizes(&remote.name(), &oci.layers)?;
    let layers: BTreeMap<String, u64> = oci
        .layers
        .iter()
        .map(|l| (l.digest.clone(), l.size as u64))
        .collect();
    let config = fetch_config(remote, &oci.config, sealer).await?;
    let overhead = if sealer.is_some() { crypt::OVERHEAD } else { 0 };
    let manifest = config.check(&layers, overhead)?;
    Ok((config, manifest, layers))
}

/// The partial pull of `spec` (partial.rs) on a blocking thread (it may
/// wait for another pull of the name, and checks what an earlier one
/// landed): the partial pull, shared with the landing threads, and the
/// chunks it holds.
async fn open_partial(spec: Spec) -> Result<(Arc<Partial>, BTreeSet<String>)> {
    let (partial, landed) = tokio::task::spawn_blocking(move || Partial::open(&spec))
        .await
        .expect("the preparing thread does not panic")?;
    Ok((Arc::new(partial), landed))
}

/// Where the artifact comes from, recorded in its manifest: REF, the OCI
/// manifest's digest, the signer, now.
fn origin(remote: &Remote, digest: &str, signed_by: String) -> Origin {
    Origin {
        reference: remote.name(),
        manifest_digest: digest.to_string(),
        signed_by: Some(signed_by),
        pulled_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .expect("a time formats"),
    }
}
