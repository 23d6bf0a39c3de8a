//! The one error type of the crate. Every variant names the file or directory involved and
//! says what is wrong with it, so a message can be shown to an operator unchanged.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::messages::ErrorRecord;

pub type Result<T, E = ProtocolError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A system call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },

    /// The control dir (or one of its ancestors) breaks the directory rules.
    #[error("control dir {}: {reason}", path.display())]
    UnsafeDir { path: PathBuf, reason: String },

    /// The control dir had to be empty and is not.
    #[error("control dir {}: not empty (holds {entries})", path.display())]
    NotEmpty { path: PathBuf, entries: String },

    /// Files from an earlier activation are present; a copy must see only what existed at
    /// capture time.
    #[error("control dir {}: stale files from an earlier activation: {files}", path.display())]
    StaleFiles { path: PathBuf, files: String },

    #[error("{}: symlink refused", path.display())]
    Symlink { path: PathBuf },

    #[error("{}: not a regular file ({kind})", path.display())]
    NotRegularFile { path: PathBuf, kind: &'static str },

    #[error("{}: {size} bytes exceeds {limit}", path.display())]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },

    /// Not exactly one JSON object of the expected shape (syntax error, truncated file,
    /// unknown or missing key, wrong type).
    #[error("{}: {detail}", path.display())]
    Malformed { path: PathBuf, detail: String },

    /// Well-formed JSON whose values break the protocol (version, id syntax, port range).
    #[error("{}: {detail}", path.display())]
    Invalid { path: PathBuf, detail: String },

    /// A value that must repeat one we already know does not.
    #[error("{}: {field} mismatch: expected {expected}, got {got}", path.display())]
    Mismatch {
        path: PathBuf,
        field: &'static str,
        expected: String,
        got: String,
    },

    #[error("{}: timed out after {:.1}s waiting for the file", path.display(), waited.as_secs_f64())]
    Timeout { path: PathBuf, waited: Duration },

    /// The engine process is gone and left no error.json behind.
    #[error("control dir {}: engine exited without error.json", path.display())]
    EngineExited { path: PathBuf },

    /// The engine process is gone before writing the file we wait for (barrier protocol,
    /// which has no error file).
    #[error("{}: engine exited before writing the file", path.display())]
    EngineExitedBeforeFile { path: PathBuf },

    /// The engine reported a failure in error.json. Terminal: do not retry the process.
    #[error(
        "{}: engine failed in phase \"{}\": {}: {}",
        path.display(), record.phase, record.error_type, record.error
    )]
    EngineFailed {
        path: PathBuf,
        record: Box<ErrorRecord>,
    },

    /// A canary answer differs from the oracle recorded at capture time.
    #[error("{context}: canary mismatch: {detail}")]
    CanaryMismatch { context: String, detail: String },
}

impl ProtocolError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Self {
        ProtocolError::Io {
            path: path.into(),
            op,
            source,
        }
    }

    pub(crate) fn invalid(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        ProtocolError::Invalid {
            path: path.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn unsafe_dir(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        ProtocolError::UnsafeDir {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// The engine's own error record, when the failure came from error.json.
    pub fn engine_record(&self) -> Option<&ErrorRecord> {
        match self {
            ProtocolError::EngineFailed { record, .. } => Some(record.as_ref()),
            _ => None,
        }
    }
}
