//! The artifact's lock, by type: a capture writes under the exclusive one
//! ([`WriteLock`]), a restore reads under a shared one ([`ReadLock`]).
//! Clones share one hold; the hold ends when the last clone goes.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use vsnap_artifact::{ArtifactLock, Result};

/// The exclusive lock on an artifact's name: one writer, no reader.
#[derive(Clone, Debug)]
pub struct WriteLock {
    _hold: Arc<ArtifactLock>,
}

/// A shared lock on an artifact: many readers, no writer. For a restore
/// streamed from a pull, the hold that keeps the pull from publishing
/// (and so moving the tree) while the restore reads it.
#[derive(Clone, Debug)]
pub struct ReadLock {
    _hold: Hold,
}

#[derive(Clone, Debug)]
enum Hold {
    Artifact(#[allow(dead_code)] Arc<ArtifactLock>),
    Stream(Arc<OwnedFd>),
}

impl WriteLock {
    /// The lock, or `Locked` while anyone holds it.
    pub fn take(root: &Path, name: &str) -> Result<Self> {
        ArtifactLock::exclusive(root, name).map(|l| Self { _hold: Arc::new(l) })
    }
}

impl ReadLock {
    /// The lock, or `Locked` while a writer holds it.
    pub fn take(root: &Path, name: &str) -> Result<Self> {
        ArtifactLock::shared(root, name).map(|l| Self {
            _hold: Hold::Artifact(Arc::new(l)),
        })
    }

    /// The hold on a streamed pull's tree (registry/stream.rs).
    pub fn streamed(hold: Arc<OwnedFd>) -> Self {
        Self {
            _hold: Hold::Stream(hold),
        }
    }

    /// A restore streamed from a pull gives its artifact up: the pull
    /// publishes nothing once the hold ends (registry/stream.rs). Nothing
    /// for a local artifact.
    pub fn abandon(&self) {
        if let Hold::Stream(gate) = &self._hold {
            crate::snapshot::registry::stream::abandon(gate);
        }
    }
}
