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

mod assemble;
mod fetch;
mod report;
mod resolve;

use std::collections::BTreeMap;
use std::path::Path;

use vsnap_artifact::journal::{Op, Record};
use vsnap_artifact::manifest::Origin;
use vsnap_artifact::signature::TrustedKeys;

use crate::cache::BlobCache;
use crate::crypt::{self, FleetKeys};
use crate::error::{RegistryError, Result};
use crate::remote::Remote;
use assemble::{publish_from_cache, Assembly};
use fetch::{fetch_chunks, Fetch, Opened};
use report::ms;
pub use report::{PullReport, PullTimings};
pub use resolve::resolve;
use resolve::{choose_key, fetch_config, verify_signature};

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
