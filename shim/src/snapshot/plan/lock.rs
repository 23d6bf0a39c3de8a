//! The artifact's lock, by type: a capture writes under the exclusive one
//! ([`WriteLock`]), a restore reads under a shared one ([`ReadLock`]).
//! Clones share one hold; the hold ends when the last clone goes.

use std::path::Path;
use std::sync::Arc;

use vsnap_artifact::{ArtifactLock, Result};

/// The exclusive lock on an artifact's name: one writer, no reader.
#[derive(Clone, Debug)]
pub struct WriteLock {
    _hold: Arc<ArtifactLock>,
}

/// A shared lock on an artifact: many readers, no writer.
#[derive(Clone, Debug)]
pub struct ReadLock {
    _hold: Arc<ArtifactLock>,
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
        ArtifactLock::shared(root, name).map(|l| Self { _hold: Arc::new(l) })
    }
}
