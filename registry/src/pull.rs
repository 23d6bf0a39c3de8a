//! `vsnap pull REF [NAME]`: an artifact from a registry onto this host.
//!
//! 1. Resolve REF to its manifest and digest; refuse anything that is not a
//!    vsnap artifact. 2. Fetch the config blob (bounded, digest checked) and
//!    check the file index against the layers and the artifact manifest.
//! 3. Fetch the chunks this host's download cache lacks, a few at a time,
//!    each hashed while it streams (cache.rs). 4. Under the artifact's
//!    exclusive lock, reassemble the files in a staging folder, check every
//!    byte against the manifest's content digests, seal the manifest with
//!    THIS host's key and publish atomically. Any failure leaves no
//!    artifact half-published and the previous one of that name as it was.

use std::collections::BTreeMap;
use std::fs::{DirBuilder, File};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;
use vsnap_artifact::journal::{Op, Record};

use futures_util::{StreamExt, TryStreamExt};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::Serialize;
use vsnap_artifact::layout::Staging;
use vsnap_artifact::manifest::Origin;
use vsnap_artifact::signature::TrustedKeys;
use vsnap_artifact::{content, ArtifactLock, HostKey, Manifest};

use crate::blobs::fetch_small;
use crate::cache::{BlobCache, BlobProblem};
use crate::crypt::{self, FleetKeys, Sealer};
use crate::error::{RegistryError, Result};
use crate::index::{ArtifactConfig, CONFIG_LIMIT};
use crate::remote::Remote;
use crate::{
    sha256_digest, sha256_hex, ARTIFACT_TYPE, CHUNK_MEDIA_TYPE, CHUNK_MEDIA_TYPE_ENCRYPTED,
    CONFIG_MEDIA_TYPE, CONFIG_MEDIA_TYPE_ENCRYPTED, ENCRYPTION_KEY_ANNOTATION, OCI_MANIFEST,
};

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
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PullReport {
    pub name: String,
    pub reference: String,
    pub digest: String,
    pub path: String,
    pub files: usize,
    pub bytes: u64,
    /// Distinct chunks (layers) of the artifact.
    pub chunks: usize,
    /// Chunks fetched from the registry now, and those already in the
    /// download cache (an earlier, interrupted pull).
    pub fetched: usize,
    pub fetched_bytes: u64,
    pub reused: usize,
    pub reused_bytes: u64,
    /// The trusted fleet key whose signature verified.
    pub signed_by: String,
    /// The fleet encryption key id it was decrypted with; None: it was
    /// stored in clear.
    pub decrypted_with: Option<String>,
    /// Where the time went.
    pub timings_ms: PullTimings,
}

/// Milliseconds of each phase of a pull.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PullTimings {
    /// Manifest, signature and config.
    pub resolve: u64,
    /// Chunks into the download cache (and cached ones hashed again).
    pub fetch: u64,
    /// Files written in the staging folder from the cache (sealed chunks
    /// opened, on every core).
    pub assemble: u64,
    /// The content digests of every file.
    pub verify: u64,
    /// fsync, seal, rename.
    pub publish: u64,
}

fn ms(since: std::time::Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

/// Most bytes an OCI manifest may hold (4 MiB, as registries limit them).
const MANIFEST_LIMIT: usize = 4 << 20;

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
    if let Some(name) = name {
        vsnap_artifact::layout::check_name(name).map_err(RegistryError::Invalid)?;
    }
    vsnap_artifact::ensure_root(root)?;
    let started = std::time::Instant::now();
    let mut timings = PullTimings::default();
    remote.login(oci_client::RegistryOperation::Pull).await?;
    let (oci, digest) = resolve(remote).await?;
    // Trust before content: nothing of an unsigned or untrusted artifact is
    // fetched, not even its config.
    let signed_by = verify_signature(remote, &opts.trusted, &digest).await?;
    let sealer = choose_key(remote, &opts.keys, &oci)?;
    let layers: BTreeMap<String, u64> = oci
        .layers
        .iter()
        .map(|l| (l.digest.clone(), l.size as u64))
        .collect();
    let config = fetch_config(remote, &oci.config, sealer.as_ref()).await?;
    let overhead = if sealer.is_some() { crypt::OVERHEAD } else { 0 };
    let mut manifest = config.check(&layers, overhead)?;
    let name = name.unwrap_or(&manifest.name).to_string();
    vsnap_artifact::layout::check_name(&name)
        .map_err(|m| RegistryError::Invalid(format!("pull: the artifact's name: {m}")))?;

    let cache = BlobCache::open(root)?;
    timings.resolve = ms(started);
    let fetching = std::time::Instant::now();
    let opened = Opened::default();
    let fetch = Fetch {
        remote,
        cache: &cache,
        sealer: sealer.as_ref(),
        opened: &opened,
    };
    let fetched = match fetch_chunks(&fetch, &oci.layers, &config, opts.jobs).await {
        Ok(fetched) => fetched,
        Err(e) => {
            opened.remove_all();
            return Err(e);
        }
    };
    let mut report = PullReport {
        name: name.clone(),
        reference: remote.name(),
        digest,
        path: vsnap_artifact::path(root, &name).display().to_string(),
        files: config.files.len(),
        bytes: config.files.iter().map(|f| f.size).sum(),
        chunks: oci.layers.len(),
        fetched: 0,
        fetched_bytes: 0,
        reused: 0,
        reused_bytes: 0,
        signed_by: signed_by.clone(),
        decrypted_with: sealer.as_ref().map(|s| s.key_id().to_string()),
        timings_ms: PullTimings::default(),
    };
    timings.fetch = ms(fetching);
    report.count(fetched);

    manifest.name = name.clone();
    manifest.origin = Some(origin(remote, &report.digest, signed_by));
    let threads = opts.verify_threads;
    let assembly = Assembly {
        cache,
        config,
        opened: opened.take(),
        threads,
    };
    report.timings_ms = publish_from_cache(root, assembly, manifest, timings).await?;
    Ok(report)
}

/// The id of the trusted fleet key whose signature of `digest` verifies.
async fn verify_signature(remote: &Remote, trusted: &TrustedKeys, digest: &str) -> Result<String> {
    let signatures = crate::signature::fetch(remote, digest).await?;
    let payload = crate::signature::payload(digest);
    let untrusted =
        |e| RegistryError::Untrusted(format!("pull: {} ({digest}): {e}", remote.name()));
    if signatures.is_empty() {
        return trusted.verify(&payload, None).map_err(untrusted);
    }
    // Any one trusted signature that verifies; else the most telling
    // refusal: that of a trusted key's signature (it does not verify),
    // else that of the first signature (by a key not trusted here).
    let mut refusals = Vec::new();
    for s in &signatures {
        match trusted.verify(&payload, Some(s)) {
            Ok(id) => return Ok(id),
            Err(e) => refusals.push((trusted.key_ids().contains(&s.key_id), e)),
        }
    }
    let at = refusals.iter().position(|(known, _)| *known).unwrap_or(0);
    Err(untrusted(refusals.swap_remove(at).1))
}

/// The key to open an encrypted artifact with (None for one in clear): the
/// one whose id its manifest names, else an error naming the id it needs.
fn choose_key(remote: &Remote, keys: &FleetKeys, oci: &OciImageManifest) -> Result<Option<Sealer>> {
    let Some(id) = sealed_with(oci) else {
        return Ok(None);
    };
    keys.find(id).cloned().map(Some).ok_or_else(|| {
        let held = keys.key_ids();
        RegistryError::Key(format!(
            "pull: {}: encrypted with fleet key {id}, which this host does not hold ({})",
            remote.name(),
            if held.is_empty() {
                "no fleet_encryption_key or fleet_decryption_keys configured".to_string()
            } else {
                format!("it holds {}", held.join(", "))
            }
        ))
    })
}

/// The encryption key id an encrypted artifact's manifest names.
fn sealed_with(oci: &OciImageManifest) -> Option<&str> {
    if oci.config.media_type != CONFIG_MEDIA_TYPE_ENCRYPTED {
        return None;
    }
    oci.annotations
        .as_ref()
        .and_then(|a| a.get(ENCRYPTION_KEY_ANNOTATION))
        .map(String::as_str)
}

/// Every layer into the cache, `jobs` at a time; (fetched, bytes) of each.
/// What the fetch of every chunk shares: where from, the cache, the key
/// that opens sealed chunks and the plaintexts opened so far.
struct Fetch<'a> {
    remote: &'a Remote,
    cache: &'a BlobCache,
    sealer: Option<&'a Sealer>,
    opened: &'a Opened,
}

/// The plaintexts of a sealed artifact's chunks, by layer digest: each
/// opened (tag and keyed id checked) as soon as its ciphertext is in the
/// cache, while other chunks are still being fetched, into a file of this
/// pull's own beside it (`<hex>.part-<pid>-<n>`, which a later pull sweeps
/// if this one died). Only plaintext that verified is ever written; all of
/// it is removed when the pull ends, published or not.
#[derive(Default)]
struct Opened(Mutex<BTreeMap<String, PathBuf>>);

impl Opened {
    fn insert(&self, digest: &str, path: PathBuf) {
        self.0
            .lock()
            .expect("not poisoned")
            .insert(digest.to_string(), path);
    }

    fn take(&self) -> BTreeMap<String, PathBuf> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }

    fn remove_all(&self) {
        remove_opened(&self.take());
    }
}

fn remove_opened(opened: &BTreeMap<String, PathBuf>) {
    for path in opened.values() {
        let _ = std::fs::remove_file(path);
    }
}

async fn fetch_chunks(
    fetch: &Fetch<'_>,
    layers: &[OciDescriptor],
    config: &ArtifactConfig,
    jobs: usize,
) -> Result<Vec<(bool, u64)>> {
    let owners = chunk_owners(config);
    futures_util::stream::iter(layers.iter())
        .map(|layer| {
            let files = owners
                .get(layer.digest.as_str())
                .map(|o| o.join(", "))
                .unwrap_or_default();
            fetch_and_open(fetch, layer, files)
        })
        .buffer_unordered(jobs.max(1))
        .try_collect()
        .await
}

/// Which file(s) each chunk belongs to, to name them in errors.
fn chunk_owners(config: &ArtifactConfig) -> BTreeMap<&str, Vec<&str>> {
    let mut owners: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for f in &config.files {
        for c in &f.chunks {
            let o = owners.entry(c.as_str()).or_default();
            if o.last() != Some(&f.path.as_str()) {
                o.push(&f.path);
            }
        }
    }
    owners
}

impl PullReport {
    /// Counts the chunks fetched now and those the cache already held.
    fn count(&mut self, fetched: Vec<(bool, u64)>) {
        for (was_fetched, len) in fetched {
            if was_fetched {
                self.fetched += 1;
                self.fetched_bytes += len;
            } else {
                self.reused += 1;
                self.reused_bytes += len;
            }
        }
    }
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

/// What the files are assembled from: the cached layers, the file index,
/// the key that opens sealed layers, and the threads that verify.
struct Assembly {
    cache: BlobCache,
    config: ArtifactConfig,
    /// The opened plaintexts of a sealed artifact's layers, by digest.
    opened: BTreeMap<String, PathBuf>,
    threads: usize,
}

/// Assembles and publishes off the async threads, then empties the cache of
/// the artifact's chunks; returns the timings with those phases filled.
async fn publish_from_cache(
    root: &Path,
    assembly: Assembly,
    manifest: Manifest,
    mut timings: PullTimings,
) -> Result<PullTimings> {
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let assembled = assemble_and_publish(&root, &assembly, manifest, &mut timings);
        remove_opened(&assembly.opened);
        assembled?;
        // The artifact holds every byte now: the cache gives them back.
        for f in &assembly.config.files {
            for c in &f.chunks {
                let _ = std::fs::remove_file(assembly.cache.path(c));
            }
        }
        Ok::<_, RegistryError>(timings)
    })
    .await
    .expect("the assembling thread does not panic")
}

/// The manifest REF names and its digest (computed here from the bytes,
/// and compared with REF's digest when it has one).
pub async fn resolve(remote: &Remote) -> Result<(OciImageManifest, String)> {
    let what = format!("pull: {}", remote.name());
    let (bytes, _) = remote
        .client
        .pull_manifest_raw(&remote.reference, &remote.auth, &[OCI_MANIFEST])
        .await
        .map_err(|e| RegistryError::registry(what.clone(), e))?;
    if bytes.len() > MANIFEST_LIMIT {
        return Err(RegistryError::Invalid(format!(
            "{what}: the manifest is larger than 4 MiB"
        )));
    }
    let digest = sha256_digest(&bytes);
    if let Some(want) = remote.reference.digest() {
        if want != digest {
            return Err(RegistryError::Damaged(format!(
                "{what}: the manifest's bytes hash to {digest}"
            )));
        }
    }
    let oci: OciImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| RegistryError::Invalid(format!("{what}: not an OCI image manifest: {e}")))?;
    let chunk_type = match oci.config.media_type.as_str() {
        CONFIG_MEDIA_TYPE => CHUNK_MEDIA_TYPE,
        CONFIG_MEDIA_TYPE_ENCRYPTED => CHUNK_MEDIA_TYPE_ENCRYPTED,
        _ => "",
    };
    let ours = oci.artifact_type.as_deref() == Some(ARTIFACT_TYPE) && !chunk_type.is_empty();
    if !ours {
        return Err(RegistryError::Invalid(format!(
            "{what}: not a vsnap artifact (artifactType {:?}, config media type {:?})",
            oci.artifact_type.as_deref().unwrap_or(""),
            oci.config.media_type
        )));
    }
    for l in &oci.layers {
        if l.media_type != chunk_type || sha256_hex(&l.digest).is_none() || l.size < 0 {
            return Err(RegistryError::Invalid(format!(
                "{what}: layer {} ({}) is not a vsnap chunk",
                l.digest, l.media_type
            )));
        }
    }
    if chunk_type == CHUNK_MEDIA_TYPE_ENCRYPTED && sealed_with(&oci).is_none() {
        return Err(RegistryError::Invalid(format!(
            "{what}: encrypted, but its manifest names no key ({ENCRYPTION_KEY_ANNOTATION})"
        )));
    }
    if sha256_hex(&oci.config.digest).is_none() {
        return Err(RegistryError::Invalid(format!(
            "{what}: config digest {} is not sha256",
            oci.config.digest
        )));
    }
    Ok((oci, digest))
}

/// The config blob, opened with `sealer` when it is sealed.
async fn fetch_config(
    remote: &Remote,
    desc: &OciDescriptor,
    sealer: Option<&Sealer>,
) -> Result<ArtifactConfig> {
    let bytes = fetch_small(remote, desc, CONFIG_LIMIT, "config blob").await?;
    let plain = match sealer {
        Some(s) => s.open(bytes).map_err(|e| {
            RegistryError::Damaged(format!(
                "pull: config blob {} {e} (fleet key {})",
                desc.digest,
                s.key_id()
            ))
        })?,
        None => bytes,
    };
    ArtifactConfig::parse(&plain)
}

/// One chunk into the cache unless it holds it and, for a sealed artifact,
/// opened there at once (on a blocking thread, so the other fetches go on);
/// returns (fetched, bytes).
async fn fetch_and_open(
    fetch: &Fetch<'_>,
    layer: &OciDescriptor,
    files: String,
) -> Result<(bool, u64)> {
    let fetched = fetch_chunk(fetch.remote, fetch.cache, layer, &files).await?;
    let Some(sealer) = fetch.sealer else {
        return Ok(fetched);
    };
    let (sealer, digest) = (sealer.clone(), layer.digest.clone());
    let cache = BlobCache {
        dir: fetch.cache.dir.clone(),
    };
    let path = tokio::task::spawn_blocking(move || open_chunk(&cache, &sealer, &digest, &files))
        .await
        .expect("the opening thread does not panic")?;
    fetch.opened.insert(&layer.digest, path);
    Ok(fetched)
}

/// One chunk into the cache unless it holds it; returns (fetched, bytes).
async fn fetch_chunk(
    remote: &Remote,
    cache: &BlobCache,
    layer: &OciDescriptor,
    files: &str,
) -> Result<(bool, u64)> {
    let size = layer.size as u64;
    let digest = layer.digest.clone();
    let held = {
        let path = cache.dir.clone();
        let d = digest.clone();
        tokio::task::spawn_blocking(move || BlobCache { dir: path }.holds(&d, size))
            .await
            .expect("the hashing thread does not panic")?
    };
    if held {
        return Ok((false, size));
    }
    let named = || format!("blob {digest} ({files})");
    let mut stream = remote
        .client
        .pull_blob_stream(&remote.reference, layer)
        .await
        .map_err(|e| RegistryError::registry(format!("pull: {}", named()), e))?;
    let mut writer = cache.writer(&digest, size)?;
    let problem = loop {
        match stream.next().await {
            None => break None,
            Some(Ok(piece)) => {
                if let Err(p) = writer.write(&piece) {
                    break Some(p);
                }
            }
            // oci-client checks the digest too and fails at the end; with
            // every byte here our own check below names the blob.
            Some(Err(_)) if writer.written() == size => break None,
            Some(Err(e)) => break Some(BlobProblem::Io(e)),
        }
    };
    let result = match problem {
        Some(p) => Err(p),
        None => writer.finish(),
    };
    match result {
        Ok(()) => Ok((true, size)),
        Err(p @ (BlobProblem::Mismatch { .. } | BlobProblem::TooLong { .. })) => {
            Err(RegistryError::Damaged(format!("pull: {} {p}", named())))
        }
        Err(p) => Err(RegistryError::Registry {
            context: format!("pull: {}", named()),
            message: p.to_string(),
        }),
    }
}

/// Reassembles the files from the cache into a staging folder, checks them
/// against the manifest's content digests, seals and publishes.
fn assemble_and_publish(
    root: &Path,
    assembly: &Assembly,
    mut manifest: Manifest,
    timings: &mut PullTimings,
) -> Result<()> {
    let Assembly {
        cache,
        config,
        opened,
        threads,
    } = assembly;
    let phase = std::time::Instant::now();
    let name = manifest.name.clone();
    let _lock = ArtifactLock::exclusive(root, &name)?;
    let staging = Staging::new(root, &name)?;
    for f in &config.files {
        let dest = staging.dir.join(&f.path);
        let parent = dest.parent().expect("a checked path has a folder");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| RegistryError::io(format!("pull: create {}", parent.display()), e))?;
        let mut out = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)
            .map_err(|e| RegistryError::io(format!("pull: create {}", dest.display()), e))?;
        for c in &f.chunks {
            // A sealed artifact's chunk as it was opened; one in clear as
            // the cache holds it.
            let src = opened.get(c).cloned().unwrap_or_else(|| cache.path(c));
            copy_chunk(&src, &mut out, &dest)?;
        }
        chmod(&dest, f.mode)?;
    }
    timings.assemble = ms(phase);
    let phase = std::time::Instant::now();
    content::verify(&staging.dir, &manifest.contents, *threads)?;
    timings.verify = ms(phase);
    let phase = std::time::Instant::now();
    let key = HostKey::load_or_create(root)?;
    manifest.seal(&key);
    staging.publish(root, &manifest.to_bytes())?;
    timings.publish = ms(phase);
    Ok(())
}

fn chmod(dest: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(mode & 0o755))
        .map_err(|e| RegistryError::io(format!("pull: chmod {}", dest.display()), e))
}

/// Appends the cached chunk `src` to `out` as it is (an artifact in clear).
fn copy_chunk(src: &Path, out: &mut File, dest: &Path) -> Result<()> {
    let mut input = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)
        .map_err(|e| RegistryError::io(format!("pull: open {}", src.display()), e))?;
    std::io::copy(&mut input, out)
        .map_err(|e| RegistryError::io(format!("pull: write {}", dest.display()), e))?;
    Ok(())
}

/// The sealed chunk `digest` opened from the cache (tag and keyed id
/// checked) into a plaintext file of this pull's own beside it; its path.
fn open_chunk(cache: &BlobCache, sealer: &Sealer, digest: &str, files: &str) -> Result<PathBuf> {
    let src = cache.path(digest);
    let mut input = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&src)
        .map_err(|e| RegistryError::io(format!("pull: open {}", src.display()), e))?;
    let mut sealed = Vec::new();
    input
        .read_to_end(&mut sealed)
        .map_err(|e| RegistryError::io(format!("pull: read {}", src.display()), e))?;
    let plain = sealer.open(sealed).map_err(|e| {
        RegistryError::Damaged(format!(
            "pull: blob {digest} ({files}) {e} (fleet key {})",
            sealer.key_id()
        ))
    })?;
    cache.write_part(digest, &plain)
}
