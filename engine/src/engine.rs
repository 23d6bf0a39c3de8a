//! The engine's memory: model weights plus a configurable block of "state" standing in for
//! KV cache and compiled kernels. Like vLLM's sleep level 2, `release` drops both and
//! `load` rebuilds them exactly, which the canary then proves.
//!
//! Optionally also a block of "resident" memory (VSNAP_ENGINE_RESIDENT_MB) that is never
//! released: what a real engine cannot give back before a checkpoint (CUDA context host
//! mirrors, pinned buffers, the Python heap), so it lands in the checkpoint image. Every
//! `load` after the first recomputes its checksum, so a restore that lost or damaged it
//! fails in `recovery: restore memory`.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vsnap_protocol::Oracle;

use crate::failure::Failure;
use crate::identity::Userspace;
use crate::log;
use crate::model::{encode, token_text, Model, Weights};
use crate::prng::{mix, SplitMix64};
use crate::shm::UnlinkedShm;
use crate::weights_file;
use crate::words::Words;
use crate::zero_block::ZeroBlock;

/// The canary prompt of the protocol.
pub const CANARY_PROMPT: &str = "The capital of France is";
/// Seed of the built-in weights.
pub const DEFAULT_SEED: u64 = 0x7673_6e61_7000_0001;

#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Load weights from this file instead of generating them from the seed.
    pub weights_path: Option<PathBuf>,
    /// CPU time spent at start-up, standing in for compilation (VSNAP_ENGINE_INIT_MS).
    pub init_ms: u64,
    /// MiB of state allocated and touched on every load (VSNAP_ENGINE_STATE_MB).
    pub state_mb: u64,
    /// MiB of resident data allocated and touched once at start-up and kept for the
    /// process lifetime, never released (VSNAP_ENGINE_RESIDENT_MB).
    pub resident_mb: u64,
    /// MiB of pages present and all zero, kept for life (VSNAP_ENGINE_ZERO_MB).
    pub zero_mb: u64,
    /// Keep the resident data in its own 2 MiB aligned mapping advised
    /// `MADV_HUGEPAGE` (VSNAP_ENGINE_RESIDENT_HUGE=1): eligible for huge pages.
    pub resident_huge: bool,
    /// KiB of an unlinked /dev/shm file held open (VSNAP_ENGINE_SHM_KB).
    pub shm_kb: u64,
    /// Keep that file's name (VSNAP_ENGINE_SHM_NAMED=1).
    pub shm_named: bool,
}

impl EngineConfig {
    pub fn from_env(weights_path: Option<PathBuf>) -> Result<Self, String> {
        Ok(EngineConfig {
            weights_path,
            init_ms: env_u64("VSNAP_ENGINE_INIT_MS")?,
            state_mb: env_u64("VSNAP_ENGINE_STATE_MB")?,
            resident_mb: env_u64("VSNAP_ENGINE_RESIDENT_MB")?,
            zero_mb: env_u64("VSNAP_ENGINE_ZERO_MB")?,
            resident_huge: env_u64("VSNAP_ENGINE_RESIDENT_HUGE")? != 0,
            shm_kb: env_u64("VSNAP_ENGINE_SHM_KB")?,
            shm_named: env_u64("VSNAP_ENGINE_SHM_NAMED")? != 0,
        })
    }
}

fn env_u64(name: &str) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(0),
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(0),
    }
}

pub struct Engine {
    config: EngineConfig,
    model: Option<Arc<Model>>,
    state: Vec<u64>,
    /// Checksum of the state at first load; every reload must reproduce it.
    state_checksum: Option<u64>,
    /// Never released; verified against its checksum on every reload.
    resident: Resident,
    /// Present, all zero; verified on every reload.
    zero: ZeroBlock,
    /// An unlinked /dev/shm file held open; verified on every reload.
    shm: Option<UnlinkedShm>,
    /// The userspace random state, seeded at start, reseeded by an identity.
    userspace: Arc<Userspace>,
}

impl Engine {
    /// Burns the configured start-up time, then loads weights and state.
    pub fn initialize(config: EngineConfig) -> Result<Self, Failure> {
        burn_cpu(Duration::from_millis(config.init_ms));
        let resident = Resident::generate(config.resident_mb, config.resident_huge)?;
        let zero = ZeroBlock::allocate(config.zero_mb)?;
        let shm = UnlinkedShm::create(config.shm_kb, config.shm_named)?;
        let mut engine = Engine {
            config,
            model: None,
            state: Vec::new(),
            state_checksum: None,
            resident,
            zero,
            shm,
            userspace: Arc::new(Userspace::at_start()),
        };
        engine.load()?;
        Ok(engine)
    }

    pub fn load(&mut self) -> Result<(), Failure> {
        // The first load (at initialize) follows the generation directly; every later one
        // (rehearsal, recovery after a restore) proves the resident data survived.
        if self.state_checksum.is_some() {
            self.resident.verify()?;
            self.zero.verify()?;
            if let Some(shm) = &self.shm {
                shm.verify()?;
            }
        }
        let weights = match &self.config.weights_path {
            Some(path) => weights_file::load(path).map_err(Failure::engine)?,
            None => Weights::generate(DEFAULT_SEED),
        };
        self.model = Some(Arc::new(Model::new(weights)));
        let words = usize::try_from(self.config.state_mb)
            .ok()
            .and_then(|mb| mb.checked_mul(1 << 17))
            .ok_or_else(|| Failure::engine("VSNAP_ENGINE_STATE_MB is too large"))?;
        let mut state = Vec::new();
        state
            .try_reserve_exact(words)
            .map_err(|e| Failure::engine(format!("cannot allocate state: {e}")))?;
        let mut checksum = 0u64;
        for i in 0..words as u64 {
            let word = mix(DEFAULT_SEED ^ i);
            checksum = checksum.rotate_left(1) ^ word;
            state.push(word);
        }
        match self.state_checksum {
            Some(expected) if expected != checksum => {
                return Err(Failure::engine(format!(
                    "state checksum {checksum:016x} after reload, expected {expected:016x}"
                )))
            }
            _ => self.state_checksum = Some(checksum),
        }
        self.state = state;
        Ok(())
    }

    /// Drops weights and state; the memory goes back to the system.
    pub fn release(&mut self) {
        self.model = None;
        self.state = Vec::new();
    }

    pub fn model(&self) -> Result<Arc<Model>, Failure> {
        self.model
            .clone()
            .ok_or_else(|| Failure::engine("model is released"))
    }

    pub fn userspace(&self) -> Arc<Userspace> {
        Arc::clone(&self.userspace)
    }

    /// The protocol's canary: one greedy token for [`CANARY_PROMPT`].
    pub fn canary(&self) -> Result<Oracle, Failure> {
        let steps = self.model()?.generate(&encode(CANARY_PROMPT), 1, 0);
        let step = steps
            .first()
            .ok_or_else(|| Failure::engine("canary produced no token"))?;
        Ok(Oracle {
            sampled_token_logprob: step.logprob,
            text: token_text(step.token),
            token_ids: vec![step.token],
        })
    }
}

/// Resident data: a splitmix64 stream (non-zero, incompressible, so a checkpoint must carry
/// every page of it) and the checksum it had when generated.
struct Resident {
    words: Words,
    checksum: u64,
}

/// Seed of the resident data stream.
const RESIDENT_SEED: u64 = 0x7673_6e61_7000_00a5;

impl Resident {
    fn generate(mb: u64, huge: bool) -> Result<Self, Failure> {
        let words = usize::try_from(mb)
            .ok()
            .and_then(|mb| mb.checked_mul(1 << 17))
            .ok_or_else(|| Failure::engine("VSNAP_ENGINE_RESIDENT_MB is too large"))?;
        let mut rng = SplitMix64::new(RESIDENT_SEED);
        // splitmix64 outputs zero for one input in 2^64; keep every word non-zero anyway.
        let data = Words::generate(words, huge && words > 0, || rng.next_u64() | 1)
            .map_err(|e| Failure::engine(format!("cannot allocate resident data: {e}")))?;
        let checksum = checksum(&data);
        if mb > 0 {
            // The bounds of a huge-page eligible block, for a test to find it
            // in /proc/<pid>/smaps.
            let at = data.range().map_or(String::new(), |(s, e)| {
                format!(", huge pages advised at {s:#x}-{e:#x}")
            });
            log(&format!(
                "resident data: {mb} MiB, checksum {checksum:016x} (kept, never released){at}"
            ));
        }
        Ok(Resident {
            words: data,
            checksum,
        })
    }

    /// Recomputes the checksum over the data as it is in memory now.
    fn verify(&self) -> Result<(), Failure> {
        if self.words.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let now = checksum(&self.words);
        if now != self.checksum {
            return Err(Failure::engine(format!(
                "resident data checksum {now:016x}, expected {:016x} ({} MiB): \
                 the resident memory did not survive",
                self.checksum,
                self.words.len() >> 17
            )));
        }
        log(&format!(
            "resident data verified ({} MiB) in {} ms",
            self.words.len() >> 17,
            started.elapsed().as_millis()
        ));
        Ok(())
    }
}

/// An order-sensitive checksum, four independent lanes so it runs at memory speed.
fn checksum(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    for chunk in &mut chunks {
        for (lane, &w) in lanes.iter_mut().zip(chunk) {
            *lane = lane.rotate_left(1) ^ w;
        }
    }
    for (lane, &w) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane = lane.rotate_left(1) ^ w;
    }
    lanes
        .iter()
        .fold(words.len() as u64, |acc, &lane| mix(acc ^ lane))
}

fn burn_cpu(duration: Duration) {
    let end = Instant::now() + duration;
    let mut rng = SplitMix64::new(1);
    while Instant::now() < end {
        for _ in 0..10_000 {
            black_box(rng.next_u64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canary_survives_release_and_reload() {
        let mut engine = Engine::initialize(EngineConfig {
            state_mb: 1,
            ..Default::default()
        })
        .unwrap();
        let before = engine.canary().unwrap();
        engine.release();
        assert!(engine.canary().is_err());
        engine.load().unwrap();
        let after = engine.canary().unwrap();
        assert_eq!(before, after);
        assert_eq!(
            before.sampled_token_logprob.to_bits(),
            after.sampled_token_logprob.to_bits()
        );
    }

    #[test]
    fn resident_data_is_deterministic_and_verified() {
        let a = Resident::generate(2, false).unwrap();
        let b = Resident::generate(2, false).unwrap();
        assert_eq!(a.words.len(), 2 << 17);
        assert_eq!(a.checksum, b.checksum);
        assert_eq!(a.words, b.words);
        // Pinned: a change of the stream or the checksum shows up here.
        assert_eq!(a.checksum, 0xdeab_3984_51bc_0a56);
        assert_eq!(
            Resident::generate(1, false).unwrap().checksum,
            Resident::generate(1, false).unwrap().checksum
        );
        assert_ne!(a.checksum, Resident::generate(1, false).unwrap().checksum);
        assert!(a.words.iter().all(|&w| w != 0));
        // In a huge-page eligible mapping: the same words.
        let h = Resident::generate(2, true).unwrap();
        assert_eq!((h.checksum, &h.words[..]), (a.checksum, &a.words[..]));
        assert!(h.words.range().is_some() && a.words.range().is_none());
        a.verify().unwrap();
        assert_eq!(Resident::generate(0, false).unwrap().words.len(), 0);
        Resident::generate(0, false).unwrap().verify().unwrap();
    }

    #[test]
    fn lost_resident_data_fails_the_reload() {
        let mut engine = Engine::initialize(EngineConfig {
            state_mb: 1,
            resident_mb: 1,
            ..Default::default()
        })
        .unwrap();
        engine.release();
        engine.load().unwrap();
        engine.release();
        // A restore that brought back zero pages instead of the data.
        engine.resident.words[12345] = 0;
        let err = engine.load().unwrap_err();
        assert!(err.message.contains("resident data checksum"), "{err}");
        assert!(engine.model().is_err());
        // Swapped words are caught too (the checksum is order-sensitive).
        let mut r = Resident::generate(1, false).unwrap();
        r.words.swap(0, 1);
        assert!(r.verify().is_err());
    }
}
