//! The engine's command line as the engine reads it: Python's argparse
//! (`argparse.rs`), a vLLM command line (`vllm_command.rs`: serve's
//! arguments, the environment a capture needs, the API key, what vsnap
//! refuses), how the engine speaks with vsnap (`profile.rs`: the startup or
//! the barrier profile), and the command as the spec gives it, read so
//! (`command.rs`: [`EngineCommand`]). Knows nothing of plans: plan/ asks it.

mod argparse;
mod command;
mod profile;
mod vllm_command;

pub use command::EngineCommand;
pub use profile::{Profile, Protocol};
