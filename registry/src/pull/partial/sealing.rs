//! A pull's copy sealed at rest with this host's key
//! (vsnap_artifact::at_rest): each chunk of a pages file is sealed at its
//! place as it is written, so no plaintext of one lands on disk, and the
//! tree is opened as it is checked against the manifest's digests (taken
//! of the plaintext). A registry's chunks are of the plaintext, so the
//! fleet's dedupe and its encryption are unchanged.
//!
//! The salt is this pull's own, recorded in the partial folder (`sealed`)
//! so that a pull that takes the folder over seals, and rechecks what
//! landed, with the same key; the published manifest records it.

use std::path::Path;

use vsnap_artifact::at_rest::{FileCipher, Opener, Sealed};
use vsnap_artifact::HostKey;

use crate::error::Result;

/// The sealing of one partial pull's tree.
pub(super) struct Sealing {
    pub(super) sealed: Sealed,
    pub(super) opener: Opener,
    /// Each file of the tree's cipher (the config's order), None in clear.
    files: Vec<Option<FileCipher>>,
}

impl Sealing {
    /// The sealing recorded in the partial folder `dir`, else a fresh one
    /// recorded now; keyed with the host key of `root`. `rels` names the
    /// tree's files in the config's order.
    pub(super) fn of(dir: &Path, root: &Path, rels: &[&str]) -> Result<Self> {
        let path = dir.join("sealed");
        let recorded = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Sealed>(&b).ok());
        let sealed = match recorded {
            Some(s) => s,
            None => {
                let s = Sealed::fresh()?;
                let bytes = serde_json::to_vec(&s).expect("a sealing serializes");
                let _ = std::fs::remove_file(&path);
                vsnap_artifact::layout::write_synced(&path, &bytes)?;
                s
            }
        };
        let opener = sealed.opener(&HostKey::load_or_create(root)?)?;
        let files = rels.iter().map(|rel| opener.file(rel)).collect();
        Ok(Sealing {
            sealed,
            opener,
            files,
        })
    }

    /// Bytes `[at, at + len)` of file `file` sealed if they were in clear
    /// (opened if sealed); a file kept in clear is left as it is.
    pub(super) fn apply(&self, file: usize, at: u64, data: &mut [u8]) {
        if let Some(c) = &self.files[file] {
            c.apply(at, data);
        }
    }

    /// File `file`'s cipher; None for a file kept in clear.
    pub(super) fn cipher(&self, file: usize) -> Option<&FileCipher> {
        self.files[file].as_ref()
    }

    /// Whether file `file` is sealed.
    pub(super) fn seals(&self, file: usize) -> bool {
        self.files[file].is_some()
    }
}
