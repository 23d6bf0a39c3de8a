//! Fleet signatures: what makes an artifact made on another host
//! trustworthy here. The host MAC ([`crate::HostKey`]) proves "this host
//! made it"; it cannot travel, because every host has its own secret. A
//! fleet signs what it shares with one ed25519 key pair: the private key
//! sits on the hosts (or the one build host) allowed to publish
//! (`fleet_signing_key`), the public key on every host allowed to restore
//! (`fleet_trusted_keys`). A pulled artifact is restored only when its
//! signature verifies with one of the trusted keys; it is then re-sealed
//! with the local host MAC and records who signed it (`Manifest::origin`).
//!
//! Key files are text, one header line and the key in lowercase hex:
//!
//! ```text
//! vsnap fleet signing key (ed25519 private seed)
//! 9f1c...64 hex digits...
//! ```
//!
//! and `vsnap fleet trusted key (ed25519 public)` for the public half. A
//! private key file must be a regular, root-owned 0600 file (as the host
//! key); a trusted key file a regular root-owned file writable by root
//! only, since whoever can add a trusted key can make this host restore
//! anything.
//!
//! What is signed is the caller's payload behind a fixed context string
//! ([`CONTEXT`]), so a fleet key's signature can never be replayed as a
//! signature of anything else the same key might one day sign.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ArtifactError, Result};
use crate::key::{hex, unhex};

/// The only algorithm signed and accepted.
pub const ALGORITHM: &str = "ed25519";
/// Prepended to every payload before signing or verifying.
pub const CONTEXT: &[u8] = b"vsnap fleet signature v1\0";
const PRIVATE_HEADER: &str = "vsnap fleet signing key (ed25519 private seed)";
const PUBLIC_HEADER: &str = "vsnap fleet trusted key (ed25519 public)";
/// Key files are two short lines; anything larger is not one.
const MAX_KEY_FILE: u64 = 4096;

/// The fleet's private key, to sign what this host publishes.
pub struct FleetSigner {
    key: SigningKey,
}

impl FleetSigner {
    /// Reads a private key file; refuses one that is not a regular,
    /// root-owned 0600 file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = read_key_file(path, KeyFile::Private)?;
        let seed = parse_key_file(path, &text, PRIVATE_HEADER)?;
        Ok(FleetSigner {
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// `ed25519:` and the first 16 hex digits of the sha256 of the public key.
    pub fn key_id(&self) -> String {
        key_id(&self.key.verifying_key())
    }

    pub fn sign(&self, payload: &[u8]) -> FleetSignature {
        let signature = self.key.sign(&with_context(payload));
        FleetSignature {
            key_id: self.key_id(),
            algorithm: ALGORITHM.to_string(),
            signature: hex(&signature.to_bytes()),
        }
    }
}

/// A signature as it travels beside what it signs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FleetSignature {
    /// Which key signed ([`FleetSigner::key_id`]).
    pub key_id: String,
    /// Always `ed25519`.
    pub algorithm: String,
    /// The 64-byte signature, lowercase hex.
    pub signature: String,
}

/// The public keys this host accepts fleet signatures from.
pub struct TrustedKeys {
    /// (key id, key), in the order configured, without duplicates.
    keys: Vec<(String, VerifyingKey)>,
}

impl TrustedKeys {
    /// Reads public key files (`fleet_trusted_keys`); each must be a regular
    /// root-owned file that only root can write.
    pub fn load(paths: &[PathBuf]) -> Result<Self> {
        let mut keys: Vec<(String, VerifyingKey)> = Vec::new();
        for path in paths {
            let text = read_key_file(path, KeyFile::Public)?;
            let bytes = parse_key_file(path, &text, PUBLIC_HEADER)?;
            let key = VerifyingKey::from_bytes(&bytes).map_err(|_| {
                ArtifactError::Invalid(format!(
                    "{}: not a valid ed25519 public key",
                    path.display()
                ))
            })?;
            let id = key_id(&key);
            if !keys.iter().any(|(known, _)| *known == id) {
                keys.push((id, key));
            }
        }
        Ok(TrustedKeys { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The trusted key ids, as configured.
    pub fn key_ids(&self) -> Vec<String> {
        self.keys.iter().map(|(id, _)| id.clone()).collect()
    }

    /// `Ok(key id)` of the trusted key whose signature over `payload`
    /// verifies, or an error that says why not: not signed, signed by a key
    /// not trusted here, another algorithm, or a signature that does not
    /// verify (the payload changed after signing, or the signature is
    /// damaged).
    pub fn verify(&self, payload: &[u8], sig: Option<&FleetSignature>) -> Result<String> {
        let refuse = |why: String| Err(ArtifactError::Signature(why));
        if self.keys.is_empty() {
            return refuse("no trusted keys are configured (fleet_trusted_keys)".into());
        }
        let Some(sig) = sig else {
            return refuse(format!(
                "not signed (a signature by one of {} is required)",
                self.key_ids().join(", ")
            ));
        };
        if sig.algorithm != ALGORITHM {
            return refuse(format!(
                "signed with algorithm {:?}, only {ALGORITHM} is accepted",
                sig.algorithm
            ));
        }
        let Some((id, key)) = self.keys.iter().find(|(id, _)| *id == sig.key_id) else {
            return refuse(format!(
                "signed by {} which is not among the trusted keys ({})",
                sig.key_id,
                self.key_ids().join(", ")
            ));
        };
        let bytes: Option<[u8; 64]> = unhex(&sig.signature).and_then(|b| b.try_into().ok());
        let verified = bytes
            .map(|b| Signature::from_bytes(&b))
            .is_some_and(|s| key.verify_strict(&with_context(payload), &s).is_ok());
        if !verified {
            return refuse(format!(
                "the signature by {id} does not verify (what it signs changed after signing, or the signature is damaged)"
            ));
        }
        Ok(id.clone())
    }
}

/// Makes a new key pair: the private key at `private_out` (0600) and the
/// public key at `public_out` (0644). Neither may exist yet (a key is never
/// overwritten). Returns the key id.
pub fn generate(private_out: &Path, public_out: &Path) -> Result<String> {
    if private_out == public_out {
        return Err(ArtifactError::Invalid(format!(
            "{}: the private and the public key need two files",
            private_out.display()
        )));
    }
    let mut seed = [0u8; 32];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| ArtifactError::io(Path::new("/dev/urandom"), "read", e))?;
    let key = SigningKey::from_bytes(&seed);
    seed.fill(0);
    let public = key.verifying_key();
    for path in [private_out, public_out] {
        if fs::symlink_metadata(path).is_ok() {
            return Err(ArtifactError::Invalid(format!(
                "{} exists already: a key is never overwritten",
                path.display()
            )));
        }
    }
    let private_text = format!("{PRIVATE_HEADER}\n{}\n", hex(key.as_bytes()));
    write_new(private_out, private_text.as_bytes(), 0o600)?;
    let public_text = format!("{PUBLIC_HEADER}\n{}\n", hex(public.as_bytes()));
    if let Err(e) = write_new(public_out, public_text.as_bytes(), 0o644) {
        // Half a pair is no use; the private key was made just now.
        let _ = fs::remove_file(private_out);
        return Err(e);
    }
    Ok(key_id(&public))
}

fn key_id(key: &VerifyingKey) -> String {
    format!(
        "{ALGORITHM}:{}",
        &hex(&Sha256::digest(key.as_bytes()))[..16]
    )
}

fn with_context(payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(CONTEXT.len() + payload.len());
    bytes.extend_from_slice(CONTEXT);
    bytes.extend_from_slice(payload);
    bytes
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum KeyFile {
    /// Secret: root-owned, 0600.
    Private,
    /// Trust: root-owned, writable by root only.
    Public,
}

/// Reads a key file after checking it is a regular root-owned file with the
/// mode its kind requires (not following a symlink).
pub(crate) fn read_key_file(path: &Path, kind: KeyFile) -> Result<String> {
    let md = fs::symlink_metadata(path).map_err(|e| ArtifactError::io(path, "stat", e))?;
    let (bad_bits, rule) = match kind {
        KeyFile::Private => (0o077, "a regular root-owned 0600 file"),
        KeyFile::Public => (0o022, "a regular root-owned file only root can write"),
    };
    if !md.file_type().is_file() || md.mode() & bad_bits != 0 || md.uid() != 0 {
        return Err(ArtifactError::Unsafe(format!(
            "{} must be {rule} (mode {:04o}, owner {})",
            path.display(),
            md.mode() & 0o7777,
            md.uid()
        )));
    }
    if md.len() > MAX_KEY_FILE {
        return Err(ArtifactError::Invalid(format!(
            "{}: {} bytes is too large for a key file",
            path.display(),
            md.len()
        )));
    }
    let file = fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| ArtifactError::io(path, "open", e))?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE)
        .read_to_string(&mut text)
        .map_err(|e| ArtifactError::io(path, "read", e))?;
    Ok(text)
}

/// The 32 key bytes of a key file: `header`, then 64 hex digits.
pub(crate) fn parse_key_file(path: &Path, text: &str, header: &str) -> Result<[u8; 32]> {
    let mut lines = text.lines();
    let invalid = |why: &str| {
        ArtifactError::Invalid(format!(
            "{}: not a vsnap key file ({why}; expected the line {header:?} and 64 hex digits)",
            path.display()
        ))
    };
    match lines.next() {
        Some(line) if line.trim_end() == header => {}
        Some(line) if line.starts_with("vsnap fleet ") => {
            return Err(invalid(&format!("it is a {:?}", line.trim_end())))
        }
        _ => return Err(invalid("no header line")),
    }
    let digits = lines.next().map(str::trim).unwrap_or_default();
    if lines.any(|l| !l.trim().is_empty()) {
        return Err(invalid("more than two lines"));
    }
    unhex(digits)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| invalid("the key is not 64 hex digits"))
}

pub(crate) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = fs::File::options()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| ArtifactError::io(path, "create", e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| ArtifactError::io(path, "write", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, String) {
        let (private, public) = (
            dir.join(format!("{name}.key")),
            dir.join(format!("{name}.pub")),
        );
        let id = generate(&private, &public).unwrap();
        (private, public, id)
    }

    #[test]
    fn a_signature_verifies_with_the_trusted_public_key_only_over_the_same_payload() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public, id) = pair(dir.path(), "fleet");
        let signer = FleetSigner::load(&private).unwrap();
        assert_eq!(signer.key_id(), id);
        assert!(id.starts_with("ed25519:") && id.len() == 8 + 16, "{id}");
        let sig = signer.sign(b"sha256:abcd");
        assert_eq!(sig.algorithm, "ed25519");
        assert_eq!(sig.signature.len(), 128);
        let trusted = TrustedKeys::load(&[public]).unwrap();
        assert!(!trusted.is_empty());
        assert_eq!(trusted.verify(b"sha256:abcd", Some(&sig)).unwrap(), id);
        let err = trusted
            .verify(b"sha256:abce", Some(&sig))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("the signature by {id} does not verify")),
            "{err}"
        );
        // A signature survives JSON as it travels.
        let back: FleetSignature =
            serde_json::from_str(&serde_json::to_string(&sig).unwrap()).unwrap();
        assert_eq!(back, sig);
    }

    #[test]
    fn refusals_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let (private, _, id) = pair(dir.path(), "fleet");
        let (other_private, other_public, other_id) = pair(dir.path(), "other");
        let trusted = TrustedKeys::load(&[other_public]).unwrap();
        let err = trusted.verify(b"p", None).unwrap_err().to_string();
        assert!(
            err.contains("not signed") && err.contains(&other_id),
            "{err}"
        );
        let sig = FleetSigner::load(&private).unwrap().sign(b"p");
        let err = trusted.verify(b"p", Some(&sig)).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "signed by {id} which is not among the trusted keys ({other_id})"
            )),
            "{err}"
        );
        // A key id claimed by a signature another key made.
        let mut forged = FleetSigner::load(&private).unwrap().sign(b"p");
        forged.key_id = other_id.clone();
        let err = trusted.verify(b"p", Some(&forged)).unwrap_err().to_string();
        assert!(err.contains("does not verify"), "{err}");
        let mut damaged = FleetSigner::load(&other_private).unwrap().sign(b"p");
        assert!(trusted.verify(b"p", Some(&damaged)).is_ok());
        damaged.signature = "zz".into();
        assert!(trusted.verify(b"p", Some(&damaged)).is_err());
        damaged.algorithm = "rsa".into();
        let err = trusted
            .verify(b"p", Some(&damaged))
            .unwrap_err()
            .to_string();
        assert!(err.contains("only ed25519"), "{err}");
        let none = TrustedKeys::load(&[]).unwrap();
        assert!(none.is_empty());
        assert!(none.verify(b"p", Some(&sig)).is_err());
    }

    /// Signatures and key ids are bytes on disk and on the wire: a fixed seed
    /// gives the same public key, key id and signature whatever the crate
    /// versions behind them (RFC 8032 section 7.1, test 1, then a fleet
    /// signature over a payload with that key).
    #[test]
    fn known_answers_stay_byte_identical() {
        let seed: [u8; 32] =
            unhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
                .unwrap()
                .try_into()
                .unwrap();
        let key = SigningKey::from_bytes(&seed);
        assert_eq!(
            hex(key.verifying_key().as_bytes()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
        );
        assert_eq!(
            hex(&key.sign(b"").to_bytes()),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065\
             224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24\
             655141438e7a100b"
        );
        let signer = FleetSigner { key };
        let sig = signer.sign(b"sha256:abcd");
        assert_eq!(sig.key_id, "ed25519:21fe31dfa154a261");
        assert_eq!(
            sig.signature,
            "792fdcd9d49b3de3160303f340340a7b3460b25999e7e702060c837043c2ad72\
             c4847f72291fefe830f865d1ae45d26aa2147b464f1ce85a428c87d71d5e950e"
        );
        let trusted = TrustedKeys {
            keys: vec![(sig.key_id.clone(), signer.key.verifying_key())],
        };
        assert_eq!(
            trusted.verify(b"sha256:abcd", Some(&sig)).unwrap(),
            sig.key_id
        );
    }

    #[test]
    fn the_payload_is_signed_behind_a_context() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public, _) = pair(dir.path(), "fleet");
        let signer = FleetSigner::load(&private).unwrap();
        let sig = signer.sign(b"payload");
        let bytes: [u8; 64] = unhex(&sig.signature).unwrap().try_into().unwrap();
        let trusted = TrustedKeys::load(&[public]).unwrap();
        let (_, key) = &trusted.keys[0];
        assert!(key
            .verify_strict(b"payload", &Signature::from_bytes(&bytes))
            .is_err());
    }

    #[test]
    fn key_files_are_refused_unless_private_and_root_owned() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public, _) = pair(dir.path(), "fleet");
        assert_eq!(
            fs::metadata(&private).unwrap().permissions().mode() & 0o777,
            0o600
        );
        fs::set_permissions(&private, fs::Permissions::from_mode(0o640)).unwrap();
        let err = FleetSigner::load(&private).err().unwrap().to_string();
        assert!(
            err.contains("root-owned 0600") && err.contains("0640"),
            "{err}"
        );
        fs::set_permissions(&public, fs::Permissions::from_mode(0o664)).unwrap();
        let err = TrustedKeys::load(std::slice::from_ref(&public))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("only root can write"), "{err}");
        fs::set_permissions(&public, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(TrustedKeys::load(std::slice::from_ref(&public)).is_ok());
        // The halves are not interchangeable.
        fs::set_permissions(&private, fs::Permissions::from_mode(0o600)).unwrap();
        let err = TrustedKeys::load(std::slice::from_ref(&private))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("it is a \"vsnap fleet signing key"), "{err}");
        let link = dir.path().join("link.pub");
        std::os::unix::fs::symlink(&public, &link).unwrap();
        assert!(TrustedKeys::load(&[link]).is_err(), "no symlink");
        let junk = dir.path().join("junk.pub");
        write_new(
            &junk,
            b"vsnap fleet trusted key (ed25519 public)\nxyz\n",
            0o644,
        )
        .unwrap();
        let err = TrustedKeys::load(&[junk]).err().unwrap().to_string();
        assert!(err.contains("not 64 hex digits"), "{err}");
    }

    #[test]
    fn generate_never_overwrites_a_key() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public, id) = pair(dir.path(), "fleet");
        let before = fs::read(&private).unwrap();
        let err = generate(&private, &dir.path().join("new.pub"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("never overwritten"), "{err}");
        assert_eq!(fs::read(&private).unwrap(), before);
        assert!(!dir.path().join("new.pub").exists());
        assert!(generate(&dir.path().join("new.key"), &public).is_err());
        assert!(!dir.path().join("new.key").exists(), "no half pair is left");
        // The same public key twice is one trusted key.
        let trusted = TrustedKeys::load(&[public.clone(), public]).unwrap();
        assert_eq!(trusted.key_ids(), [id]);
    }
}
