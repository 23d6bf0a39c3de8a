//! The engine's userspace random state, and the identity that makes one activated process
//! an individual.
//!
//! Like a Python process seeding `random` at import, the engine seeds a generator from the
//! kernel when it starts. That state lies in the donor's memory when it is captured, so every
//! copy restored from the artifact draws the same numbers (twins), until the capturer's
//! identity (identity.json, or the barrier's release file) reseeds it. The identity is
//! applied only after the recovery canary matched: the canary must reproduce the donor's
//! answer from the donor's state. Decoding is greedy and never draws from this generator,
//! so completions stay identical between a cold start, the donor and every copy.

use std::sync::Mutex;

use serde_json::{json, Value};
use vsnap_protocol::Identity;

use crate::log;
use crate::prng::{mix, SplitMix64};

/// The generator and the identity applied to it, if any.
pub struct Userspace {
    inner: Mutex<Inner>,
}

struct Inner {
    rng: SplitMix64,
    identity: Option<Identity>,
}

impl Userspace {
    /// Seeded as a process seeds its generators at start: from the kernel (the clock and
    /// the pid if /dev/urandom cannot be read).
    pub fn at_start() -> Self {
        Userspace::with_seed(start_seed())
    }

    pub fn with_seed(seed: u64) -> Self {
        Userspace {
            inner: Mutex::new(Inner {
                rng: SplitMix64::new(seed),
                identity: None,
            }),
        }
    }

    /// Reseeds the generator from the identity's whole seed and keeps the identity.
    pub fn apply(&self, identity: Identity) {
        log(&format!(
            "identity: hostname {}, {} pod IPs, seed applied",
            identity.hostname,
            identity.pod_ips.len()
        ));
        let mut inner = self.lock();
        inner.rng = SplitMix64::new(seed_state(&identity));
        inner.identity = Some(identity);
    }

    /// The next draw of the generator.
    #[cfg(test)]
    pub fn draw(&self) -> u64 {
        self.lock().rng.next_u64()
    }

    /// `GET /v1/identity`: `{"hostname", "pod_ips", "seed_applied", "draw"}`, the draw a
    /// decimal string (exact in any JSON reader); every call advances the generator.
    pub fn report(&self) -> Value {
        let mut inner = self.lock();
        let draw = inner.rng.next_u64();
        let identity = inner.identity.as_ref();
        json!({
            "hostname": identity.map(|i| i.hostname.clone()),
            "pod_ips": identity.map_or_else(Vec::new, |i| i.pod_ips.clone()),
            "seed_applied": identity.is_some(),
            "draw": draw.to_string(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the generator half-updated.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The generator's state for an identity: all of its seed's bytes, folded 8 at a time.
pub fn seed_state(identity: &Identity) -> u64 {
    identity
        .seed
        .as_bytes()
        .chunks(16)
        .fold(0x6964_656e_7469_7479, |acc, chunk| {
            let word = std::str::from_utf8(chunk)
                .ok()
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                .unwrap_or(0);
            mix(acc ^ word)
        })
}

fn start_seed() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let kernel = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    match kernel {
        Ok(()) => u64::from_le_bytes(bytes),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            mix(nanos ^ u64::from(std::process::id()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(seed: &str) -> Identity {
        Identity {
            hostname: "pod-b".into(),
            pod_ips: vec!["10.1.0.3".into()],
            seed: seed.repeat(64 / seed.len()),
            version: vsnap_protocol::PROTOCOL_VERSION,
        }
    }

    fn draws(userspace: &Userspace) -> Vec<u64> {
        (0..4).map(|_| userspace.draw()).collect()
    }

    #[test]
    fn without_an_identity_copies_of_one_state_are_twins() {
        let (a, b) = (Userspace::with_seed(7), Userspace::with_seed(7));
        assert_eq!(draws(&a), draws(&b));
        assert_eq!(a.report(), b.report());
        assert_eq!(a.report()["seed_applied"], false);
        assert_eq!(a.report()["hostname"], Value::Null);
    }

    #[test]
    fn an_identity_changes_the_draws() {
        let (twin, reseeded) = (Userspace::with_seed(7), Userspace::with_seed(7));
        reseeded.apply(identity("ab"));
        assert_ne!(draws(&twin), draws(&reseeded));
    }

    #[test]
    fn different_seeds_draw_differently_and_one_seed_alike() {
        // The donor state before the identity does not matter, only the seed.
        let (a, b, c) = (
            Userspace::with_seed(1),
            Userspace::with_seed(2),
            Userspace::with_seed(1),
        );
        a.draw();
        a.apply(identity("ab"));
        b.apply(identity("ab"));
        c.apply(identity("cd"));
        let (da, db, dc) = (draws(&a), draws(&b), draws(&c));
        assert_eq!(da, db);
        assert_ne!(da, dc);
        assert_eq!(a.report(), b.report());
    }

    #[test]
    fn every_byte_of_the_seed_counts() {
        let base = identity("00");
        let mut last = base.clone();
        last.seed.replace_range(63.., "1");
        let mut first = base.clone();
        first.seed.replace_range(..1, "1");
        let states = [&base, &last, &first].map(seed_state);
        assert_ne!(states[0], states[1]);
        assert_ne!(states[0], states[2]);
        assert_ne!(states[1], states[2]);
    }

    #[test]
    fn the_report_names_the_identity_and_advances() {
        let userspace = Userspace::with_seed(3);
        userspace.apply(identity("5a"));
        let first = userspace.report();
        let second = userspace.report();
        assert_eq!(first["hostname"], "pod-b");
        assert_eq!(first["pod_ips"], json!(["10.1.0.3"]));
        assert_eq!(first["seed_applied"], true);
        assert_ne!(first["draw"], second["draw"]);
        let draw: u64 = first["draw"].as_str().unwrap().parse().unwrap();
        let expected = SplitMix64::new(seed_state(&identity("5a"))).next_u64();
        assert_eq!(draw, expected);
    }

    #[test]
    fn start_seeds_differ_between_processes() {
        // Two reads of the kernel's generator: what two cold starts get.
        assert_ne!(start_seed(), start_seed());
    }
}
