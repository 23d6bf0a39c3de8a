//! Secret values as keyed fingerprints: environment values, and the values
//! of argv's secret flags redacted to an HMAC tag.

use crate::key::FingerprintKey;

/// HMAC(fingerprint key, name NUL value), hex: equal values give equal
/// fingerprints under one key, the value is never stored, and a guess cannot
/// be checked against a manifest without the key.
pub fn env_fingerprint(key: &FingerprintKey, name: &str, value: &str) -> String {
    let mut bytes = Vec::with_capacity(name.len() + value.len() + 1);
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(value.as_bytes());
    key.mac(&bytes)
}

/// Words that make a flag secret when they are a whole part of its name
/// (`--api-key`, `--hf-token`, `--db-password`, `--client_secret`), but not
/// `--max-num-batched-tokens` or `--ssl-keyfile`.
const SECRET_WORDS: &[&str] = &[
    "key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "credential",
    "credentials",
];
/// Flags argparse lets users abbreviate (`--api-k`): their prefixes count.
const ABBREVIATED: &[&str] = &["--api-key", "--hf-token"];

fn is_secret_flag(flag: &str) -> bool {
    let name = flag.trim_start_matches('-').to_ascii_lowercase();
    name.split(['-', '_'])
        .any(|part| SECRET_WORDS.contains(&part))
        || ABBREVIATED
            .iter()
            .any(|s| flag.len() > 5 && flag.len() >= s.len() - 3 && s.starts_with(flag))
}

/// What a redacted secret value starts with; its HMAC tag follows.
pub(super) const REDACTED: &str = "***:";

/// Replaces the value of every secret flag (`--x VALUE` or `--x=VALUE`)
/// with `***:` and the first 16 hex digits of its HMAC with the
/// fingerprint key: a changed secret still changes the identity, and none
/// is stored.
pub fn redact_argv(key: &FingerprintKey, argv: Vec<String>) -> Vec<String> {
    let hide = |v: &str| format!("{REDACTED}{}", &key.mac(v.as_bytes())[..16]);
    let mut out = Vec::with_capacity(argv.len());
    let mut redact_next = false;
    for arg in argv {
        if redact_next {
            out.push(hide(&arg));
            redact_next = false;
            continue;
        }
        match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") && is_secret_flag(flag) => {
                out.push(format!("{flag}={}", hide(value)))
            }
            None if arg.starts_with("--") && is_secret_flag(&arg) => {
                redact_next = true;
                out.push(arg);
            }
            _ => out.push(arg),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::test_key;
    use super::*;

    #[test]
    fn secrets_in_argv_are_redacted_by_name_and_keyed() {
        let (_d, key) = test_key();
        let argv = [
            "serve",
            "--api-key",
            "s3cret",
            "--hf-token=hf_x",
            "--api-k",
            "abbr",
            "--db_password",
            "pw",
            "--client-secret=cs",
            "--max-num-batched-tokens",
            "8192",
            "--ssl-keyfile",
            "/k.pem",
            "--port",
            "8000",
        ]
        .map(String::from)
        .to_vec();
        let r = redact_argv(&key, argv.clone());
        let hidden = |v: &str| format!("***:{}", &key.mac(v.as_bytes())[..16]);
        assert_eq!(
            r,
            [
                "serve".to_string(),
                "--api-key".into(),
                hidden("s3cret"),
                format!("--hf-token={}", hidden("hf_x")),
                "--api-k".into(),
                hidden("abbr"),
                "--db_password".into(),
                hidden("pw"),
                format!("--client-secret={}", hidden("cs")),
                "--max-num-batched-tokens".into(),
                "8192".into(),
                "--ssl-keyfile".into(),
                "/k.pem".into(),
                "--port".into(),
                "8000".into(),
            ]
        );
        for secret in ["s3cret", "hf_x", "abbr", "pw", "cs"] {
            assert!(!r.iter().any(|a| a.ends_with(secret)), "{secret}: {r:?}");
        }
        // Another host's key gives other tags: nothing to compare offline.
        let (_d2, other) = test_key();
        assert_ne!(redact_argv(&other, argv), r);
    }
}
