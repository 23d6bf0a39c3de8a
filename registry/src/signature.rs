//! Fleet signatures in a registry: where the signatures of an artifact's OCI
//! manifest live, for a registry without the referrers API (a plain
//! docker-registry 2.8 has none). The OCI tag-schema fallback: a manifest
//! tagged `sha256-<hex of the signed digest>.sig` in the same repository,
//! `artifactType` [`SIGNATURE_ARTIFACT_TYPE`], an empty config, one layer
//! per signature, each holding a [`FleetSignature`] JSON, and `subject`
//! naming the signed manifest (for registries that do index referrers).
//!
//! Signatures are appended, never replaced (as cosign keeps several
//! signatures per image): a push reads the signatures already there and
//! writes them back with its own added, so a push of the same manifest by
//! another key (another fleet, or a key this host does not trust) leaves
//! the trusted signature in place, and a pull accepts the manifest when any
//! one signature by a trusted key verifies.
//!
//! What is signed is the OCI manifest's digest (`sha256:<hex>`): it fixes
//! the config blob (the artifact's manifest, file index and chunk digests)
//! and every chunk, so one signature covers every byte a pull accepts.

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use vsnap_artifact::signature::FleetSignature;

use crate::blobs::{blob_exists, fetch_small, send_blob};
use crate::error::{RegistryError, Result};
use crate::hosts::Need;
use crate::remote::Remote;
use crate::{sha256_digest, sha256_hex, OCI_MANIFEST};

pub const SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.vsnap.signature.v1";
pub const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.vsnap.signature.v1+json";
/// The OCI empty descriptor's media type and content.
const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY: &[u8] = b"{}";
/// A signature blob is a few hundred bytes.
const SIGNATURE_LIMIT: u64 = 64 << 10;
/// Most signatures kept (and read) per manifest: more is not a fleet.
pub const MAX_SIGNATURES: usize = 32;
/// Rounds of read, append, write, read back: two pushers appending at once
/// can each overwrite the other's write; the loser sees its signature
/// missing and appends again.
const ATTACH_ROUNDS: usize = 5;

/// The bytes signed for the OCI manifest `digest`.
pub fn payload(digest: &str) -> Vec<u8> {
    digest.as_bytes().to_vec()
}

/// `sha256-<hex>.sig`: the tag holding the signature of `digest`.
pub fn tag(digest: &str) -> String {
    format!(
        "sha256-{}.sig",
        sha256_hex(digest).expect("a sha256 digest")
    )
}

/// Adds `signature` of the manifest (`digest`, `size` bytes) to those
/// stored beside it; removes none. Done when a read back holds it.
pub async fn attach(
    remote: &Remote,
    digest: &str,
    size: usize,
    signature: &FleetSignature,
) -> Result<()> {
    let sig_bytes = serde_json::to_vec(signature).expect("a signature serializes");
    let sig_digest = sha256_digest(&sig_bytes);
    let empty_digest = sha256_digest(EMPTY);
    for (d, bytes, what) in [
        (&empty_digest, EMPTY.to_vec(), "the empty config"),
        (&sig_digest, sig_bytes.clone(), "the signature"),
    ] {
        if !blob_exists(remote, d).await? {
            send_blob(remote, d, bytes, what).await?;
        }
    }
    let ours = OciDescriptor {
        media_type: SIGNATURE_MEDIA_TYPE.into(),
        digest: sig_digest,
        size: sig_bytes.len() as i64,
        ..Default::default()
    };
    let at = at_tag(remote, digest);
    for _ in 0..ATTACH_ROUNDS {
        let mut layers = stored_layers(remote, digest, Need::Push).await?;
        if layers.iter().any(|l| l.digest == ours.digest) {
            return Ok(());
        }
        if layers.len() >= MAX_SIGNATURES {
            return Err(RegistryError::Invalid(format!(
                "push: signature {}: already {MAX_SIGNATURES} signatures",
                at.whole()
            )));
        }
        layers.push(ours.clone());
        let manifest = signature_manifest(digest, size, empty_digest.clone(), layers);
        remote
            .client
            .push_manifest(
                &tag(digest),
                serde_json::to_vec(&manifest).expect("a manifest serializes"),
                OCI_MANIFEST,
            )
            .await
            .map_err(|e| RegistryError::registry(format!("push: signature {}", at.whole()), e))?;
    }
    match stored_layers(remote, digest, Need::Push)
        .await?
        .iter()
        .any(|l| l.digest == ours.digest)
    {
        true => Ok(()),
        false => Err(RegistryError::Registry {
            context: format!("push: signature {}", at.whole()),
            message: format!(
                "still missing after {ATTACH_ROUNDS} appends (other pushers keep rewriting it)"
            ),
        }),
    }
}

/// The signature manifest of `digest` holding `layers`.
fn signature_manifest(
    digest: &str,
    size: usize,
    empty_digest: String,
    layers: Vec<OciDescriptor>,
) -> OciImageManifest {
    OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        artifact_type: Some(SIGNATURE_ARTIFACT_TYPE.into()),
        config: OciDescriptor {
            media_type: EMPTY_MEDIA_TYPE.into(),
            digest: empty_digest,
            size: EMPTY.len() as i64,
            ..Default::default()
        },
        layers,
        subject: Some(OciDescriptor {
            media_type: OCI_MANIFEST.into(),
            digest: digest.to_string(),
            size: size as i64,
            ..Default::default()
        }),
        annotations: None,
    }
}

/// The signature layers stored for `digest` (none when there is no
/// signature manifest), read from the hosts for `need`: those that resolve
/// tags for a pull, the push host for a push (which appends to what it
/// holds). Anything at the signature's tag that is not one is an error.
async fn stored_layers(remote: &Remote, digest: &str, need: Need) -> Result<Vec<OciDescriptor>> {
    let at = at_tag(remote, digest);
    let what = format!("signature {}", at.whole());
    let bytes = match remote
        .client
        .manifest(&tag(digest), OCI_MANIFEST, need)
        .await
    {
        Ok(bytes) => bytes,
        Err(e) if e.not_found() => return Ok(Vec::new()),
        Err(e) => return Err(RegistryError::registry(what, e)),
    };
    let manifest: OciImageManifest = serde_json::from_slice(&bytes)
        .map_err(|e| RegistryError::Invalid(format!("{what}: not an OCI manifest: {e}")))?;
    let ours = manifest.artifact_type.as_deref() == Some(SIGNATURE_ARTIFACT_TYPE)
        && manifest.layers.len() <= MAX_SIGNATURES
        && manifest
            .layers
            .iter()
            .all(|l| l.media_type == SIGNATURE_MEDIA_TYPE && sha256_hex(&l.digest).is_some());
    if !ours {
        return Err(RegistryError::Invalid(format!(
            "{what}: not a vsnap signature manifest (artifactType {:?}, {} layers)",
            manifest.artifact_type.as_deref().unwrap_or(""),
            manifest.layers.len()
        )));
    }
    Ok(manifest.layers)
}

/// Every signature stored for the manifest `digest` (none when there is
/// none), in the order they were added. Anything at the signature's tag
/// that is not one is an error.
pub async fn fetch(remote: &Remote, digest: &str) -> Result<Vec<FleetSignature>> {
    let what = format!("pull: signature {}", at_tag(remote, digest).whole());
    let mut signatures = Vec::new();
    for layer in stored_layers(remote, digest, Need::Resolve)
        .await
        .map_err(|e| match e {
            RegistryError::Invalid(m) => RegistryError::Invalid(format!("pull: {m}")),
            e => e,
        })?
    {
        let blob = fetch_small(remote, &layer, SIGNATURE_LIMIT, "signature blob").await?;
        let signature: FleetSignature = serde_json::from_slice(&blob)
            .map_err(|e| RegistryError::Invalid(format!("{what}: {e}")))?;
        signatures.push(signature);
    }
    Ok(signatures)
}

/// The reference of the signature of `digest`, in REF's repository.
fn at_tag(remote: &Remote, digest: &str) -> oci_client::Reference {
    oci_client::Reference::with_tag(
        remote.reference.registry().to_string(),
        remote.reference.repository().to_string(),
        tag(digest),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_signature_tag_follows_the_oci_tag_schema() {
        let d = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(super::tag(&d), format!("sha256-{}.sig", "ab".repeat(32)));
        assert_eq!(super::payload(&d), d.as_bytes());
    }
}
