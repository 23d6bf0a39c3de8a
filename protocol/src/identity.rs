//! identity.json: what makes one activated process an individual. Every copy
//! restored from one artifact starts from the donor's memory: its hostname
//! read at init, the addresses it looked up, the state of every userspace
//! random generator. The capturer writes this file into the control dir before
//! the activation (and, in barrier mode, as the release file's `identity`);
//! the engine applies it only after its canary matched, since the canary must
//! reproduce the donor's answer from the donor's state.

use serde::{Deserialize, Serialize};

use crate::files;
use crate::messages::{Message, Schema};

/// Bytes of a seed, drawn from the kernel's generator for every activation.
pub const SEED_BYTES: usize = 32;

/// The activated process's own identity: its container's hostname, the
/// addresses of its network namespace's interfaces (loopback left out), and
/// a fresh seed for its userspace generators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub hostname: String,
    pub pod_ips: Vec<String>,
    /// [`SEED_BYTES`] bytes as lowercase hex.
    pub seed: String,
    pub version: u32,
}

impl Identity {
    /// An identity with a fresh seed read from /dev/urandom.
    pub fn fresh(hostname: String, pod_ips: Vec<String>) -> std::io::Result<Self> {
        use std::io::Read;
        let mut bytes = [0u8; SEED_BYTES];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(Identity {
            hostname,
            pod_ips,
            seed: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            version: crate::messages::PROTOCOL_VERSION,
        })
    }

    /// The seed's first 8 bytes as a number (what a generator that takes a
    /// 64-bit seed is seeded with).
    pub fn seed_u64(&self) -> u64 {
        u64::from_str_radix(&self.seed[..16], 16).expect("checked hex")
    }
}

impl Schema for Identity {
    fn check(&self) -> Result<(), String> {
        if self.version != crate::messages::PROTOCOL_VERSION {
            return Err(format!(
                "version {} is not supported (expected {})",
                self.version,
                crate::messages::PROTOCOL_VERSION
            ));
        }
        let hex = |s: &str| s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if self.seed.len() != 2 * SEED_BYTES || !hex(&self.seed) {
            return Err(format!(
                "seed {:?} is not {SEED_BYTES} bytes of lowercase hex",
                self.seed
            ));
        }
        if let Some(ip) = self
            .pod_ips
            .iter()
            .find(|ip| ip.parse::<std::net::IpAddr>().is_err())
        {
            return Err(format!("pod_ips: {ip:?} is not an IP address"));
        }
        Ok(())
    }
}

impl Message for Identity {
    const FILE: &'static str = files::IDENTITY;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_identities_differ_only_in_their_seed_and_pass_the_schema() {
        let a = Identity::fresh("pod-a".into(), vec!["10.1.0.2".into()]).unwrap();
        let b = Identity::fresh("pod-a".into(), vec!["10.1.0.2".into()]).unwrap();
        assert_ne!(a.seed, b.seed);
        assert_ne!(a.seed_u64(), b.seed_u64());
        a.check().unwrap();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Identity>(&json).unwrap(), a);
    }

    #[test]
    fn a_bad_seed_or_address_is_named() {
        let mut a = Identity::fresh("h".into(), vec![]).unwrap();
        a.seed = "XYZ".into();
        assert!(a.check().unwrap_err().contains("seed"));
        let mut b = Identity::fresh("h".into(), vec!["fe80::1".into()]).unwrap();
        b.check().unwrap();
        b.pod_ips.push("pod".into());
        assert!(b.check().unwrap_err().contains("\"pod\""));
    }
}
