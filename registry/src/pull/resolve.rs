//! The resolve phase: the manifest REF names, the fleet signature of its
//! digest, the key that opens it when it is sealed, and its config blob.

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use vsnap_artifact::signature::TrustedKeys;

use crate::blobs::fetch_small;
use crate::crypt::{FleetKeys, Sealer};
use crate::error::{RegistryError, Result};
use crate::index::{ArtifactConfig, CONFIG_LIMIT};
use crate::remote::Remote;
use crate::{
    sha256_digest, sha256_hex, ARTIFACT_TYPE, CHUNK_MEDIA_TYPE, CHUNK_MEDIA_TYPE_ENCRYPTED,
    CONFIG_MEDIA_TYPE, CONFIG_MEDIA_TYPE_ENCRYPTED, ENCRYPTION_KEY_ANNOTATION, OCI_MANIFEST,
};

/// Most bytes an OCI manifest may hold (4 MiB, as registries limit them).
const MANIFEST_LIMIT: usize = 4 << 20;
/// The id of the trusted fleet key whose signature of `digest` verifies.
pub(super) async fn verify_signature(
    remote: &Remote,
    trusted: &TrustedKeys,
    digest: &str,
) -> Result<String> {
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
pub(super) fn choose_key(
    remote: &Remote,
    keys: &FleetKeys,
    oci: &OciImageManifest,
) -> Result<Option<Sealer>> {
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
/// The manifest REF names and its digest (computed here from the bytes,
/// and compared with REF's digest when it has one).
pub async fn resolve(remote: &Remote) -> Result<(OciImageManifest, String)> {
    let what = format!("pull: {}", remote.name());
    let at = remote
        .reference
        .digest()
        .or(remote.reference.tag())
        .unwrap_or("latest");
    let bytes = remote
        .client
        .manifest(at, OCI_MANIFEST, remote.read_need())
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
pub(super) async fn fetch_config(
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
