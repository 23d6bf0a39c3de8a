//! A block of memory every page of which is present and all zero
//! (VSNAP_ENGINE_ZERO_MB): what an engine holds in buffers it allocated and
//! touched but never filled (a KV cache's free blocks, padding). A zero
//! byte is written to each page, which makes the page present: a real page
//! holding zeros, which CRIU dumps (it skips only pages that map the
//! kernel's shared zero page). Kept for the process's life; every `load`
//! after the first checks it is still all zero.

use std::time::Instant;

use crate::failure::Failure;
use crate::log;

const PAGE: usize = 4096;

pub struct ZeroBlock {
    bytes: Vec<u8>,
}

impl ZeroBlock {
    pub fn allocate(mb: u64) -> Result<Self, Failure> {
        let len = usize::try_from(mb)
            .ok()
            .and_then(|mb| mb.checked_mul(1 << 20))
            .ok_or_else(|| Failure::engine("VSNAP_ENGINE_ZERO_MB is too large"))?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|e| Failure::engine(format!("cannot allocate the zero block: {e}")))?;
        bytes.resize(len, 0);
        for i in (0..len).step_by(PAGE) {
            // SAFETY: in bounds; a volatile write so the store (of the
            // value the page already reads as) is not optimized away.
            unsafe { std::ptr::write_volatile(bytes.as_mut_ptr().add(i), 0) };
        }
        if mb > 0 {
            log(&format!(
                "zero block: {mb} MiB, every page present and all zero (kept, never released)"
            ));
        }
        Ok(ZeroBlock { bytes })
    }

    /// Checks every byte is still zero.
    pub fn verify(&self) -> Result<(), Failure> {
        if self.bytes.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let bytes = std::hint::black_box(&self.bytes[..]);
        if let Some(at) = bytes
            .chunks(PAGE)
            .position(|p| p.iter().fold(0u8, |a, &b| a | b) != 0)
        {
            return Err(Failure::engine(format!(
                "zero block: page {at} of {} is not all zero: the memory did not survive",
                bytes.len() / PAGE
            )));
        }
        log(&format!(
            "zero block verified ({} MiB) in {} ms",
            bytes.len() >> 20,
            started.elapsed().as_millis()
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_is_zero_and_a_written_byte_fails_the_check() {
        let mut z = ZeroBlock::allocate(1).unwrap();
        assert_eq!(z.bytes.len(), 1 << 20);
        z.verify().unwrap();
        z.bytes[5 * PAGE + 7] = 1;
        let e = z.verify().unwrap_err();
        assert!(e.message.contains("page 5 of 256"), "{e}");
        ZeroBlock::allocate(0).unwrap().verify().unwrap();
    }
}
