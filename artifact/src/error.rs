use std::path::Path;

/// Every message names the object; callers prefix the phase.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("artifact {0} does not exist")]
    NotFound(String),
    /// Ownership, mode or symlink problems: the artifact must not be used.
    #[error("{0}")]
    Unsafe(String),
    /// Malformed or tampered content.
    #[error("{0}")]
    Invalid(String),
    /// The manifest is of an artifact format this vsnap does not read
    /// (`schema_version`): a fact of the host's vsnap, not damage.
    #[error("{0}")]
    Format(String),
    /// A file differs from its recorded content digest (or size, or is
    /// missing, or was added): named with the chunk.
    #[error("damaged: {0}")]
    Damaged(String),
    /// The artifact was made for another host or workload.
    #[error("fingerprint mismatch: {0}")]
    Mismatch(String),
    /// A fleet signature is missing, from an untrusted key, or does not
    /// verify (signature.rs): the shared artifact must not be used.
    #[error("fleet signature: {0}")]
    Signature(String),
    /// The work was told to stop (a kill, a deadline) before it was done.
    #[error("stopped: {0}")]
    Stopped(String),
    /// Another process holds the artifact's lock.
    #[error("artifact {0} is locked by another writer or user")]
    Locked(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, ArtifactError>;

impl ArtifactError {
    pub fn io(path: &Path, what: &str, source: std::io::Error) -> Self {
        ArtifactError::Io {
            context: format!("{what} {}", path.display()),
            source,
        }
    }
}
