//! The crate's one error type: what failed, in which phase of the work
//! and on which object (a file, a task, a socket), or a pages file that
//! does not match its digest.
//!
//! Every function that returns to another module returns it. The parsers
//! of CRIU's image bytes (`images`) and the zero-page rewrite's own steps
//! say only what is wrong with the bytes they were given, as text: their
//! callers know the file and make the error of it.

use std::fmt;

use vsnap_artifact::ArtifactError;

/// What the crate was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Listening on the lazy-pages socket and starting the server's thread.
    Listen,
    /// CRIU's connection: accepting it and reading its messages.
    Connect,
    /// A task's images read: its pagemap, VMAs and pages file.
    Images,
    /// The VMAs placed as huge pages taken out of the userfaultfd.
    Huge,
    /// The pages files read.
    Read,
    /// Pages placed into a task's memory: copies, zero pages, faults.
    Place,
    /// The pages files checked against their digests.
    Verify,
    /// The host's filler budget.
    Budget,
    /// The sharing of an artifact's pages between its restores.
    Share,
    /// The server's outcome awaited.
    Finish,
    /// A capture's all-zero pages left out of its images.
    Elide,
    /// The bytes of a restore that streams, waited for as they arrive.
    Stream,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Listen => "listen",
            Phase::Connect => "CRIU's connection",
            Phase::Images => "images",
            Phase::Huge => "huge pages",
            Phase::Read => "read",
            Phase::Place => "place",
            Phase::Verify => "verify",
            Phase::Budget => "filler budget",
            Phase::Share => "page share",
            Phase::Finish => "finish",
            Phase::Elide => "zero pages",
            Phase::Stream => "stream",
        })
    }
}

/// Why pages could not be placed (or a capture's zero pages elided).
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// A pages file differs from its digest (or its size): the artifact
    /// is damaged. Its message names the file and the chunk.
    #[error(transparent)]
    Damaged(ArtifactError),
    /// The work stopped before it was done: the server was dropped, the
    /// restore cancelled.
    #[error("{phase}: cancelled")]
    Cancelled { phase: Phase },
    /// Anything else: in `phase`, on `object` (a path, `pid N`, CRIU's
    /// connection), what went wrong.
    #[error("{phase}: {object}: {detail}")]
    Failed {
        phase: Phase,
        object: String,
        detail: String,
    },
}

impl PageError {
    pub(crate) fn failed(
        phase: Phase,
        object: impl fmt::Display,
        detail: impl fmt::Display,
    ) -> Self {
        PageError::Failed {
            phase,
            object: object.to_string(),
            detail: detail.to_string(),
        }
    }

    pub(crate) fn cancelled(phase: Phase) -> Self {
        PageError::Cancelled { phase }
    }

    /// The phase it failed in (a damage is the verification's).
    pub fn phase(&self) -> Phase {
        match self {
            PageError::Damaged(_) => Phase::Verify,
            PageError::Cancelled { phase } | PageError::Failed { phase, .. } => *phase,
        }
    }
}

/// `pid N`: a task as errors name it.
pub(crate) fn pid(pid: i32) -> String {
    format!("pid {pid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_its_phase_and_object() {
        let e = PageError::failed(Phase::Images, "/a/images/pagemap-7.img", "read: gone");
        assert_eq!(e.to_string(), "images: /a/images/pagemap-7.img: read: gone");
        assert_eq!(e.phase(), Phase::Images);
        let e = PageError::cancelled(Phase::Place);
        assert_eq!(e.to_string(), "place: cancelled");
        let e = PageError::Damaged(ArtifactError::Damaged("x: bad".into()));
        assert_eq!(e.phase(), Phase::Verify);
        assert!(e.to_string().contains("x: bad"), "{e}");
    }
}
