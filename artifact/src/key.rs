//! The host-local key that MACs every manifest this host writes, so that only
//! artifacts this host made are restored. `<root>/.host-key`: 32 random bytes,
//! 0600, root-owned, created on first use.
//!
//! And the key that keys a workload's secret fingerprints (environment
//! values, secret flags): the host key, or a secret the fleet's hosts share
//! (`fleet_fingerprint_key`, the same file format), so that one workload
//! fingerprints alike on every host of the fleet.

use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::durable::write_synced;
use crate::error::{ArtifactError, Result};

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
        read_secret(&root.join(KEY_FILE)).map(HostKey)
    }

    /// HMAC-SHA256 of `bytes`, lowercase hex.
    pub fn mac(&self, bytes: &[u8]) -> String {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        m.update(bytes);
        hex(&m.finalize().into_bytes())
    }

    /// A 32-byte key for `purpose` (a BLAKE3 key derivation context)
    /// derived from this key and `material`: the at-rest sealing's
    /// per-artifact key (at_rest.rs). Not the host key, nor usable to
    /// compute a MAC with it.
    pub(crate) fn derive(&self, purpose: &str, material: &[u8]) -> [u8; KEY_BYTES] {
        let mut h = blake3::Hasher::new_derive_key(purpose);
        h.update(&self.0);
        h.update(material);
        *h.finalize().as_bytes()
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

/// 32 bytes from a regular, root-owned file that only root can read.
fn read_secret(path: &Path) -> Result<[u8; KEY_BYTES]> {
    let md = fs::symlink_metadata(path).map_err(|e| ArtifactError::io(path, "stat", e))?;
    if !md.file_type().is_file() || md.mode() & 0o077 != 0 || md.uid() != 0 {
        return Err(ArtifactError::Unsafe(format!(
            "{} must be a regular root-owned 0600 file (mode {:04o}, owner {})",
            path.display(),
            md.mode() & 0o7777,
            md.uid()
        )));
    }
    if md.len() != KEY_BYTES as u64 {
        return Err(ArtifactError::Invalid(format!(
            "{} is not {KEY_BYTES} bytes",
            path.display()
        )));
    }
    let bytes = fs::read(path).map_err(|e| ArtifactError::io(path, "read", e))?;
    bytes
        .try_into()
        .map_err(|_| ArtifactError::Invalid(format!("{} is not {KEY_BYTES} bytes", path.display())))
}

/// What a manifest records for workload fingerprints keyed with the host key.
pub const HOST_FINGERPRINT_KEY: &str = "host";

/// The key of a workload's secret fingerprints, with the name a manifest
/// records for it (`workload.fingerprint_key`): `host`, or `fleet:` and the
/// first 16 hex digits of a digest of the shared key (a digest of 32 random
/// bytes tells nothing of them), so a restore keyed otherwise is refused
/// naming the key, not a confusing change of every environment value.
pub struct FingerprintKey {
    key: HostKey,
    id: String,
}

impl FingerprintKey {
    /// This host's key (one host, or a fleet without a shared key).
    pub fn host(key: HostKey) -> Self {
        FingerprintKey {
            key,
            id: HOST_FINGERPRINT_KEY.to_string(),
        }
    }

    /// A fleet's shared key: 32 bytes in a regular root-owned 0600 file.
    pub fn fleet(path: &Path) -> Result<Self> {
        let bytes = read_secret(path)?;
        let mut id = Sha256::new();
        id.update(b"vsnap fleet fingerprint key id\0");
        id.update(bytes);
        Ok(FingerprintKey {
            key: HostKey(bytes),
            id: format!("fleet:{}", &hex(&id.finalize())[..16]),
        })
    }

    /// The fleet key when one is configured, else the host key under `root`
    /// (created on first use).
    pub fn load_or_create(root: &Path, fleet: Option<&Path>) -> Result<Self> {
        match fleet {
            Some(path) => Self::fleet(path),
            None => HostKey::load_or_create(root).map(Self::host),
        }
    }

    /// As [`FingerprintKey::load_or_create`], never creating the host key.
    pub fn load(root: &Path, fleet: Option<&Path>) -> Result<Self> {
        match fleet {
            Some(path) => Self::fleet(path),
            None => HostKey::load(root).map(Self::host),
        }
    }

    /// `host` or `fleet:<16 hex>`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// HMAC-SHA256 of `bytes` with this key, lowercase hex.
    pub fn mac(&self, bytes: &[u8]) -> String {
        self.key.mac(bytes)
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

    #[test]
    fn a_fleet_fingerprint_key_is_named_by_a_digest_and_refused_unless_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.key");
        crate::layout::write_synced(&path, &[9u8; 32]).unwrap();
        let a = FingerprintKey::fleet(&path).unwrap();
        assert!(
            a.id().starts_with("fleet:") && a.id().len() == 6 + 16,
            "{}",
            a.id()
        );
        assert!(!a.id().contains(&hex(&[9u8; 8])), "not the key itself");
        let host = FingerprintKey::load_or_create(dir.path(), None).unwrap();
        assert_eq!(host.id(), "host");
        assert_ne!(a.mac(b"x"), host.mac(b"x"));
        let same = FingerprintKey::load(dir.path(), Some(&path)).unwrap();
        assert_eq!((same.id(), same.mac(b"x")), (a.id(), a.mac(b"x")));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = FingerprintKey::fleet(&path).err().unwrap().to_string();
        assert!(
            err.contains("root-owned 0600") && err.contains("0644"),
            "{err}"
        );
        let short = dir.path().join("short.key");
        crate::layout::write_synced(&short, &[1u8; 16]).unwrap();
        let err = FingerprintKey::fleet(&short).err().unwrap().to_string();
        assert!(err.contains("is not 32 bytes"), "{err}");
    }
}
