//! The shim's one error type, mapped to ttrpc status codes in one place.

use containerd_shim_protos::ttrpc::{self, Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller asked for something malformed: bad options, bad spec.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such container or process.
    #[error("{0}")]
    NotFound(String),
    /// The request does not fit the process's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Something that already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// A runc invocation failed; `detail` is runc's own last error line.
    /// The container's `runc create` says it as containerd's runc-v2 shim
    /// does, where users grep for it: `OCI runtime create failed: runc
    /// create failed: ...`.
    #[error("{}", runc_message(phase, verb, detail))]
    Runc {
        phase: String,
        verb: &'static str,
        detail: String,
    },
    /// Any other I/O failure, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A deadline passed before the work was done.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The work was stopped on purpose (a kill during a restore).
    #[error("{0}")]
    Cancelled(String),
    /// The OOM killer ended the work in the container's memory cgroup (a
    /// restore under too low a memory limit).
    #[error("{0}")]
    OutOfMemory(String),
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Error::NotFound(_) => Code::NOT_FOUND,
            Error::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::DeadlineExceeded(_) => Code::DEADLINE_EXCEEDED,
            Error::Cancelled(_) => Code::CANCELLED,
            Error::OutOfMemory(_) => Code::RESOURCE_EXHAUSTED,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Code::NOT_FOUND
            }
            _ => Code::UNKNOWN,
        }
    }
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> Self {
        let mut status = Status::new();
        status.set_code(e.code());
        status.set_message(e.to_string());
        ttrpc::Error::RpcStatus(status)
    }
}

impl From<containerd_shim::Error> for Error {
    fn from(e: containerd_shim::Error) -> Self {
        Error::Other(e.to_string())
    }
}

/// What a failed runc invocation says (see [`Error::Runc`]).
fn runc_message(phase: &str, verb: &str, detail: &str) -> String {
    if phase == "create" && verb == "create" {
        format!("OCI runtime create failed: runc create failed: {detail}")
    } else {
        format!("{phase}: runc {verb} failed: {detail}")
    }
}
