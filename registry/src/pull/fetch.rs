//! The fetch phase: every chunk not landed yet, a few at a time, each into
//! memory while it streams (hashed as it comes), then, on a blocking thread
//! while the others still arrive, opened when sealed and landed at its
//! places in the partial pull's tree (partial.rs).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use oci_client::manifest::OciDescriptor;
use sha2::Digest;

use super::partial::Partial;
use crate::error::{RegistryError, Result};
use crate::index::ArtifactConfig;
use crate::remote::Remote;

/// Most bytes one layer may hold: a chunk is cut at 8 MiB at most
/// (chunking.rs), and a pull holds each chunk in flight in memory.
pub(super) const LAYER_LIMIT: u64 = 64 << 20;

/// Refuses a layer larger than [`LAYER_LIMIT`] before anything is fetched.
/// `reference` names the artifact in the error.
pub(super) fn check_sizes(reference: &str, layers: &[OciDescriptor]) -> Result<()> {
    match layers.iter().find(|l| l.size as u64 > LAYER_LIMIT) {
        Some(l) => Err(RegistryError::Invalid(format!(
            "pull: {reference}: layer {} is {} bytes, more than a chunk may hold ({LAYER_LIMIT})",
            l.digest, l.size
        ))),
        None => Ok(()),
    }
}

/// Every layer of `layers` fetched and landed in `partial`, `jobs` at a
/// time; the bytes of each.
pub(super) async fn fetch_chunks(
    remote: &Remote,
    partial: &Arc<Partial>,
    layers: &[&OciDescriptor],
    config: &ArtifactConfig,
    jobs: usize,
) -> Result<Vec<u64>> {
    let next = futures_util::stream::iter(layers.iter().copied());
    fetch_in_order(remote, partial, next, config, jobs).await
}

/// As [`fetch_chunks`], the layers taken from `next` as a fetch frees a
/// place (it may choose each as it is asked: streamed.rs).
///
/// A fetch frees its place once its bytes are in memory: they land (are
/// opened, written and checked: partial.rs) on a blocking thread while the
/// next fetch streams, so the link never waits on the disk or a chunk's
/// check. At most `jobs` landings are under way; while that many are, no
/// fetch is read from, which bounds what a pull holds in memory to twice
/// `jobs` chunks. The first failure, of a fetch or a landing, ends the
/// pull.
pub(super) async fn fetch_in_order<'l>(
    remote: &Remote,
    partial: &Arc<Partial>,
    next: impl futures_util::Stream<Item = &'l OciDescriptor>,
    config: &ArtifactConfig,
    jobs: usize,
) -> Result<Vec<u64>> {
    let (owners, jobs) = (chunk_owners(config), jobs.max(1));
    let fetching = next
        .map(|layer| {
            let files = owners
                .get(layer.digest.as_str())
                .map(|o| o.join(", "))
                .unwrap_or_default();
            async move {
                let bytes = fetch_layer(remote, layer, &files).await?;
                Ok::<_, RegistryError>((layer, bytes, files))
            }
        })
        .buffer_unordered(jobs);
    futures_util::pin_mut!(fetching);
    let mut landing = futures_util::stream::FuturesUnordered::new();
    let mut sizes = Vec::new();
    loop {
        tokio::select! {
            Some(landed) = landing.next(), if !landing.is_empty() => sizes.push(landed?),
            fetched = fetching.next(), if landing.len() < jobs => match fetched {
                Some(fetched) => landing.push(land(partial, fetched?)),
                None => break,
            },
        }
    }
    while let Some(landed) = landing.next().await {
        sizes.push(landed?);
    }
    Ok(sizes)
}

/// A fetched layer landed in `partial` on a blocking thread; its size.
async fn land(
    partial: &Arc<Partial>,
    (layer, bytes, files): (&OciDescriptor, Vec<u8>, String),
) -> Result<u64> {
    let (partial, digest, size) = (partial.clone(), layer.digest.clone(), layer.size as u64);
    tokio::task::spawn_blocking(move || partial.land(&digest, bytes, &files))
        .await
        .expect("the landing thread does not panic")?;
    Ok(size)
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

/// The bytes of `layer`, every one checked against its size and digest
/// while it streams.
async fn fetch_layer(remote: &Remote, layer: &OciDescriptor, files: &str) -> Result<Vec<u8>> {
    let size = layer.size as u64;
    let digest = &layer.digest;
    let named = || format!("pull: blob {digest} ({files})");
    let mut stream = remote
        .client
        .blob_stream(&layer.digest)
        .await
        .map_err(|e| RegistryError::registry(named(), e))?;
    let mut bytes = Vec::with_capacity(size as usize);
    let mut hasher = sha2::Sha256::new();
    while let Some(piece) = stream.next().await {
        match piece {
            Ok(piece) => {
                if (bytes.len() + piece.len()) as u64 > size {
                    return Err(RegistryError::Damaged(format!(
                        "{} holds more than its {size} bytes",
                        named()
                    )));
                }
                hasher.update(&piece);
                bytes.extend_from_slice(&piece);
            }
            Err(e) => {
                return Err(RegistryError::Registry {
                    context: named(),
                    message: e.to_string(),
                })
            }
        }
    }
    if (bytes.len() as u64) < size {
        return Err(RegistryError::Registry {
            context: named(),
            message: format!("ended after {} of {size} bytes", bytes.len()),
        });
    }
    let got = format!("sha256:{}", vsnap_artifact::key::hex(&hasher.finalize()));
    if got != *digest {
        return Err(RegistryError::Damaged(format!(
            "{} does not match its digest (the bytes hash to {got})",
            named()
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_larger_than_a_chunk_may_be_is_refused_before_any_fetch() {
        let layer = |size: i64| OciDescriptor {
            digest: format!("sha256:{}", "ab".repeat(32)),
            size,
            ..Default::default()
        };
        check_sizes("r/a:1", &[layer(8 << 20), layer(LAYER_LIMIT as i64)]).unwrap();
        let e = check_sizes("r/a:1", &[layer(1), layer(LAYER_LIMIT as i64 + 1)])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("pull: r/a:1: layer sha256:abab")
                && e.contains("is 67108865 bytes, more than a chunk may hold (67108864)"),
            "{e}"
        );
    }

    #[test]
    fn each_chunk_names_the_files_it_belongs_to_once() {
        let config = ArtifactConfig {
            schema_version: crate::index::CONFIG_SCHEMA,
            manifest: serde_json::json!({}),
            chunking: crate::chunking::PARAMS,
            files: ["images/a.img", "images/b.img"]
                .iter()
                .map(|p| crate::index::FileEntry {
                    path: p.to_string(),
                    mode: 0o600,
                    size: 3,
                    chunks: vec!["x".into(), "x".into(), "y".into()],
                })
                .collect(),
        };
        let owners = chunk_owners(&config);
        assert_eq!(owners["x"], ["images/a.img", "images/b.img"]);
        assert_eq!(owners["y"], ["images/a.img", "images/b.img"]);
    }
}
