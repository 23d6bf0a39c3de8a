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
//! Chosen by `vsnap.io/engine-protocol` (a [`Protocol`], read with the
//! other annotations in plan/annotations.rs), or detected from the argv: a
//! `vllm.snapshot.server` command line, or a `--ready-file` argument, means
//! barrier.
//!
//! The argv is read as the engine reads it. `python -m vllm.snapshot.server`
//! parses its own flags with argparse's `parse_known_args`, so a unique
//! prefix (`--ready`, `--release-f=R`) names a flag and an ambiguous one
//! (`--release`) is an error; only what comes before a `--` is its own, and
//! the rest (one leading `--` dropped) goes to vLLM's serve parser, which
//! also takes unique prefixes. Other engines (the reference engine) are read
//! by the exact flag names.

use std::path::{Path, PathBuf};

use super::argparse::{self, Arg};
use crate::error::{Error, Result};
use crate::snapshot::CONTROL_MOUNT;

/// The module of released vLLM's barrier server.
pub const SNAPSHOT_SERVER: &str = "vllm.snapshot.server";

/// The flags of `vllm.snapshot.server` (its parser has no others, not even
/// `--help`), which the reference engine takes too.
const BARRIER_FLAGS: [&str; 3] = ["--ready-file", "--release-file", "--release-timeout-s"];

/// The protocol a container's annotation asks for, before the argv is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Startup,
    Barrier,
}

impl Protocol {
    /// The protocol `name` names, as the annotation spells it.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "startup" => Some(Protocol::Startup),
            "barrier" => Some(Protocol::Barrier),
            _ => None,
        }
    }
}

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
    /// The profile `asked` for (the annotation's), else the one the argv
    /// shows; the barrier profile's files as the argv names them.
    pub fn detect(asked: Option<Protocol>, argv: &[String]) -> Result<Self> {
        let invalid = |m: String| Error::InvalidArgument(format!("create: {m}"));
        let flags = barrier_flags(argv).map_err(invalid)?;
        let barrier_args = flags.ready_file.is_some()
            || flags.release_file.is_some()
            || snapshot_server_args(argv).is_some();
        match asked {
            Some(Protocol::Startup) => Ok(Profile::Startup),
            None if !barrier_args => Ok(Profile::Startup),
            Some(Protocol::Barrier) | None => {
                let file = |flag: &str, value: &Option<String>| -> Result<String> {
                    let value = value.as_deref().ok_or_else(|| {
                        invalid(format!(
                            "the barrier profile needs {flag} in the command line"
                        ))
                    })?;
                    inside_control_dir(value).ok_or_else(|| {
                        invalid(format!(
                            "{flag} {value}: must be a file directly in {CONTROL_MOUNT}"
                        ))
                    })
                };
                if let Some(t) = &flags.release_timeout_s {
                    if !t.trim().parse::<f64>().is_ok_and(|s| s > 0.0) {
                        return Err(invalid(format!(
                            "--release-timeout-s {t}: must be a positive number of seconds"
                        )));
                    }
                }
                Ok(Profile::Barrier {
                    ready: file("--ready-file", &flags.ready_file)?,
                    release: file("--release-file", &flags.release_file)?,
                })
            }
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

/// The barrier flags of a command line, and what the engine passes on.
#[derive(Debug, Default, PartialEq, Eq)]
struct BarrierFlags {
    ready_file: Option<String>,
    release_file: Option<String>,
    release_timeout_s: Option<String>,
    /// For `vllm.snapshot.server`: the arguments that are not its own, in
    /// order (a `--` separator and all after it included), as
    /// `parse_known_args` returns them.
    rest: Vec<String>,
}

/// The arguments after `vllm.snapshot.server` in `python [opts] -m
/// vllm.snapshot.server ARGS` (or a path to its `server.py`).
pub(super) fn snapshot_server_args(argv: &[String]) -> Option<&[String]> {
    let at = argv.iter().position(|a| {
        a == SNAPSHOT_SERVER
            || a.strip_prefix("-m") == Some(SNAPSHOT_SERVER)
            || a.ends_with("vllm/snapshot/server.py")
    })?;
    Some(&argv[at + 1..])
}

/// The arguments of a `vllm.snapshot.server` command line that are not the
/// server's own (a `--` and all after it included), in order.
pub(super) fn barrier_rest(argv: &[String]) -> std::result::Result<Vec<String>, String> {
    barrier_flags(argv).map(|f| f.rest)
}

/// Reads the barrier flags: `vllm.snapshot.server`'s way (unique prefixes,
/// its own part ending at `--`), else by the exact names anywhere in argv.
/// An ambiguous prefix is an error, as it is to argparse.
fn barrier_flags(argv: &[String]) -> std::result::Result<BarrierFlags, String> {
    let (args, abbrev) = match snapshot_server_args(argv) {
        Some(args) => (args, true),
        None => (argv, false),
    };
    let mut flags = BarrierFlags::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" && abbrev {
            flags.rest.extend_from_slice(&args[i..]);
            break;
        }
        i += 1;
        let (name, inline) = match argparse::read(a, &BARRIER_FLAGS, abbrev) {
            Arg::Option { name, inline } => (name, inline),
            Arg::Ambiguous(names) => {
                return Err(format!(
                "{a}: {SNAPSHOT_SERVER} refuses an ambiguous flag (it could be {}); spell it out",
                names.join(" or ")
            ))
            }
            Arg::Positional | Arg::Unknown => {
                flags.rest.push(a.clone());
                continue;
            }
        };
        let value = match inline {
            Some(v) => Some(v.to_string()),
            None => {
                i += 1;
                args.get(i - 1).cloned()
            }
        };
        let slot = match name {
            "--ready-file" => &mut flags.ready_file,
            "--release-file" => &mut flags.release_file,
            _ => &mut flags.release_timeout_s,
        };
        // argparse keeps the last of a flag given twice.
        *slot = value;
    }
    Ok(flags)
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
            "/models/qwen",
        ]);
        assert_eq!(
            Profile::detect(None, &barrier).unwrap(),
            Profile::Barrier {
                ready: "ready.json".into(),
                release: "release.json".into()
            }
        );
    }

    /// `python -m vllm.snapshot.server` with these arguments.
    fn server(args: &[&str]) -> Vec<String> {
        let mut a = argv(&["python3", "-m", SNAPSHOT_SERVER]);
        a.extend(argv(args));
        a
    }

    fn barrier(ready: &str, release: &str) -> Profile {
        Profile::Barrier {
            ready: ready.into(),
            release: release.into(),
        }
    }

    #[test]
    fn the_barrier_servers_flags_may_be_abbreviated_as_argparse_allows() {
        let a = server(&[
            "--ready",
            "/run/vsnap/control/r.json",
            "--release-f=/run/vsnap/control/x.json",
            "--release-t",
            "60",
            "--",
            "/models/qwen",
        ]);
        assert_eq!(
            Profile::detect(None, &a).unwrap(),
            barrier("r.json", "x.json")
        );
        let a = server(&[
            "--ready=/run/vsnap/control/r.json",
            "--release-file",
            "/run/vsnap/control/x.json",
        ]);
        assert_eq!(
            Profile::detect(None, &a).unwrap(),
            barrier("r.json", "x.json")
        );
    }

    #[test]
    fn an_ambiguous_prefix_is_refused_as_argparse_refuses_it() {
        let a = server(&[
            "--ready-file",
            "/run/vsnap/control/r",
            "--release",
            "/run/vsnap/control/x",
        ]);
        let err = Profile::detect(None, &a).unwrap_err().to_string();
        assert!(
            err.contains("--release: ") && err.contains("--release-file or --release-timeout-s"),
            "{err}"
        );
    }

    #[test]
    fn only_what_comes_before_the_separator_is_the_barrier_servers() {
        // After `--` the flags are vLLM serve's (and unknown to it).
        let a = server(&[
            "--ready-file",
            "/run/vsnap/control/r",
            "--",
            "/models/qwen",
            "--release-file",
            "/run/vsnap/control/x",
        ]);
        let err = Profile::detect(None, &a).unwrap_err().to_string();
        assert!(err.contains("needs --release-file"), "{err}");
        // A barrier server without its flags is still the barrier profile.
        let err = Profile::detect(None, &server(&["--", "/models/qwen"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs --ready-file"), "{err}");
    }

    #[test]
    fn other_engines_are_read_by_the_exact_flag_names() {
        let a = argv(&[
            "/vsnap-ref-engine",
            "--ready",
            "/run/vsnap/control/r",
            "--release",
            "/run/vsnap/control/x",
        ]);
        assert_eq!(Profile::detect(None, &a).unwrap(), Profile::Startup);
        let a = argv(&[
            "tini",
            "--",
            "/vsnap-ref-engine",
            "--ready-file=/run/vsnap/control/r",
            "--release-file",
            "/run/vsnap/control/x",
        ]);
        assert_eq!(Profile::detect(None, &a).unwrap(), barrier("r", "x"));
    }

    #[test]
    fn the_release_timeout_must_be_a_positive_number() {
        for bad in ["0", "-5", "soon", "nan"] {
            let a = server(&[
                "--ready-file",
                "/run/vsnap/control/r",
                "--release-file",
                "/run/vsnap/control/x",
                &format!("--release-timeout-s={bad}"),
            ]);
            let err = Profile::detect(None, &a).unwrap_err().to_string();
            assert!(err.contains("--release-timeout-s"), "{err}");
        }
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
        let err = Profile::detect(Some(Protocol::Barrier), &argv(&["x"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--ready-file"), "{err}");
    }
}
