//! Why an artifact was not restored, in the terms `auto` decides by: an
//! artifact this host cannot restore (another runc, CRIU, kernel series,
//! driver, GPU set, artifact format, clocks), one that is damaged (its
//! MAC, signature, files or bytes), or a restore that failed after CRIU
//! started is set aside and the start becomes a create; anything about
//! the container itself (its tenant, its workload, its memory limit, its
//! volumes, a kill) is a refusal under every plan.

use vsnap_artifact::ArtifactError;

use crate::error::Error;
use crate::snapshot::artifact_error;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// This host differs from the capture's in what a restore needs.
    Host,
    /// The artifact's MAC, signature, files or bytes do not hold.
    Damaged,
    /// A restore that failed after CRIU started: CRIU, the GPU resume, the
    /// canary, the activation's deadline.
    Restore,
    /// The container, its tenant or its workload: never set aside.
    Container,
    /// Another container holds the artifact's write lock (it is publishing
    /// it, or replacing it): never set aside; `auto` starts cold without a
    /// capture, as when the name is being written.
    Busy,
    /// The pull a restore streamed from failed (its registry, the
    /// network): nothing was published, so nothing is set aside; `auto`
    /// goes on cold without a capture, and the next start pulls again
    /// from what landed.
    Stream,
}

impl Cause {
    /// The quarantine's and the metric's word for it.
    pub fn slug(self) -> &'static str {
        match self {
            Cause::Host => "host",
            Cause::Damaged => "damaged",
            Cause::Restore => "restore",
            Cause::Container => "container",
            Cause::Busy => "busy",
            Cause::Stream => "stream",
        }
    }

    /// Whether `auto` sets the artifact aside for it.
    pub fn sets_aside(self) -> bool {
        !matches!(self, Cause::Container | Cause::Busy | Cause::Stream)
    }
}

/// A restore plan's refusal: its cause and its error, whole.
#[derive(Debug)]
pub struct Refusal {
    pub cause: Cause,
    pub error: Error,
}

impl Refusal {
    pub fn new(cause: Cause, error: Error) -> Self {
        Self { cause, error }
    }

    /// A refusal of the preflight for `e`, classified.
    pub fn of_artifact(e: ArtifactError) -> Self {
        let cause = artifact_cause(&e);
        Self::new(cause, artifact_error("restore: preflight", e))
    }
}

/// What is about the container unless said otherwise.
impl From<Error> for Refusal {
    fn from(error: Error) -> Self {
        Self::new(Cause::Container, error)
    }
}

/// The cause of an artifact error met while reading or checking it.
fn artifact_cause(e: &ArtifactError) -> Cause {
    match e {
        // The manifest of a format this shim does not read.
        ArtifactError::Format(_) => Cause::Host,
        ArtifactError::Invalid(_) | ArtifactError::Signature(_) | ArtifactError::Damaged(_) => {
            Cause::Damaged
        }
        ArtifactError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Cause::Damaged
        }
        ArtifactError::Locked(_) => Cause::Busy,
        _ => Cause::Container,
    }
}

/// The cause of an error of the carried layer's unpacking: a chunk that
/// does not match its digest is damage; the rest is the container's.
pub fn layer_cause(e: &Error) -> Cause {
    match e {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::InvalidData => {
            Cause::Damaged
        }
        _ => Cause::Container,
    }
}

/// The cause of a restore that failed at Start in `phase` with `e`.
pub fn start_cause(phase_slug: &str, e: &Error) -> Cause {
    match e {
        // A kill, and the container's own memory limit, are not the
        // artifact's doing.
        Error::Cancelled(_) | Error::OutOfMemory(_) => Cause::Container,
        Error::Damaged(_) => Cause::Damaged,
        Error::Unavailable(_) => Cause::Stream,
        _ => match phase_slug {
            "verify" => Cause::Damaged,
            "criu" | "gpu_resume" | "activation" => Cause::Restore,
            _ => Cause::Container,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_artifact_is_sets_it_aside_and_what_the_container_is_does_not() {
        let host = ArtifactError::Format("m.json: schema_version 9 is not read".into());
        assert_eq!(Refusal::of_artifact(host).cause, Cause::Host);
        let mac = ArtifactError::Invalid("m.json: MAC does not verify".into());
        assert_eq!(Refusal::of_artifact(mac).cause, Cause::Damaged);
        let gone = ArtifactError::io(
            std::path::Path::new("/a/images/pages-1.img"),
            "stat",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(Refusal::of_artifact(gone).cause, Cause::Damaged);
        let locked = ArtifactError::Locked("a".into());
        // Another container writes it: `auto` starts cold, sets nothing aside.
        let locked = Refusal::of_artifact(locked).cause;
        assert_eq!(locked, Cause::Busy);
        assert!(!locked.sets_aside());
        let unsafe_root = ArtifactError::Unsafe("/a is group-writable".into());
        assert!(!Refusal::of_artifact(unsafe_root).cause.sets_aside());
        let tenant: Refusal = Error::FailedPrecondition("tenant".into()).into();
        assert_eq!(tenant.cause, Cause::Container);
    }

    #[test]
    fn a_start_failure_is_the_artifact_s_unless_a_kill_or_the_limit_ended_it() {
        let damaged = crate::snapshot::artifact_error(
            "restore: verify",
            ArtifactError::Damaged("pages-2.img chunk 0 does not match".into()),
        );
        assert_eq!(start_cause("criu", &damaged), Cause::Damaged);
        // Said in a message only, damage is not taken for it.
        let said = Error::Other("restore: CRIU: damaged: no".into());
        assert_eq!(start_cause("criu", &said), Cause::Restore);
        let criu = Error::Other("restore: CRIU: runc restore failed".into());
        assert_eq!(start_cause("criu", &criu), Cause::Restore);
        let canary = Error::FailedPrecondition("restore: activation: canary".into());
        assert_eq!(start_cause("activation", &canary), Cause::Restore);
        let killed = Error::Cancelled("restore: CRIU: killed".into());
        assert_eq!(start_cause("criu", &killed), Cause::Container);
        let oom = Error::OutOfMemory("restore: CRIU: out of memory".into());
        assert_eq!(start_cause("criu", &oom), Cause::Container);
        let exited = Error::Other("restore: visible: the copy exited".into());
        assert_eq!(start_cause("visible", &exited), Cause::Container);
    }

    #[test]
    fn a_chunk_that_does_not_match_is_damage() {
        let bad = Error::io(
            "restore: rootfs: read upper.tar",
            std::io::Error::new(std::io::ErrorKind::InvalidData, "chunk 3"),
        );
        assert_eq!(layer_cause(&bad), Cause::Damaged);
        let full = Error::io(
            "restore: rootfs: write x",
            std::io::Error::from(std::io::ErrorKind::StorageFull),
        );
        assert_eq!(layer_cause(&full), Cause::Container);
    }
}
