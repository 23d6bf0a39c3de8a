use vsnap_artifact::ArtifactError;

/// Every message names the phase (`push`, `pull`) and the thing.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The registry refused or failed a request (network, auth, missing).
    #[error("{context}: {message}")]
    Registry { context: String, message: String },
    /// What the registry returned is not a vsnap artifact, or is malformed.
    #[error("{0}")]
    Invalid(String),
    /// A blob's bytes do not match its digest (or size).
    #[error("damaged: {0}")]
    Damaged(String),
    /// Not signed by a trusted fleet key (says which, and why).
    #[error("{0}")]
    Untrusted(String),
    /// The runtime config's credentials cannot be used.
    #[error("{0}")]
    Credentials(String),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, RegistryError>;

impl RegistryError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        RegistryError::Io {
            context: context.into(),
            source,
        }
    }

    /// A client error, with the registry's own message (never credentials:
    /// oci-client's errors carry URLs and status, not the auth header).
    pub fn registry(
        context: impl Into<String>,
        e: oci_client::errors::OciDistributionError,
    ) -> Self {
        RegistryError::Registry {
            context: context.into(),
            message: e.to_string(),
        }
    }
}
