//! A small but real language model: character-level vocabulary, one transformer block
//! (single-head causal self-attention with a KV cache, then an MLP), greedy decoding.
//!
//! The weights are random, so the text is gibberish, but everything a serving stack checks
//! is genuine: token ids come from a vocabulary, logits come from a forward pass, and
//! logprobs are a proper log-softmax. The computation is single-threaded with a fixed
//! operation order, so the same weights give bit-identical answers in every run.

use crate::prng::SplitMix64;

/// Printable ASCII (' '..='~') plus newline.
pub const VOCAB: usize = 96;
pub const D_MODEL: usize = 48;
pub const D_MLP: usize = 128;
/// Longest prompt plus completion the model attends over.
pub const MAX_CONTEXT: usize = 8192;
/// Spreads the logits so that greedy picks are clear and logprobs are not all ~ -ln(96).
const LOGIT_SCALE: f32 = 4.0;
const NEWLINE: u32 = 95;
const UNKNOWN: u32 = b'?' as u32 - 32;

/// Characters to token ids. Characters outside the vocabulary become `?`.
pub fn encode(text: &str) -> Vec<u32> {
    text.chars()
        .map(|c| match c {
            ' '..='~' => c as u32 - 32,
            '\n' => NEWLINE,
            _ => UNKNOWN,
        })
        .collect()
}

/// The text of one token.
pub fn token_text(id: u32) -> String {
    match id {
        NEWLINE => "\n".into(),
        id if (id as usize) < VOCAB => char::from(b' ' + id as u8).into(),
        _ => String::new(),
    }
}

/// The parameters, each a row-major matrix `[rows x cols]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    pub tok_emb: Vec<f32>, // VOCAB x D_MODEL
    pub wq: Vec<f32>,      // D_MODEL x D_MODEL
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    pub wo: Vec<f32>,
    pub w1: Vec<f32>,    // D_MLP x D_MODEL
    pub b1: Vec<f32>,    // D_MLP
    pub w2: Vec<f32>,    // D_MODEL x D_MLP
    pub w_out: Vec<f32>, // VOCAB x D_MODEL
}

/// Tensor sizes in the order they are generated and stored.
pub const TENSOR_SIZES: [usize; 9] = [
    VOCAB * D_MODEL,
    D_MODEL * D_MODEL,
    D_MODEL * D_MODEL,
    D_MODEL * D_MODEL,
    D_MODEL * D_MODEL,
    D_MLP * D_MODEL,
    D_MLP,
    D_MODEL * D_MLP,
    VOCAB * D_MODEL,
];

impl Weights {
    /// Deterministic weights from a seed: uniform, scaled by 1/sqrt(fan-in).
    pub fn generate(seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut tensor = |len: usize, scale: f32| -> Vec<f32> {
            (0..len).map(|_| rng.next_f32(scale)).collect()
        };
        let attn = 1.0 / (D_MODEL as f32).sqrt();
        Weights {
            tok_emb: tensor(VOCAB * D_MODEL, 1.0),
            wq: tensor(D_MODEL * D_MODEL, attn),
            wk: tensor(D_MODEL * D_MODEL, attn),
            wv: tensor(D_MODEL * D_MODEL, attn),
            wo: tensor(D_MODEL * D_MODEL, attn),
            w1: tensor(D_MLP * D_MODEL, attn),
            b1: tensor(D_MLP, 0.1),
            w2: tensor(D_MODEL * D_MLP, 1.0 / (D_MLP as f32).sqrt()),
            w_out: tensor(VOCAB * D_MODEL, attn),
        }
    }

    pub fn tensors(&self) -> [&[f32]; 9] {
        [
            &self.tok_emb,
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.w1,
            &self.b1,
            &self.w2,
            &self.w_out,
        ]
    }

    /// Builds weights from tensors in [`TENSOR_SIZES`] order; `None` if a size is off.
    pub fn from_tensors(mut tensors: Vec<Vec<f32>>) -> Option<Self> {
        if tensors.len() != TENSOR_SIZES.len()
            || tensors.iter().zip(TENSOR_SIZES).any(|(t, n)| t.len() != n)
        {
            return None;
        }
        let mut next = || tensors.remove(0);
        Some(Weights {
            tok_emb: next(),
            wq: next(),
            wk: next(),
            wv: next(),
            wo: next(),
            w1: next(),
            b1: next(),
            w2: next(),
            w_out: next(),
        })
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub token: u32,
    pub logprob: f64,
    /// The most likely tokens with their logprobs, best first (as many as asked for).
    pub top: Vec<(u32, f64)>,
}

#[derive(Debug)]
pub struct Model {
    weights: Weights,
}

/// Keys and values of every position seen so far.
struct KvCache {
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl Model {
    pub fn new(weights: Weights) -> Self {
        Model { weights }
    }

    /// Greedy decoding: feeds `prompt`, then picks the most likely token `max_tokens`
    /// times. `prompt` must be non-empty and `prompt.len() + max_tokens <= MAX_CONTEXT`
    /// (the caller checks); otherwise fewer tokens come back.
    pub fn generate(&self, prompt: &[u32], max_tokens: usize, top_n: usize) -> Vec<Step> {
        let budget = MAX_CONTEXT.saturating_sub(prompt.len()).min(max_tokens);
        let mut cache = KvCache {
            keys: Vec::with_capacity((prompt.len() + budget) * D_MODEL),
            values: Vec::with_capacity((prompt.len() + budget) * D_MODEL),
        };
        let mut logits = Vec::new();
        for &token in prompt {
            logits = self.forward(&mut cache, token);
        }
        let mut steps = Vec::with_capacity(budget);
        if logits.is_empty() {
            return steps;
        }
        for i in 0..budget {
            let logprobs = log_softmax(&logits);
            let token = argmax(&logprobs);
            let mut ranked: Vec<u32> = (0..VOCAB as u32).collect();
            ranked.sort_by(|&a, &b| {
                logprobs[b as usize]
                    .total_cmp(&logprobs[a as usize])
                    .then(a.cmp(&b))
            });
            steps.push(Step {
                token,
                logprob: logprobs[token as usize],
                top: ranked
                    .into_iter()
                    .take(top_n)
                    .map(|t| (t, logprobs[t as usize]))
                    .collect(),
            });
            if i + 1 < budget {
                logits = self.forward(&mut cache, token);
            }
        }
        steps
    }

    /// One position through the block; returns the next-token logits.
    fn forward(&self, cache: &mut KvCache, token: u32) -> Vec<f32> {
        let w = &self.weights;
        let pos = cache.keys.len() / D_MODEL;
        let row = (token as usize).min(VOCAB - 1) * D_MODEL;
        let mut x: Vec<f32> = w.tok_emb[row..row + D_MODEL].to_vec();
        add_position(&mut x, pos);

        let normed = rms_norm(&x);
        let q = matvec(&w.wq, &normed, D_MODEL);
        cache.keys.extend(matvec(&w.wk, &normed, D_MODEL));
        cache.values.extend(matvec(&w.wv, &normed, D_MODEL));

        let scale = 1.0 / (D_MODEL as f32).sqrt();
        let mut scores: Vec<f32> = cache
            .keys
            .chunks_exact(D_MODEL)
            .map(|k| dot(&q, k) * scale)
            .collect();
        softmax_in_place(&mut scores);
        let mut attended = vec![0.0f32; D_MODEL];
        for (p, v) in scores.iter().zip(cache.values.chunks_exact(D_MODEL)) {
            for (a, vi) in attended.iter_mut().zip(v) {
                *a += p * vi;
            }
        }
        add_in_place(&mut x, &matvec(&w.wo, &attended, D_MODEL));

        let normed = rms_norm(&x);
        let mut hidden = matvec(&w.w1, &normed, D_MODEL);
        for (h, b) in hidden.iter_mut().zip(&w.b1) {
            *h = (*h + b).max(0.0);
        }
        add_in_place(&mut x, &matvec(&w.w2, &hidden, D_MLP));

        let mut logits = matvec(&w.w_out, &rms_norm(&x), D_MODEL);
        for l in &mut logits {
            *l *= LOGIT_SCALE;
        }
        logits
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |acc, (x, y)| acc + x * y)
}

fn matvec(matrix: &[f32], x: &[f32], cols: usize) -> Vec<f32> {
    matrix.chunks_exact(cols).map(|row| dot(row, x)).collect()
}

fn add_in_place(x: &mut [f32], delta: &[f32]) {
    for (a, d) in x.iter_mut().zip(delta) {
        *a += d;
    }
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    let mean_sq = dot(x, x) / x.len() as f32;
    let inv = 1.0 / (mean_sq + 1e-5).sqrt();
    x.iter().map(|v| v * inv).collect()
}

/// Sinusoidal position encoding, added in place.
fn add_position(x: &mut [f32], pos: usize) {
    for (i, v) in x.iter_mut().enumerate() {
        let pair = (i / 2) as f32;
        let angle = pos as f32 / 10_000f32.powf(2.0 * pair / D_MODEL as f32);
        *v += if i % 2 == 0 { angle.sin() } else { angle.cos() };
    }
}

fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s /= sum;
    }
}

/// Log-probabilities in f64, so reported logprobs carry no extra f32 rounding.
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let log_norm = max + sum.ln();
    logits.iter().map(|&l| l as f64 - log_norm).collect()
}

/// The most likely token; the lowest id wins a tie.
fn argmax(logprobs: &[f64]) -> u32 {
    let mut best = 0;
    for (i, &lp) in logprobs.iter().enumerate() {
        if lp > logprobs[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Model {
        Model::new(Weights::generate(7))
    }

    #[test]
    fn tokenizer_round_trips_printable_text() {
        let text = "The capital of France is\n~";
        let back: String = encode(text).into_iter().map(token_text).collect();
        assert_eq!(back, text);
        assert_eq!(encode("é"), encode("?"));
    }

    #[test]
    fn generation_is_bit_deterministic() {
        let prompt = encode("The capital of France is");
        let a = model().generate(&prompt, 12, 3);
        let b = Model::new(Weights::generate(7)).generate(&prompt, 12, 3);
        assert_eq!(a.len(), 12);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.token, y.token);
            assert_eq!(x.logprob.to_bits(), y.logprob.to_bits());
        }
    }

    #[test]
    fn logprobs_are_a_distribution() {
        let steps = model().generate(&encode("abc"), 1, VOCAB);
        let total: f64 = steps[0].top.iter().map(|(_, lp)| lp.exp()).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        assert_eq!(steps[0].top[0].0, steps[0].token);
        assert!(steps[0].logprob < 0.0 && steps[0].logprob.is_finite());
    }

    #[test]
    fn different_prompts_give_different_distributions() {
        let m = model();
        let a = m.generate(&encode("The capital of France is"), 1, 0);
        let b = m.generate(&encode("Hello"), 1, 0);
        assert_ne!(a[0].logprob.to_bits(), b[0].logprob.to_bits());
    }

    #[test]
    fn empty_prompt_generates_nothing() {
        assert!(model().generate(&[], 4, 0).is_empty());
    }
}
