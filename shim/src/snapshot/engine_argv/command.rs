//! The engine's command as the spec gives it (`process.args`,
//! `process.env`), read as the engine reads it: how it speaks with vsnap
//! (profile.rs), the API key its server requires, whether it is `vllm
//! serve`, and what vsnap refuses of a vLLM command line (vllm_command.rs).

use super::profile::{Profile, Protocol};
use super::vllm_command;
use crate::bundle_spec::BundleSpec;
use crate::error::Result;

/// The engine's command line and environment, and its profile.
#[derive(Clone, Debug)]
pub struct EngineCommand {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub profile: Profile,
}

impl EngineCommand {
    /// The command of `spec`'s process, its profile the one `asked` (the
    /// annotation's) or the one its argv shows. A vLLM command line or
    /// environment vsnap refuses is an error; also returned: the variables
    /// a capture of vLLM wants that the environment lacks, for the caller
    /// to warn of.
    pub fn of(spec: &BundleSpec, asked: Option<Protocol>) -> Result<(Self, Vec<String>)> {
        let (argv, env) = (spec.args(), spec.env());
        let profile = Profile::detect(asked, &argv)?;
        vllm_command::check_vllm_command(&argv)?;
        let missing = vllm_command::check_vllm_env(&argv, &env)?;
        Ok((Self { argv, env, profile }, missing))
    }

    /// The key the engine's API requires (`--api-key`, `VLLM_API_KEY`).
    pub fn api_key(&self) -> Option<String> {
        vllm_command::api_key(&self.argv, &self.env)
    }

    /// A `vllm serve` command line, which reads the snapshot config from
    /// its arguments.
    pub fn is_vllm_serve(&self) -> bool {
        vllm_command::is_vllm_serve(&self.argv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(args: &[&str], env: &[&str]) -> BundleSpec {
        json!({"process": {"args": args, "env": env}}).into()
    }

    #[test]
    fn a_vllm_serve_command_is_read_with_its_key_and_what_it_lacks() {
        let s = spec(
            &["vllm", "serve", "/models/q", "--api-key", "k1"],
            &["VLLM_WORKER_MULTIPROC_METHOD=spawn"],
        );
        let (c, missing) = EngineCommand::of(&s, None).unwrap();
        assert_eq!(c.profile, Profile::Startup);
        assert!(c.is_vllm_serve());
        assert_eq!(c.api_key().as_deref(), Some("k1"));
        assert_eq!(c.env, ["VLLM_WORKER_MULTIPROC_METHOD=spawn"]);
        assert_eq!(missing, ["NCCL_IB_DISABLE=1", "HF_HUB_OFFLINE=1"]);
    }

    #[test]
    fn another_engine_is_neither_checked_nor_vllm() {
        let s = spec(&["/vsnap-ref-engine"], &["VLLM_API_KEY=k2"]);
        let (c, missing) = EngineCommand::of(&s, Some(Protocol::Startup)).unwrap();
        assert!(!c.is_vllm_serve());
        assert!(missing.is_empty());
        assert_eq!(c.api_key().as_deref(), Some("k2"));
    }

    #[test]
    fn what_vsnap_refuses_fails_the_reading() {
        let s = spec(&["vllm", "serve", "m"], &["NCCL_IB_DISABLE=0"]);
        let e = EngineCommand::of(&s, None).unwrap_err().to_string();
        assert!(e.contains("NCCL_IB_DISABLE=0"), "{e}");
        let s = spec(&["x"], &[]);
        let e = EngineCommand::of(&s, Some(Protocol::Barrier))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--ready-file"), "{e}");
    }
}
