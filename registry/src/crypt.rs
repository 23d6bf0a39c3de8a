//! Encryption of what a registry stores (docs/fleet.md, "Encryption"):
//! every chunk and the config blob travel as a sealed envelope
//!
//! ```text
//! keyed id (32 bytes) | ChaCha20-Poly1305 ciphertext | tag (16 bytes)
//! ```
//!
//! Convergent, so that identical chunks still deduplicate within a fleet:
//! the keyed id is BLAKE3 keyed with a key derived from the fleet secret,
//! over the plaintext; the chunk's own key is BLAKE3 keyed (another derived
//! key) over that id, and each such key encrypts exactly one plaintext, so
//! its nonce is fixed. One plaintext under one fleet key always gives the
//! same envelope, and so the same blob digest. Without the fleet key a
//! registry reader cannot compute an id: it cannot confirm a guessed chunk,
//! only see that two blobs are equal. Opening checks the AEAD tag, then
//! that the plaintext's keyed id is the one the envelope names: a chunk is
//! used only when both hold.

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce, Tag};
use vsnap_artifact::encryption::EncryptionKey;

/// Bytes an envelope adds to its plaintext: the keyed id and the tag.
pub const OVERHEAD: u64 = 32 + 16;
/// Bound to every envelope (the AEAD's associated data).
const AAD: &[u8] = b"vsnap sealed blob v1";

/// Seals and opens envelopes with one fleet encryption key.
#[derive(Clone)]
pub struct Sealer {
    key_id: String,
    id_key: [u8; 32],
    chunk_key: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("key_id", &self.key_id)
            .finish()
    }
}

/// Why an envelope did not open.
#[derive(Debug, PartialEq, Eq)]
pub enum OpenError {
    /// Shorter than an envelope.
    Short,
    /// The tag does not verify: another key, or damaged bytes.
    Tag,
    /// It decrypted, but the plaintext's keyed id is not the one named.
    Id,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OpenError::Short => "is shorter than an encrypted envelope",
            OpenError::Tag => "does not decrypt (its authentication tag does not verify: another fleet key, or damaged bytes)",
            OpenError::Id => "decrypts to bytes whose keyed digest is not the one it names",
        })
    }
}

impl Sealer {
    pub fn new(key: &EncryptionKey) -> Self {
        Sealer {
            key_id: key.id().to_string(),
            id_key: key.derive("vsnap 2026 sealed blob keyed id"),
            chunk_key: key.derive("vsnap 2026 sealed blob key"),
        }
    }

    /// `fleet-enc:<16 hex>`.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    fn cipher(&self, id: &[u8; 32]) -> ChaCha20Poly1305 {
        let key = blake3::keyed_hash(&self.chunk_key, id);
        ChaCha20Poly1305::new(&(*key.as_bytes()).into())
    }

    /// The envelope of `plain`.
    pub fn seal(&self, plain: &[u8]) -> Vec<u8> {
        let id = *blake3::keyed_hash(&self.id_key, plain).as_bytes();
        let mut out = Vec::with_capacity(plain.len() + OVERHEAD as usize);
        out.extend_from_slice(&id);
        out.extend_from_slice(plain);
        let tag = self
            .cipher(&id)
            .encrypt_inout_detached(&Nonce::default(), AAD, (&mut out[32..]).into())
            .expect("a chunk is far below ChaCha20-Poly1305's length limit");
        out.extend_from_slice(&tag);
        out
    }

    /// The plaintext of `envelope`, decrypted in place: the bytes after the
    /// id. Checked against the tag and the id.
    pub fn open(&self, mut envelope: Vec<u8>) -> Result<Vec<u8>, OpenError> {
        if (envelope.len() as u64) < OVERHEAD {
            return Err(OpenError::Short);
        }
        let id: [u8; 32] = envelope[..32].try_into().expect("32 bytes");
        let tag_at = envelope.len() - 16;
        let tag = Tag::try_from(&envelope[tag_at..]).expect("16 bytes");
        self.cipher(&id)
            .decrypt_inout_detached(
                &Nonce::default(),
                AAD,
                (&mut envelope[32..tag_at]).into(),
                &tag,
            )
            .map_err(|_| OpenError::Tag)?;
        envelope.truncate(tag_at);
        envelope.drain(..32);
        if blake3::keyed_hash(&self.id_key, &envelope).as_bytes() != &id {
            return Err(OpenError::Id);
        }
        Ok(envelope)
    }
}

/// The fleet encryption keys of a runtime config: the current one (pushes
/// encrypt with it) and the previous ones (decrypt only), by id.
#[derive(Debug, Default, Clone)]
pub struct FleetKeys {
    pub current: Option<Sealer>,
    pub previous: Vec<Sealer>,
}

impl FleetKeys {
    /// `fleet_encryption_key` and `fleet_decryption_keys`, each a
    /// root-owned 0600 key file.
    pub fn from_config(config: &vsnap_config::RuntimeConfig) -> Result<Self, String> {
        let load = |what: &str, path: &std::path::Path| {
            EncryptionKey::load(path)
                .map(|k| Sealer::new(&k))
                .map_err(|e| format!("{what}: {e}"))
        };
        let current = match &config.fleet_encryption_key {
            Some(path) => Some(load("fleet_encryption_key", path)?),
            None => None,
        };
        let previous = config
            .fleet_decryption_keys
            .iter()
            .map(|p| load("fleet_decryption_keys", p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FleetKeys { current, previous })
    }

    /// The key of id `key_id`, current or previous.
    pub fn find(&self, key_id: &str) -> Option<&Sealer> {
        self.current
            .iter()
            .chain(&self.previous)
            .find(|s| s.key_id == key_id)
    }

    /// Every key id held, the current one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.current
            .iter()
            .chain(&self.previous)
            .map(|s| s.key_id.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer(byte: u8) -> Sealer {
        Sealer::new(&EncryptionKey::from_secret([byte; 32]))
    }

    #[test]
    fn an_envelope_opens_with_its_key_only_and_equal_chunks_seal_equal() {
        let (a, b) = (sealer(1), sealer(2));
        let plain = b"API_KEY=sk-very-secret pages of an engine".repeat(100);
        let env = a.seal(&plain);
        assert_eq!(env.len() as u64, plain.len() as u64 + OVERHEAD);
        assert!(
            !env.windows(13).any(|w| w == b"sk-very-secre"),
            "no plaintext in the envelope"
        );
        assert_eq!(a.seal(&plain), env, "convergent: dedup within a fleet");
        assert_ne!(b.seal(&plain), env, "another fleet, another blob");
        assert_eq!(a.open(env.clone()).unwrap(), plain);
        assert_eq!(b.open(env.clone()), Err(OpenError::Tag));
        assert_eq!(a.open(env[..40].to_vec()), Err(OpenError::Short));
        assert_eq!(a.seal(b"").len() as u64, OVERHEAD);
        assert_eq!(a.open(a.seal(b"")).unwrap(), b"");
    }

    #[test]
    fn a_changed_byte_anywhere_is_refused() {
        let a = sealer(3);
        let env = a.seal(&[7u8; 1000]);
        for at in [0, 31, 32, 500, env.len() - 17, env.len() - 1] {
            let mut bad = env.clone();
            bad[at] ^= 1;
            assert_eq!(a.open(bad), Err(OpenError::Tag), "byte {at}");
        }
        // A valid envelope whose id was swapped for another chunk's cannot
        // be made without the key: the id selects the chunk key.
        let other = a.seal(&[8u8; 1000]);
        let mut swapped = other[..32].to_vec();
        swapped.extend_from_slice(&env[32..]);
        assert_eq!(a.open(swapped), Err(OpenError::Tag));
    }

    #[test]
    fn keys_are_found_by_id_current_first() {
        let keys = FleetKeys {
            current: Some(sealer(1)),
            previous: vec![sealer(2)],
        };
        let ids = keys.key_ids();
        assert_eq!(ids.len(), 2);
        assert_eq!(keys.find(&ids[1]).unwrap().key_id(), ids[1]);
        assert!(keys.find("fleet-enc:0000000000000000").is_none());
        assert!(!format!("{keys:?}").contains("id_key"));
    }
}
