//! Malformed input never panics: thousands of random and mutated documents go through
//! every reader. Deterministic (splitmix64), so a failure reproduces.

use std::path::Path;

use vsnap_protocol::{
    parse, Activation, CaptureReady, Challenge, ErrorRecord, ProtocolError, ReadyFile, ReleaseFile,
    Schema, Status,
};

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SEEDS: [&str; 7] = [
    r#"{"activation_id":"copy-1","capture_id":"0123456789abcdef4123456789abcdef","host":null,"kind":"copy","native_complete":true,"port":8000,"version":1}"#,
    r#"{"capture_id":"0123456789abcdef4123456789abcdef","oracle":{"sampled_token_logprob":-1.5,"text":" P","token_ids":[48]},"pid":1,"version":1}"#,
    r#"{"activation_id":"a","capture_id":"0123456789abcdef4123456789abcdef","nonce":"aaaaaaaaaaaaaaaa4aaaaaaaaaaaaaaa","version":1}"#,
    r#"{"activation_id":"a","capture_id":"0123456789abcdef4123456789abcdef","phase":"validated"}"#,
    r#"{"activation_id":null,"capture_id":"0123456789abcdef4123456789abcdef","error":"e","error_type":"t","phase":"p"}"#,
    r#"{"host":"127.0.0.1","port":8000,"release":true}"#,
    r#"{"sampled_token_logprob":-0.5,"text":"x","token_ids":[1]}"#,
];

/// Fragments that make JSON interesting: structure, escapes, numbers at the edges.
const FRAGMENTS: [&str; 20] = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\u0000",
    "\\ud800",
    "null",
    "true",
    "-0",
    "1e400",
    "18446744073709551616",
    "-1",
    "\"version\":1",
    "\"x\":",
    "\u{feff}",
    "\u{0}",
    "0.1e-400",
];

fn mutate(rng: &mut SplitMix64, seed: &[u8]) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(bytes.len() + 1);
        match rng.below(6) {
            0 => bytes.truncate(at),
            1 => {
                if at < bytes.len() {
                    bytes[at] ^= 1 << rng.below(8);
                }
            }
            2 => {
                let fragment = FRAGMENTS[rng.below(FRAGMENTS.len())].as_bytes();
                bytes.splice(at..at, fragment.iter().copied());
            }
            3 => {
                let end = (at + rng.below(8)).min(bytes.len());
                bytes.drain(at..end);
            }
            4 => {
                let end = (at + rng.below(16)).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
            _ => bytes.insert(at, rng.next() as u8),
        }
    }
    bytes
}

fn random_bytes(rng: &mut SplitMix64) -> Vec<u8> {
    let len = rng.below(96);
    (0..len).map(|_| rng.next() as u8).collect()
}

fn try_all(bytes: &[u8]) -> usize {
    fn one<T: Schema>(bytes: &[u8]) -> bool {
        match parse::<T>(Path::new("/fuzz/file.json"), bytes) {
            Ok(_) => true,
            Err(e) => {
                // Every refusal names the file.
                assert!(e.to_string().starts_with("/fuzz/file.json: "), "{e}");
                assert!(matches!(
                    e,
                    ProtocolError::Malformed { .. } | ProtocolError::Invalid { .. }
                ));
                false
            }
        }
    }
    [
        one::<Activation>(bytes),
        one::<CaptureReady>(bytes),
        one::<Challenge>(bytes),
        one::<Status>(bytes),
        one::<ErrorRecord>(bytes),
        one::<ReleaseFile>(bytes),
        one::<ReadyFile>(bytes),
    ]
    .iter()
    .filter(|ok| **ok)
    .count()
}

#[test]
fn seeds_are_valid_documents() {
    for seed in SEEDS {
        assert!(try_all(seed.as_bytes()) >= 1, "{seed}");
    }
}

#[test]
fn mutated_documents_never_panic() {
    let mut rng = SplitMix64(0x5eed);
    let mut accepted = 0;
    for i in 0..6_000 {
        let seed = SEEDS[i % SEEDS.len()].as_bytes();
        accepted += try_all(&mutate(&mut rng, seed));
    }
    // Some mutations keep a document valid; most do not. Both paths were exercised.
    assert!(accepted > 0);
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = SplitMix64(0xbad);
    for _ in 0..6_000 {
        let mut bytes = random_bytes(&mut rng);
        if rng.below(2) == 0 {
            bytes.insert(0, b'{');
        }
        try_all(&bytes);
    }
}

#[test]
fn deep_nesting_never_panics() {
    let deep = format!("{{\"host\":{}1{}}}", "[".repeat(10_000), "]".repeat(10_000));
    assert_eq!(try_all(deep.as_bytes()), 0);
}
