//! vsnap's fleet transport: an artifact captured on one host is pushed to
//! an OCI distribution registry and pulled on another, chunked by content so
//! that artifacts of one engine share most of their bytes (docs/fleet.md).
//!
//! Layout in the registry: one OCI image manifest per artifact, with
//! `artifactType` [`ARTIFACT_TYPE`]; its config blob ([`CONFIG_MEDIA_TYPE`])
//! is the portable artifact description ([`index::ArtifactConfig`]: the
//! artifact's manifest without the host MAC, and every file's path, mode,
//! size and ordered chunk digests); its layers are the unique chunks
//! ([`CHUNK_MEDIA_TYPE`]), each a sha256 blob.
//!
//! Nothing pulled is trusted until checked: every blob against its digest
//! while it streams, the reassembled files against the artifact manifest's
//! content digests, and only then is the manifest sealed with this host's
//! key and the artifact published atomically.

mod blobs;
pub mod chunking;
pub mod client;
pub mod crypt;
mod error;
pub mod hosts;
pub mod index;
mod journal;
pub mod pull;
pub mod push;
pub mod remote;
pub mod signature;
pub mod transport;

pub use error::{RegistryError, Result};
pub use pull::{pull, PullOptions, PullReport, PullTimings};
pub use push::{push, PushOptions, PushReport};
pub use remote::Remote;

/// `artifactType` of a vsnap artifact's OCI manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.vsnap.artifact.v1";
/// Media type of its config blob, the portable artifact description.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.vsnap.artifact.config.v1+json";
/// Media type of every layer: one chunk of one or more artifact files.
pub const CHUNK_MEDIA_TYPE: &str = "application/vnd.vsnap.chunk.v1";
/// The config blob and the layers sealed with a fleet encryption key
/// ([`crypt`]), named as OCI names encrypted layers (`+encrypted`).
pub const CONFIG_MEDIA_TYPE_ENCRYPTED: &str =
    "application/vnd.vsnap.artifact.config.v1+json+encrypted";
pub const CHUNK_MEDIA_TYPE_ENCRYPTED: &str = "application/vnd.vsnap.chunk.v1+encrypted";
/// The manifest annotation naming the fleet encryption key's id (never the
/// key) an encrypted artifact was sealed with.
pub const ENCRYPTION_KEY_ANNOTATION: &str = "io.vsnap.encryption.key-id";
/// OCI image manifest media type (what a docker-registry 2.8 stores).
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// sha256 of `bytes` as an OCI digest (`sha256:<hex>`).
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!(
        "sha256:{}",
        vsnap_artifact::key::hex(&sha2::Sha256::digest(bytes))
    )
}

/// The hex part of a `sha256:<64 hex>` digest, or None for anything else
/// (another algorithm, upper case, a path).
pub fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}
