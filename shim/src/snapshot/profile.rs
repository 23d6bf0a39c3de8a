//! Engine profiles: how the engine in the container speaks with vsnap.
//!
//! - `startup`: vLLM's external startup capture through the control dir
//!   (capture-ready / activation / challenge / release / status). The engine
//!   learns the control dir from `VSNAP_SNAPSHOT_CONFIG`, and a `vllm serve`
//!   command line also gets `--snapshot-config <json>` appended, as stock vLLM
//!   reads it from its arguments.
//! - `barrier`: the ready/release barrier of released vLLM
//!   (`--ready-file F --release-file R`, both inside the control dir). There is
//!   no challenge and no status, so vsnap checks the canary itself over HTTP
//!   after the release.
//!
//! Chosen by `vsnap.io/engine-protocol`, or detected from the argv: a
//! `--ready-file` argument means barrier.

use std::path::{Path, PathBuf};

use super::plan::ENGINE_PROTOCOL;
use super::CONTROL_MOUNT;
use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Profile {
    Startup,
    /// File names inside the control dir.
    Barrier {
        ready: String,
        release: String,
    },
}

impl Profile {
    pub fn detect(annotation: Option<&str>, argv: &[String]) -> Result<Self> {
        let invalid = |m: String| Error::InvalidArgument(format!("create: {m}"));
        let barrier_args = arg_value(argv, "--ready-file").is_some();
        match annotation {
            Some("startup") => Ok(Profile::Startup),
            None if !barrier_args => Ok(Profile::Startup),
            Some("barrier") | None => {
                let file = |flag: &str| -> Result<String> {
                    let value = arg_value(argv, flag).ok_or_else(|| {
                        invalid(format!(
                            "the barrier profile needs {flag} in the command line"
                        ))
                    })?;
                    inside_control_dir(&value).ok_or_else(|| {
                        invalid(format!(
                            "{flag} {value}: must be a file directly in {CONTROL_MOUNT}"
                        ))
                    })
                };
                Ok(Profile::Barrier {
                    ready: file("--ready-file")?,
                    release: file("--release-file")?,
                })
            }
            Some(other) => Err(invalid(format!(
                "annotation {ENGINE_PROTOCOL}: {other:?} is not one of startup, barrier"
            ))),
        }
    }

    pub fn ready_path(&self, control_dir: &Path) -> Option<PathBuf> {
        match self {
            Profile::Barrier { ready, .. } => Some(control_dir.join(ready)),
            Profile::Startup => None,
        }
    }

    pub fn release_path(&self, control_dir: &Path) -> Option<PathBuf> {
        match self {
            Profile::Barrier { release, .. } => Some(control_dir.join(release)),
            Profile::Startup => None,
        }
    }
}

/// `--flag VALUE` or `--flag=VALUE`.
fn arg_value(argv: &[String], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix(&prefix).map(str::to_string)
        }
    })
}

/// The file name of `path` when it lies directly in the control mount.
fn inside_control_dir(path: &str) -> Option<String> {
    let name = path.strip_prefix(CONTROL_MOUNT)?.strip_prefix('/')?;
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    ok.then(|| name.to_string())
}

/// A `vllm serve` command line (the CLI or the OpenAI server module), which
/// reads the snapshot config from its arguments rather than the environment.
pub fn is_vllm_serve(argv: &[String]) -> bool {
    let mentions_vllm = argv.iter().any(|a| {
        Path::new(a).file_name().is_some_and(|n| n == "vllm") || a.starts_with("vllm.entrypoints")
    });
    mentions_vllm
        && (argv.iter().any(|a| a == "serve")
            || argv.iter().any(|a| a.contains("openai.api_server")))
}

/// What a capturable vLLM needs in its environment: worker processes
/// spawned (not forked from a CUDA-initialized parent), no InfiniBand
/// (CRIU cannot dump its queue pairs), and no hub access (a restored copy
/// must not fetch anything).
pub const VLLM_CAPTURE_ENV: [(&str, &str); 3] = [
    ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
    ("NCCL_IB_DISABLE", "1"),
    ("HF_HUB_OFFLINE", "1"),
];

/// For a vLLM command line: a value that contradicts [`VLLM_CAPTURE_ENV`] is
/// an error naming the variable; a missing one is returned to be logged.
pub fn check_vllm_env(argv: &[String], env: &[String]) -> Result<Vec<String>> {
    let is_vllm = is_vllm_serve(argv) || argv.iter().any(|a| a == "vllm.snapshot.server");
    if !is_vllm {
        return Ok(Vec::new());
    }
    let mut missing = Vec::new();
    for (name, want) in VLLM_CAPTURE_ENV {
        let value = env
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix(name).and_then(|r| r.strip_prefix('=')));
        match value {
            Some(v) if v == want => {}
            Some(v) => {
                return Err(Error::InvalidArgument(format!(
                    "create: {name}={v} prevents a capture of vLLM; set {name}={want} (or leave it unset)"
                )))
            }
            None => missing.push(format!("{name}={want}")),
        }
    }
    Ok(missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_profile_is_detected_from_argv() {
        assert_eq!(
            Profile::detect(None, &argv(&["vllm", "serve", "m"])).unwrap(),
            Profile::Startup
        );
        let barrier = argv(&[
            "python",
            "-m",
            "vllm.snapshot.server",
            "--ready-file",
            "/run/vsnap/control/ready.json",
            "--release-file=/run/vsnap/control/release.json",
            "--",
            "serve",
        ]);
        assert_eq!(
            Profile::detect(None, &barrier).unwrap(),
            Profile::Barrier {
                ready: "ready.json".into(),
                release: "release.json".into()
            }
        );
    }

    #[test]
    fn barrier_files_outside_the_control_dir_are_refused() {
        let a = argv(&[
            "x",
            "--ready-file",
            "/tmp/ready.json",
            "--release-file",
            "/run/vsnap/control/r",
        ]);
        let err = Profile::detect(None, &a).unwrap_err().to_string();
        assert!(err.contains("--ready-file /tmp/ready.json"), "{err}");
        let a = argv(&[
            "x",
            "--ready-file",
            "/run/vsnap/control/../x",
            "--release-file",
            "/run/vsnap/control/r",
        ]);
        assert!(Profile::detect(None, &a).is_err());
        let err = Profile::detect(Some("barrier"), &argv(&["x"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--ready-file"), "{err}");
        let err = Profile::detect(Some("carrier"), &argv(&["x"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(ENGINE_PROTOCOL), "{err}");
    }

    #[test]
    fn vllm_env_defaults_are_checked() {
        let vllm = argv(&["vllm", "serve", "m"]);
        let env = argv(&["NCCL_IB_DISABLE=1"]);
        let missing = check_vllm_env(&vllm, &env).unwrap();
        assert_eq!(
            missing,
            ["VLLM_WORKER_MULTIPROC_METHOD=spawn", "HF_HUB_OFFLINE=1"]
        );
        let err = check_vllm_env(&vllm, &argv(&["VLLM_WORKER_MULTIPROC_METHOD=fork"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("VLLM_WORKER_MULTIPROC_METHOD=fork"), "{err}");
        assert!(check_vllm_env(&argv(&["/vsnap-ref-engine"]), &[])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn vllm_serve_is_recognized() {
        assert!(is_vllm_serve(&argv(&["vllm", "serve", "/models/q"])));
        assert!(is_vllm_serve(&argv(&["/usr/local/bin/vllm", "serve", "q"])));
        assert!(is_vllm_serve(&argv(&[
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server"
        ])));
        assert!(!is_vllm_serve(&argv(&["/vsnap-ref-engine"])));
    }
}
