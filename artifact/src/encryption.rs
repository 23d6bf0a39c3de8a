//! Fleet encryption keys: what keeps an artifact's bytes (the engine's
//! memory) unreadable in a registry (docs/fleet.md, "Encryption"). A fleet
//! shares one secret of 32 random bytes among its hosts, as it shares the
//! fingerprint key; `vsnap push` encrypts with the current one
//! (`fleet_encryption_key`), `vsnap pull` decrypts with it or with one of
//! the previous ones kept for rotation (`fleet_decryption_keys`).
//!
//! A key file is text, like the signing keys:
//!
//! ```text
//! vsnap fleet encryption key (32 random bytes)
//! 3b9e...64 hex digits...
//! ```
//!
//! a regular root-owned 0600 file. Its id (`fleet-enc:` and 16 hex digits of
//! a digest of the key behind a fixed context) names it in manifests, errors
//! and reports; the key itself is never written anywhere else.

use std::fs;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{ArtifactError, Result};
use crate::key::hex;
use crate::signature::{parse_key_file, read_key_file, write_new, KeyFile};

const HEADER: &str = "vsnap fleet encryption key (32 random bytes)";

/// One fleet encryption key and its id.
pub struct EncryptionKey {
    secret: [u8; 32],
    id: String,
}

impl std::fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("EncryptionKey")
            .field("id", &self.id)
            .finish()
    }
}

impl EncryptionKey {
    /// Reads a key file; refuses one that is not a regular root-owned 0600
    /// file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_key_file(path, KeyFile::Private)?;
        Ok(Self::from_secret(parse_key_file(path, &text, HEADER)?))
    }

    pub fn from_secret(secret: [u8; 32]) -> Self {
        let mut id = Sha256::new();
        id.update(b"vsnap fleet encryption key id\0");
        id.update(secret);
        EncryptionKey {
            secret,
            id: format!("fleet-enc:{}", &hex(&id.finalize())[..16]),
        }
    }

    /// `fleet-enc:<16 hex>`: names the key without telling anything of it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A 32-byte key for one purpose (`context`), derived from the secret
    /// (BLAKE3's key derivation): ids and chunk keys never share a key.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.secret)
    }
}

impl Drop for EncryptionKey {
    fn drop(&mut self) {
        self.secret.fill(0);
    }
}

/// Makes a new key at `out` (0600; it must not exist). Returns its id.
pub fn generate(out: &Path) -> Result<String> {
    if fs::symlink_metadata(out).is_ok() {
        return Err(ArtifactError::Invalid(format!(
            "{} exists already: a key is never overwritten",
            out.display()
        )));
    }
    let mut secret = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .map_err(|e| ArtifactError::io(Path::new("/dev/urandom"), "read", e))?;
    let key = EncryptionKey::from_secret(secret);
    secret.fill(0);
    write_new(
        out,
        format!("{HEADER}\n{}\n", hex(&key.secret)).as_bytes(),
        0o600,
    )?;
    Ok(key.id.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_generated_key_loads_with_its_id_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet-enc.key");
        let id = generate(&path).unwrap();
        assert!(id.starts_with("fleet-enc:") && id.len() == 10 + 16, "{id}");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Tests run as root: the file is root-owned.
        let key = EncryptionKey::load(&path).unwrap();
        assert_eq!(key.id(), id);
        assert!(!format!("{key:?}").contains(&hex(&key.secret)));
        assert_ne!(key.derive("a"), key.derive("b"));
        let e = generate(&path).unwrap_err().to_string();
        assert!(e.contains("never overwritten"), "{e}");
        let other = generate(&dir.path().join("other.key")).unwrap();
        assert_ne!(other, id, "32 random bytes each");

        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = EncryptionKey::load(&path).unwrap_err().to_string();
        assert!(e.contains("root-owned 0600"), "{e}");
    }
}
