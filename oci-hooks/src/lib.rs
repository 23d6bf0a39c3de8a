//! `vsnap-hook`: OCI runtime hooks (`createRuntime`) that stop a container
//! before its workload becomes visible when the host or the snapshot
//! artifact is not fit to run it. Every check is a subcommand that can run on
//! its own: exit 0 passes; any other exit fails, with one line on stderr that
//! names the check and the object (`vsnap-hook ownership: /var/lib/vsnap/x is
//! group/world-writable (mode 0770)`).
//!
//! - `io-uring`: `kernel.io_uring_disabled` is strict enough for the
//!   container's user, and (optionally) no process of the container holds an
//!   io_uring instance.
//! - `ownership`: the artifact and control-dir paths are root-owned (the
//!   control dir itself may be the engine's user's), free of symlinks and not
//!   group/world-writable; the artifact's own layout.
//! - `fingerprint`: the manifest's MAC verifies with this host's key, this
//!   host is compatible with the one it was captured on, its clocks do not
//!   leave the restored engine's timers waiting (no time namespaces, clocks
//!   behind the capture's), and the workload it was made for is this
//!   container.
//!
//! The container state (OCI runtime spec, "State") arrives on stdin; it is
//! read only by the checks that need it (the bundle's `config.json`, the
//! container's pid).

pub mod fingerprint;
pub mod io_uring;
pub mod ownership;
pub mod state;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

pub use state::{State, StateSource};

/// The binary's name, first in every message.
pub const NAME: &str = "vsnap-hook";
/// Where vsnap mounts the control dir inside the container (not identity).
pub use vsnap_protocol::CONTROL_MOUNT;

/// The check ran and found the host or artifact unfit.
pub const EXIT_FAILED: i32 = 1;
/// Bad command line.
pub const EXIT_USAGE: i32 = 2;
/// The check could not run: the state, the bundle's spec or a sysctl could
/// not be read.
pub const EXIT_INPUT: i32 = 3;

pub const USAGE: &str = "\
usage: vsnap-hook CHECK [OPTIONS]   (the OCI container state on stdin)

checks:
  io-uring     [--root-user | --uid N] [--pids-of-state] [--sysctl PATH]
               [--group-sysctl PATH] [--bundle DIR] [--state FILE]
  ownership    [--artifact-root R [--artifact NAME | --artifact-from-state]]
               [--control-dir D [--control-owner UID]] [--state FILE]
  fingerprint  --artifact-root R (--artifact NAME | --artifact-from-state)
               [--runc P] [--criu P] [--nvidia-smi P]
               [--cuda-plugin P] [--shim-version V] [--strip-snapshot-config-arg]
               [--fingerprint-key P] [--tenant T [--owner O]]
               [--root-folder DIR] [--bundle DIR] [--state FILE]

exit: 0 pass, 1 check failed, 2 usage, 3 input unreadable (all non-zero stop
the container); one line on stderr names the check and the object.";

/// Why a check did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The host or artifact is not fit (exit 1).
    Check(String),
    /// Bad arguments (exit 2).
    Usage(String),
    /// What the check needs could not be read (exit 3).
    Input(String),
}

impl Failure {
    pub fn code(&self) -> i32 {
        match self {
            Failure::Check(_) => EXIT_FAILED,
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Input(_) => EXIT_INPUT,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Failure::Check(m) | Failure::Usage(m) | Failure::Input(m) => m,
        }
    }
}

/// The outcome of one invocation: the exit code and the line for stderr
/// (none on success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub code: i32,
    pub line: Option<String>,
}

/// Runs `vsnap-hook ARGS...` (without argv[0]) with `stdin` as the state.
pub fn run(args: &[String], stdin: &mut dyn Read) -> Outcome {
    let Some(check) = args.first() else {
        return fail(None, Failure::Usage(format!("no check given\n{USAGE}")));
    };
    if matches!(check.as_str(), "-h" | "--help" | "help") {
        println!("{USAGE}");
        return Outcome {
            code: 0,
            line: None,
        };
    }
    let result = match check.as_str() {
        "io-uring" => Flags::parse(
            check,
            &args[1..],
            io_uring::VALUE_FLAGS,
            io_uring::BOOL_FLAGS,
        )
        .and_then(|f| io_uring::run(&f, &mut StateSource::new(f.path("--state"), stdin))),
        "ownership" => Flags::parse(
            check,
            &args[1..],
            ownership::VALUE_FLAGS,
            ownership::BOOL_FLAGS,
        )
        .and_then(|f| ownership::run(&f, &mut StateSource::new(f.path("--state"), stdin))),
        "fingerprint" => Flags::parse(
            check,
            &args[1..],
            fingerprint::VALUE_FLAGS,
            fingerprint::BOOL_FLAGS,
        )
        .and_then(|f| fingerprint::run(&f, &mut StateSource::new(f.path("--state"), stdin))),
        other => {
            return fail(
                None,
                Failure::Usage(format!(
                    "unknown check {other:?} (io-uring, ownership, fingerprint)"
                )),
            )
        }
    };
    match result {
        Ok(()) => Outcome {
            code: 0,
            line: None,
        },
        Err(f) => fail(Some(check), f),
    }
}

fn fail(check: Option<&str>, f: Failure) -> Outcome {
    let prefix = match check {
        Some(c) => format!("{NAME} {c}"),
        None => NAME.to_string(),
    };
    let message = match &f {
        // Usage may carry the usage text: keep only its first line.
        Failure::Usage(m) => m.lines().next().unwrap_or_default().to_string(),
        other => one_line(other.message()),
    };
    Outcome {
        code: f.code(),
        line: Some(format!("{prefix}: {message}")),
    }
}

/// Newlines and other control characters become spaces: one line per failure.
pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A check's options: `--name value`, `--name=value` or a boolean `--name`.
#[derive(Debug, Default)]
pub struct Flags {
    values: BTreeMap<String, String>,
    bools: Vec<String>,
}

impl Flags {
    pub fn parse(
        check: &str,
        args: &[String],
        value_flags: &[&str],
        bool_flags: &[&str],
    ) -> Result<Self, Failure> {
        let usage = |m: String| Failure::Usage(format!("{m}\n{USAGE}"));
        let mut flags = Flags::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            if value_flags.contains(&name) {
                let value = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| usage(format!("{name} needs a value")))?,
                };
                if flags.values.insert(name.to_string(), value).is_some() {
                    return Err(usage(format!("{name} is given twice")));
                }
            } else if bool_flags.contains(&name) && inline.is_none() {
                flags.bools.push(name.to_string());
            } else {
                return Err(usage(format!("unknown option {arg:?} for {check}")));
            }
        }
        Ok(flags)
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.value(name).map(PathBuf::from)
    }

    pub fn has(&self, name: &str) -> bool {
        self.bools.iter().any(|b| b == name)
    }

    /// An absolute path without `..`: the safety checks walk it component by
    /// component from `/`.
    pub fn abs_path(&self, name: &str) -> Result<Option<PathBuf>, Failure> {
        let Some(p) = self.path(name) else {
            return Ok(None);
        };
        if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
            return Err(Failure::Usage(format!(
                "{name} {}: must be an absolute path without '..'",
                p.display()
            )));
        }
        Ok(Some(p))
    }
}

/// An artifact is a plain name under the artifact root (the rule of
/// [`vsnap_artifact::ArtifactName`], as the `vsnap.io/artifact` annotation).
pub fn check_artifact_name(name: &str) -> Result<(), Failure> {
    vsnap_artifact::ArtifactName::new(name)
        .map(drop)
        .map_err(|e| Failure::Usage(format!("--artifact: {e}")))
}

/// The annotation naming the artifact (docs/annotations.md).
pub const ARTIFACT_ANNOTATION: &str = "vsnap.io/artifact";

/// `--artifact NAME`, or with `--artifact-from-state` the state's
/// `vsnap.io/artifact` annotation (for runtimes that install the hook
/// statically, e.g. from an OCI hooks.d file); checked as a plain name.
/// `<root>/.pull/partial/<name>/tree`: the artifact `name` while its pull
/// is under way, which a streamed restore reads (`--streamed`).
pub fn streamed_tree(root: &std::path::Path, name: &str) -> std::path::PathBuf {
    root.join(".pull").join("partial").join(name).join("tree")
}

pub fn artifact_name(flags: &Flags, state: &mut StateSource) -> Result<Option<String>, Failure> {
    let name = match (
        flags.value("--artifact"),
        flags.has("--artifact-from-state"),
    ) {
        (Some(_), true) => {
            return Err(Failure::Usage(
                "--artifact and --artifact-from-state exclude each other".into(),
            ))
        }
        (Some(name), false) => name.to_string(),
        (None, true) => {
            let state = state.get()?;
            state
                .annotations
                .get(ARTIFACT_ANNOTATION)
                .cloned()
                .ok_or_else(|| {
                    Failure::Input(format!(
                        "the state of container {} has no {ARTIFACT_ANNOTATION} annotation (--artifact-from-state)",
                        state.id
                    ))
                })?
        }
        (None, false) => return Ok(None),
    };
    check_artifact_name(&name)?;
    Ok(Some(name))
}

/// The bundle's OCI spec (`config.json`) as JSON.
pub fn read_spec(bundle: &Path) -> Result<serde_json::Value, Failure> {
    const MAX: u64 = 16 << 20;
    let path = bundle.join("config.json");
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX + 1).read_to_end(&mut bytes))
        .map_err(|e| Failure::Input(format!("read {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX {
        return Err(Failure::Input(format!(
            "{}: larger than {MAX} bytes",
            path.display()
        )));
    }
    let spec: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Failure::Input(format!("{}: {e}", path.display())))?;
    if !spec.is_object() {
        return Err(Failure::Input(format!(
            "{}: not a JSON object",
            path.display()
        )));
    }
    Ok(spec)
}

/// The effective uid of this process (the runtime's, when run as a hook).
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_take_both_forms_and_refuse_unknown_or_repeated_ones() {
        let f = Flags::parse(
            "x",
            &args(&["--a", "1", "--b=2", "--on"]),
            &["--a", "--b"],
            &["--on"],
        )
        .unwrap();
        assert_eq!((f.value("--a"), f.value("--b")), (Some("1"), Some("2")));
        assert!(f.has("--on") && !f.has("--off"));
        for bad in [
            &["--c", "1"][..],
            &["--a"],
            &["--a", "1", "--a", "2"],
            &["pos"],
        ] {
            let e = Flags::parse("x", &args(bad), &["--a"], &[]).unwrap_err();
            assert_eq!(e.code(), EXIT_USAGE, "{bad:?}");
        }
    }

    #[test]
    fn failures_are_one_line_naming_the_check() {
        let mut empty = std::io::empty();
        let out = run(&args(&["nope"]), &mut empty);
        assert_eq!(out.code, EXIT_USAGE);
        assert_eq!(
            out.line.as_deref(),
            Some("vsnap-hook: unknown check \"nope\" (io-uring, ownership, fingerprint)")
        );
        let out = run(&args(&["ownership", "--bogus"]), &mut empty);
        assert_eq!(out.code, EXIT_USAGE);
        let line = out.line.unwrap();
        assert!(line.starts_with("vsnap-hook ownership: "), "{line}");
        assert!(!line.contains('\n'), "{line}");
        assert_eq!(one_line("a\nb\tc"), "a b c");
    }

    #[test]
    fn paths_must_be_absolute_and_artifact_names_plain() {
        let f = Flags::parse(
            "x",
            &args(&["--p", "rel/x", "--q", "/a/../b"]),
            &["--p", "--q"],
            &[],
        )
        .unwrap();
        assert!(f.abs_path("--p").is_err());
        assert!(f.abs_path("--q").is_err());
        for bad in ["", "../x", "/x", ".hidden", "a/b"] {
            assert!(check_artifact_name(bad).is_err(), "{bad}");
        }
        check_artifact_name("qwen3-0.6b").unwrap();
    }
}
