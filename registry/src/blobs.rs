//! Blob transfers on one remote, shared by push, pull and the signatures:
//! a HEAD, an upload, and a small blob read into memory, bounded and
//! checked against its digest.

use futures_util::StreamExt;
use oci_client::manifest::OciDescriptor;

use crate::error::{RegistryError, Result};
use crate::remote::Remote;
use crate::sha256_digest;

/// A small blob into memory, bounded and digest-checked.
pub async fn fetch_small(
    remote: &Remote,
    desc: &OciDescriptor,
    limit: u64,
    what: &str,
) -> Result<Vec<u8>> {
    if desc.size < 0 || desc.size as u64 > limit {
        return Err(RegistryError::Invalid(format!(
            "pull: {what} {} is {} bytes, more than {limit}",
            desc.digest, desc.size
        )));
    }
    let mut stream = remote
        .client
        .blob_stream(&desc.digest)
        .await
        .map_err(|e| RegistryError::registry(format!("pull: {what} {}", desc.digest), e))?;
    let mut bytes = Vec::with_capacity(desc.size as usize);
    while let Some(piece) = stream.next().await {
        match piece {
            Ok(piece) => {
                bytes.extend_from_slice(&piece);
                if bytes.len() as u64 > desc.size as u64 {
                    break;
                }
            }
            Err(e) => {
                return Err(RegistryError::io(
                    format!("pull: {what} {}", desc.digest),
                    e,
                ));
            }
        }
    }
    let got = sha256_digest(&bytes);
    if bytes.len() as u64 != desc.size as u64 || got != desc.digest {
        return Err(RegistryError::Damaged(format!(
            "pull: {what} {} does not match its digest ({} bytes hash to {got})",
            desc.digest,
            bytes.len()
        )));
    }
    Ok(bytes)
}

pub(crate) async fn blob_exists(remote: &Remote, digest: &str) -> Result<bool> {
    remote
        .client
        .blob_exists(digest)
        .await
        .map_err(|e| RegistryError::registry(format!("push: HEAD blob {digest}"), e))
}

/// Uploads `bytes` as blob `digest` (the registry checks the digest).
pub(crate) async fn send_blob(
    remote: &Remote,
    digest: &str,
    bytes: Vec<u8>,
    what: &str,
) -> Result<()> {
    remote
        .client
        .push_blob(digest, bytes.into())
        .await
        .map_err(|e| RegistryError::registry(format!("push: blob {digest} ({what})"), e))
}
