//! `vsnap key generate --private PATH --public PATH`: a fleet's ed25519 key
//! pair (docs/fleet.md). The private key goes to the hosts that push
//! (`fleet_signing_key`), the public key to every host that pulls
//! (`fleet_trusted_keys`). `vsnap key generate-encryption PATH`: a fleet
//! encryption key (`fleet_encryption_key` on every host that pushes or
//! pulls). No file may exist: a key is never overwritten.

use std::path::Path;

use serde::Serialize;
use vsnap_artifact::signature;

use crate::{emit, emit_json, warn, Outcome, OK};

#[derive(Serialize)]
struct Generated<'a> {
    key_id: &'a str,
    private: String,
    public: String,
}

pub fn generate(private: &Path, public: &Path, json: bool) -> Outcome {
    let id = signature::generate(private, public).map_err(|e| format!("key generate: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        warn(&format!(
            "key generate: the files are not root-owned: the shim accepts only root-owned key files (chown root {} {})",
            private.display(),
            public.display()
        ));
    }
    if json {
        emit_json(&Generated {
            key_id: &id,
            private: private.display().to_string(),
            public: public.display().to_string(),
        });
    } else {
        emit(&format!(
            "fleet key {id}\n  private: {} (0600: fleet_signing_key on the hosts that push)\n  public:  {} (fleet_trusted_keys on every host that pulls)\n",
            private.display(),
            public.display()
        ));
    }
    Ok(OK)
}

#[derive(Serialize)]
struct GeneratedEncryption<'a> {
    key_id: &'a str,
    path: String,
}

pub fn generate_encryption(path: &Path, json: bool) -> Outcome {
    let id = vsnap_artifact::encryption::generate(path)
        .map_err(|e| format!("key generate-encryption: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        warn(&format!(
            "key generate-encryption: the file is not root-owned: the shim accepts only a root-owned key file (chown root {})",
            path.display()
        ));
    }
    if json {
        emit_json(&GeneratedEncryption {
            key_id: &id,
            path: path.display().to_string(),
        });
    } else {
        emit(&format!(
            "fleet encryption key {id}\n  {} (0600: fleet_encryption_key on every host that pushes or pulls; copy it only over a channel as safe as the engines' secrets)\n",
            path.display()
        ));
    }
    Ok(OK)
}
