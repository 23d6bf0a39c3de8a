//! The optional weights file: a fixed header, the tensors as little-endian f32, and an
//! FNV-1a checksum of everything before it.
//!
//! ```text
//! "VSNAPW01" | u32 vocab | u32 d_model | u32 d_mlp | u32 0 | f32 ... | u64 fnv1a
//! ```

use std::fs;
use std::path::Path;

use crate::model::{Weights, D_MLP, D_MODEL, TENSOR_SIZES, VOCAB};

const MAGIC: &[u8; 8] = b"VSNAPW01";
const HEADER_LEN: usize = 8 + 4 * 4;

pub fn encode(weights: &Weights) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + TENSOR_SIZES.iter().sum::<usize>() * 4 + 8);
    out.extend_from_slice(MAGIC);
    for dim in [VOCAB, D_MODEL, D_MLP, 0] {
        out.extend_from_slice(&(dim as u32).to_le_bytes());
    }
    for tensor in weights.tensors() {
        for v in tensor {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

pub fn decode(bytes: &[u8]) -> Result<Weights, String> {
    let floats: usize = TENSOR_SIZES.iter().sum();
    let expected_len = HEADER_LEN + floats * 4 + 8;
    if bytes.len() != expected_len {
        return Err(format!("{} bytes, expected {expected_len}", bytes.len()));
    }
    if &bytes[..8] != MAGIC {
        return Err("not a vsnap-ref-engine weights file (bad magic)".into());
    }
    let (body, sum) = bytes.split_at(expected_len - 8);
    let mut sum_bytes = [0u8; 8];
    sum_bytes.copy_from_slice(sum);
    if u64::from_le_bytes(sum_bytes) != fnv1a(body) {
        return Err("checksum mismatch".into());
    }
    let mut words = body[8..].chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
    let header: Vec<u32> = words.by_ref().take(4).map(u32::from_le_bytes).collect();
    let expected_header = [VOCAB as u32, D_MODEL as u32, D_MLP as u32, 0];
    if header != expected_header {
        return Err(format!(
            "shape {header:?} does not match this engine {expected_header:?}"
        ));
    }
    let mut floats = words.map(f32::from_le_bytes);
    let tensors = TENSOR_SIZES
        .iter()
        .map(|&n| floats.by_ref().take(n).collect())
        .collect();
    Weights::from_tensors(tensors).ok_or_else(|| "truncated tensors".into())
}

pub fn load(path: &Path) -> Result<Weights, String> {
    let bytes = fs::read(path).map_err(|e| format!("weights {}: {e}", path.display()))?;
    decode(&bytes).map_err(|e| format!("weights {}: {e}", path.display()))
}

pub fn save(path: &Path, weights: &Weights) -> Result<(), String> {
    fs::write(path, encode(weights)).map_err(|e| format!("weights {}: {e}", path.display()))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_round_trip_bit_exactly() {
        let weights = Weights::generate(3);
        assert_eq!(decode(&encode(&weights)).unwrap(), weights);
    }

    #[test]
    fn corrupt_files_are_refused() {
        let mut bytes = encode(&Weights::generate(3));
        bytes[100] ^= 1;
        assert_eq!(decode(&bytes).unwrap_err(), "checksum mismatch");
        assert!(decode(&bytes[..50]).is_err());
        assert!(decode(b"").is_err());
    }
}
