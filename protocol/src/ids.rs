//! Identifier syntax and generation.

use std::fs::File;
use std::io::{self, Read};

/// 32 lowercase hex digits, the form of Python's `uuid.uuid4().hex`.
pub fn is_uuid4_hex(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// 1 to 128 characters of `[A-Za-z0-9_.-]`.
pub fn is_activation_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A fresh random (version 4) UUID as 32 lowercase hex digits, read from /dev/urandom.
pub fn new_uuid4_hex() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_uuid4_hex_and_fresh() {
        let a = new_uuid4_hex().unwrap();
        let b = new_uuid4_hex().unwrap();
        assert!(is_uuid4_hex(&a), "{a}");
        assert_eq!(&a[12..13], "4");
        assert_ne!(a, b);
    }

    #[test]
    fn uuid_syntax_is_strict() {
        assert!(is_uuid4_hex("0123456789abcdef0123456789abcdef"));
        assert!(!is_uuid4_hex("0123456789ABCDEF0123456789abcdef"));
        assert!(!is_uuid4_hex("0123456789abcdef0123456789abcde"));
        assert!(!is_uuid4_hex("01234567-89ab-cdef-0123-456789abcdef"));
        assert!(!is_uuid4_hex(""));
    }

    #[test]
    fn activation_id_syntax_is_strict() {
        assert!(is_activation_id("copy-1.a_B"));
        assert!(is_activation_id(&"a".repeat(128)));
        assert!(!is_activation_id(&"a".repeat(129)));
        assert!(!is_activation_id(""));
        assert!(!is_activation_id("a/b"));
        assert!(!is_activation_id("a b"));
        assert!(!is_activation_id("é"));
    }
}
