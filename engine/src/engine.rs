//! The engine's memory: model weights plus a configurable block of "state" standing in for
//! KV cache and compiled kernels. Like vLLM's sleep level 2, `release` drops both and
//! `load` rebuilds them exactly, which the canary then proves.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vsnap_protocol::Oracle;

use crate::failure::Failure;
use crate::model::{encode, token_text, Model, Weights};
use crate::prng::{mix, SplitMix64};
use crate::weights_file;

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
}

impl EngineConfig {
    pub fn from_env(weights_path: Option<PathBuf>) -> Result<Self, String> {
        Ok(EngineConfig {
            weights_path,
            init_ms: env_u64("VSNAP_ENGINE_INIT_MS")?,
            state_mb: env_u64("VSNAP_ENGINE_STATE_MB")?,
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
}

impl Engine {
    /// Burns the configured start-up time, then loads weights and state.
    pub fn initialize(config: EngineConfig) -> Result<Self, Failure> {
        burn_cpu(Duration::from_millis(config.init_ms));
        let mut engine = Engine {
            config,
            model: None,
            state: Vec::new(),
            state_checksum: None,
        };
        engine.load()?;
        Ok(engine)
    }

    pub fn load(&mut self) -> Result<(), Failure> {
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
}
