//! Fingerprint keys for the tests: a host's own, and a fleet's shared one.

use std::path::Path;

use crate::key::FingerprintKey;

pub(super) fn test_key() -> (tempfile::TempDir, FingerprintKey) {
    let dir = tempfile::tempdir().unwrap();
    let key = FingerprintKey::load_or_create(dir.path(), None).unwrap();
    (dir, key)
}

pub(super) fn fleet_key(dir: &Path, byte: u8) -> FingerprintKey {
    let path = dir.join(format!("fleet-{byte}.key"));
    crate::layout::write_synced(&path, &[byte; 32]).unwrap();
    FingerprintKey::fleet(&path).unwrap()
}
