//! The fetch phase: every chunk the download cache lacks, a few at a time,
//! each hashed while it streams and, for a sealed artifact, opened as soon
//! as it is in.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;

use futures_util::{StreamExt, TryStreamExt};
use oci_client::manifest::OciDescriptor;

use crate::cache::{BlobCache, BlobProblem};
use crate::crypt::Sealer;
use crate::error::{RegistryError, Result};
use crate::index::ArtifactConfig;
use crate::remote::Remote;

/// What the fetch of every chunk shares: where from, the cache, the key
/// that opens sealed chunks and the plaintexts opened so far.
pub(super) struct Fetch<'a> {
    pub(super) remote: &'a Remote,
    pub(super) cache: &'a BlobCache,
    pub(super) sealer: Option<&'a Sealer>,
    pub(super) opened: &'a Opened,
}

/// The plaintexts of a sealed artifact's chunks, by layer digest: each
/// opened (tag and keyed id checked) as soon as its ciphertext is in the
/// cache, while other chunks are still being fetched, into a file of this
/// pull's own beside it (`<hex>.part-<pid>-<n>`, which a later pull sweeps
/// if this one died). Only plaintext that verified is ever written; all of
/// it is removed when the pull ends, published or not.
#[derive(Default)]
pub(super) struct Opened(Mutex<BTreeMap<String, PathBuf>>);

impl Opened {
    fn insert(&self, digest: &str, path: PathBuf) {
        self.0
            .lock()
            .expect("not poisoned")
            .insert(digest.to_string(), path);
    }

    pub(super) fn take(&self) -> BTreeMap<String, PathBuf> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }

    pub(super) fn remove_all(&self) {
        remove_opened(&self.take());
    }
}

pub(super) fn remove_opened(opened: &BTreeMap<String, PathBuf>) {
    for path in opened.values() {
        let _ = std::fs::remove_file(path);
    }
}
/// Every layer into the cache, `jobs` at a time; (fetched, bytes) of each.
pub(super) async fn fetch_chunks(
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
        .blob_stream(&layer.digest)
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
