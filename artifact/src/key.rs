//! The host-local key that MACs every manifest this host writes, so that only
//! artifacts this host made are restored. `<root>/.host-key`: 32 random bytes,
//! 0600, root-owned, created on first use.

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::error::{ArtifactError, Result};
use crate::layout::write_synced;

const KEY_FILE: &str = ".host-key";
const KEY_BYTES: usize = 32;

pub struct HostKey([u8; KEY_BYTES]);

impl HostKey {
    /// Reads the key, creating it (0600) if it does not exist yet.
    pub fn load_or_create(root: &Path) -> Result<Self> {
        let path = root.join(KEY_FILE);
        if fs::symlink_metadata(&path).is_err() {
            let mut key = [0u8; KEY_BYTES];
            fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut key))
                .map_err(|e| ArtifactError::io(Path::new("/dev/urandom"), "read", e))?;
            match write_synced(&path, &key) {
                Ok(()) => return Ok(HostKey(key)),
                // Another process created it first: read theirs.
                Err(ArtifactError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Self::load(root)
    }

    /// Reads an existing key; refuses one that anyone but root could read.
    pub fn load(root: &Path) -> Result<Self> {
        let path = root.join(KEY_FILE);
        let md = fs::symlink_metadata(&path).map_err(|e| ArtifactError::io(&path, "stat", e))?;
        if !md.file_type().is_file() || md.mode() & 0o077 != 0 || md.uid() != 0 {
            return Err(ArtifactError::Unsafe(format!(
                "{} must be a regular root-owned 0600 file (mode {:04o}, owner {})",
                path.display(),
                md.mode() & 0o7777,
                md.uid()
            )));
        }
        let bytes = fs::read(&path).map_err(|e| ArtifactError::io(&path, "read", e))?;
        let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| {
            ArtifactError::Invalid(format!("{} is not {KEY_BYTES} bytes", path.display()))
        })?;
        Ok(HostKey(key))
    }

    /// HMAC-SHA256 of `bytes`, lowercase hex.
    pub fn mac(&self, bytes: &[u8]) -> String {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        m.update(bytes);
        hex(&m.finalize().into_bytes())
    }

    pub fn verify(&self, bytes: &[u8], mac: &str) -> bool {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        m.update(bytes);
        let Some(expected) = unhex(mac) else {
            return false;
        };
        m.verify_slice(&expected).is_ok()
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mac_verifies_only_the_same_bytes_under_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(dir.path()).unwrap();
        let mac = key.mac(b"manifest");
        assert!(key.verify(b"manifest", &mac));
        assert!(!key.verify(b"manifest!", &mac));
        assert!(!key.verify(b"manifest", "zz"));
        let again = HostKey::load_or_create(dir.path()).unwrap();
        assert!(again.verify(b"manifest", &mac), "the key persists");
        let other = tempfile::tempdir().unwrap();
        let foreign = HostKey::load_or_create(other.path()).unwrap();
        assert!(
            !foreign.verify(b"manifest", &mac),
            "another host's key fails"
        );
    }
}
