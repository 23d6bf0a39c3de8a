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
    /// Artifact content that does not match its digest (or its size, or is
    /// missing): the artifact is damaged, whatever phase met it.
    #[error("{0}")]
    Damaged(String),
    /// The OOM killer ended the work in the container's memory cgroup (a
    /// restore under too low a memory limit).
    #[error("{0}")]
    OutOfMemory(String),
    /// What the work was waiting for did not come: the registry or the
    /// network of a pull that a restore streamed from.
    #[error("{0}")]
    Unavailable(String),
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

    /// The error as phase `phase` ("restore: CRIU") reports it, naming its
    /// phase once: a message that names its operation already ("restore:
    /// ...", "capture: ...": a deeper step said where it was) is kept as
    /// it is, one that names the step only ("checkpoint: runc ...") gets
    /// the operation in front, any other the whole phase. The driver applies it to
    /// every phase's error, so phases do not write their own name.
    pub fn in_phase(self, phase: &str) -> Self {
        let (op, step) = phase.split_once(": ").unwrap_or((phase, ""));
        let says = |m: &str, word: &str| !word.is_empty() && m.starts_with(&format!("{word}: "));
        let named = |m: String| {
            if says(&m, op) {
                m
            } else if says(&m, step) {
                // runc's verbs name their step ("checkpoint: runc ...").
                format!("{op}: {m}")
            } else {
                format!("{phase}: {m}")
            }
        };
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(named(m)),
            Error::NotFound(m) => Error::NotFound(named(m)),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(named(m)),
            Error::AlreadyExists(m) => Error::AlreadyExists(named(m)),
            Error::DeadlineExceeded(m) => Error::DeadlineExceeded(named(m)),
            Error::Cancelled(m) => Error::Cancelled(named(m)),
            Error::OutOfMemory(m) => Error::OutOfMemory(named(m)),
            Error::Unavailable(m) => Error::Unavailable(named(m)),
            Error::Damaged(m) => Error::Damaged(named(m)),
            Error::Other(m) => Error::Other(named(m)),
            Error::Io { context, source } => Error::Io {
                context: named(context),
                source,
            },
            Error::Runc {
                phase: p,
                verb,
                detail,
            } => Error::Runc {
                phase: if p.is_empty() { phase.to_string() } else { p },
                verb,
                detail,
            },
        }
    }

    fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Error::NotFound(_) => Code::NOT_FOUND,
            Error::FailedPrecondition(_) | Error::Damaged(_) => Code::FAILED_PRECONDITION,
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::DeadlineExceeded(_) => Code::DEADLINE_EXCEEDED,
            Error::Cancelled(_) => Code::CANCELLED,
            Error::OutOfMemory(_) => Code::RESOURCE_EXHAUSTED,
            Error::Unavailable(_) => Code::UNAVAILABLE,
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
    } else if phase == "exec" && verb == "exec" {
        // As runc-v2 words it, which kubelet shows (critest greps it).
        format!("OCI runtime exec failed: {detail}")
    } else {
        format!("{phase}: runc {verb} failed: {detail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_and_create_failures_are_worded_as_runc_v2_words_them() {
        let e = |phase: &str, verb: &'static str| Error::Runc {
            phase: phase.into(),
            verb,
            detail: "exec failed: unable to start container process".into(),
        };
        assert_eq!(
            e("exec", "exec").to_string(),
            "OCI runtime exec failed: exec failed: unable to start container process"
        );
        assert!(e("create", "create")
            .to_string()
            .starts_with("OCI runtime create failed: runc create failed: "));
        assert!(e("restore", "restore")
            .to_string()
            .starts_with("restore: runc restore failed: "));
    }

    #[test]
    fn a_phase_names_itself_once() {
        let e =
            Error::FailedPrecondition("pid 7 holds two GPUs".into()).in_phase("capture: inventory");
        assert_eq!(e.to_string(), "capture: inventory: pid 7 holds two GPUs");
        // Applied twice (a phase inside a phase), still once.
        let again = e.in_phase("capture: inventory");
        assert_eq!(
            again.to_string(),
            "capture: inventory: pid 7 holds two GPUs"
        );
    }

    #[test]
    fn a_message_that_names_its_operation_is_kept() {
        let e = Error::DeadlineExceeded("restore: preflight: too late".into())
            .in_phase("restore: CRIU");
        assert_eq!(e.to_string(), "restore: preflight: too late");
        // "restored" is not the operation "restore".
        let e = Error::Other("restored init gone".into()).in_phase("restore: visible");
        assert_eq!(e.to_string(), "restore: visible: restored init gone");
    }

    #[test]
    fn the_kind_of_error_and_its_source_are_kept() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = Error::io("write x", io).in_phase("capture: publish");
        assert_eq!(e.code(), Code::NOT_FOUND);
        assert!(e.to_string().starts_with("capture: publish: write x: "));
        let e = Error::Other("checkpoint: runc checkpoint failed: x".into())
            .in_phase("capture: checkpoint");
        assert_eq!(
            e.to_string(),
            "capture: checkpoint: runc checkpoint failed: x"
        );
        let e = Error::Runc {
            phase: String::new(),
            verb: "checkpoint",
            detail: "criu failed".into(),
        }
        .in_phase("capture: checkpoint");
        assert_eq!(
            e.to_string(),
            "capture: checkpoint: runc checkpoint failed: criu failed"
        );
        assert!(matches!(
            Error::Cancelled("killed".into()).in_phase("restore: CRIU"),
            Error::Cancelled(m) if m == "restore: CRIU: killed"
        ));
    }
}
