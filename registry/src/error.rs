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
    /// Encrypted with a fleet key this host does not hold (names its id).
    #[error("{0}")]
    Key(String),
    /// The runtime config's credentials cannot be used.
    #[error("{0}")]
    Credentials(String),
    /// containerd's host configuration cannot be used (names the file).
    #[error("{0}")]
    Hosts(String),
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

    /// No host served a request: each host asked and why (never
    /// credentials: failures carry statuses and the registry's messages).
    pub fn registry(context: impl Into<String>, e: crate::client::HostsError) -> Self {
        let mut message = e.to_string();
        if e.unauthorized() {
            message.push_str(
                " (the registry wants credentials: username and password_file in the runtime config's [registries.\"host:port\"])",
            );
        }
        RegistryError::Registry {
            context: context.into(),
            message,
        }
    }
}
