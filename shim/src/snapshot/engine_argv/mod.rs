//! The engine's command line as the engine reads it: Python's argparse
//! (`argparse.rs`), a vLLM command line (`vllm_command.rs`: serve's
//! arguments, the environment a capture needs, the API key, what vsnap
//! refuses), how the engine speaks with vsnap (`profile.rs`: the startup or
//! the barrier profile). Knows nothing of plans: plan/ asks it.

pub(crate) mod argparse;
pub(crate) mod profile;
pub(crate) mod vllm_command;

pub use profile::{Profile, Protocol};
