//! `vsnap key generate --private PATH --public PATH`: a fleet's ed25519 key
//! pair (docs/fleet.md). The private key goes to the hosts that push
//! (`fleet_signing_key`), the public key to every host that pulls
//! (`fleet_trusted_keys`). Neither file may exist: a key is never
//! overwritten.

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
