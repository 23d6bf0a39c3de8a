//! Command line and the vLLM-compatible `--snapshot-config`.

use std::path::{Component, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub const USAGE: &str = "\
usage: vsnap-ref-engine [options] [-- ignored...]

modes:
  --snapshot-config JSON     startup capture through a control dir (vLLM external
                             startup capture); also read from VSNAP_SNAPSHOT_CONFIG
                             '{\"mode\":\"startup\",\"control_dir\":\"/abs\",\"timeout_s\":300.0}'
  --ready-file F --release-file R [--release-timeout-s S]
                             released-vLLM barrier: write F, wait for R
  (neither)                  plain: initialize and serve on --host/--port

options:
  --host H                   plain mode listen address (default 0.0.0.0)
  --port P                   plain mode listen port (default 8000)
  --model NAME               model name reported by the API (default vsnap-ref)
  --weights PATH             load weights from PATH instead of the built-in seed
  --write-weights PATH       write the built-in weights to PATH and exit
  -h, --help                 this text

Arguments after `--` are accepted and ignored (vLLM serve arguments).";

#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Startup(SnapshotConfig),
    Barrier {
        ready_file: PathBuf,
        release_file: PathBuf,
        release_timeout: Duration,
    },
    Plain {
        host: String,
        port: u16,
    },
    WriteWeights(PathBuf),
    Help,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub mode: Mode,
    pub model_name: String,
    pub weights: Option<PathBuf>,
}

/// `--snapshot-config`, parsed as strictly as vLLM parses it.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotConfig {
    pub control_dir: PathBuf,
    pub timeout: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSnapshotConfig {
    mode: String,
    control_dir: String,
    #[serde(default = "default_timeout_s")]
    timeout_s: f64,
}

fn default_timeout_s() -> f64 {
    900.0
}

const DEFAULT_RELEASE_TIMEOUT_S: f64 = 900.0;

impl SnapshotConfig {
    pub fn parse(json: &str) -> Result<Self, String> {
        if !json.trim_start().starts_with('{') {
            return Err("snapshot config must be a JSON object".into());
        }
        let raw: RawSnapshotConfig =
            serde_json::from_str(json).map_err(|e| format!("snapshot config: {e}"))?;
        if raw.mode != "startup" {
            return Err(format!(
                "snapshot config: mode {:?} is not supported (expected \"startup\")",
                raw.mode
            ));
        }
        let control_dir = PathBuf::from(&raw.control_dir);
        if !control_dir.is_absolute() {
            return Err(format!(
                "snapshot config: control_dir {:?} must be absolute",
                raw.control_dir
            ));
        }
        if control_dir.components().any(|c| c == Component::ParentDir) {
            return Err(format!(
                "snapshot config: control_dir {:?} must not contain `..`",
                raw.control_dir
            ));
        }
        Ok(SnapshotConfig {
            control_dir,
            timeout: seconds("snapshot config: timeout_s", raw.timeout_s)?,
        })
    }
}

/// A positive, finite number of seconds that fits a Duration.
fn seconds(what: &str, value: f64) -> Result<Duration, String> {
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("{what} {value} must be a finite number > 0"));
    }
    Duration::try_from_secs_f64(value).map_err(|_| format!("{what} {value} is too large"))
}

impl Options {
    /// Parses `args` (without the program name). `env_config` is VSNAP_SNAPSHOT_CONFIG,
    /// used when `--snapshot-config` is absent.
    pub fn parse(args: &[String], env_config: Option<String>) -> Result<Self, String> {
        let Some(flags) = Flags::read(args)? else {
            return Ok(Options {
                mode: Mode::Help,
                model_name: String::new(),
                weights: None,
            });
        };
        let mode = flags.mode(env_config)?;
        Ok(Options {
            mode,
            model_name: flags.model_name.unwrap_or_else(|| "vsnap-ref".into()),
            weights: flags.weights.map(PathBuf::from),
        })
    }
}

/// Each flag's value as given, before any is interpreted.
#[derive(Default)]
struct Flags {
    snapshot_config: Option<String>,
    ready_file: Option<String>,
    release_file: Option<String>,
    release_timeout: Option<String>,
    host: Option<String>,
    port: Option<String>,
    model_name: Option<String>,
    weights: Option<String>,
    write_weights: Option<String>,
}

impl Flags {
    /// The flags up to `--`, each at most once, as `--flag value` or
    /// `--flag=value`; None for `-h`/`--help`.
    fn read(args: &[String]) -> Result<Option<Self>, String> {
        let mut flags = Flags::default();
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            if arg == "--" {
                break;
            }
            if arg == "-h" || arg == "--help" {
                return Ok(None);
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
                _ => (arg.as_str(), None),
            };
            let slot = match flag {
                "--snapshot-config" => &mut flags.snapshot_config,
                "--ready-file" => &mut flags.ready_file,
                "--release-file" => &mut flags.release_file,
                "--release-timeout-s" => &mut flags.release_timeout,
                "--host" => &mut flags.host,
                "--port" => &mut flags.port,
                "--model" | "--served-model-name" => &mut flags.model_name,
                "--weights" => &mut flags.weights,
                "--write-weights" => &mut flags.write_weights,
                _ => return Err(format!("unknown argument {arg:?}")),
            };
            let value = match inline {
                Some(value) => value,
                None => rest
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))?,
            };
            if slot.replace(value).is_some() {
                return Err(format!("{flag} given twice"));
            }
        }
        Ok(Some(flags))
    }

    /// The mode the flags choose: writing weights, then startup capture,
    /// then the barrier, else plain.
    fn mode(&self, env_config: Option<String>) -> Result<Mode, String> {
        let snapshot_config =
            (self.snapshot_config.clone()).or(env_config.filter(|c| !c.trim().is_empty()));
        let barrier = self.ready_file.is_some()
            || self.release_file.is_some()
            || self.release_timeout.is_some();
        if let Some(path) = &self.write_weights {
            Ok(Mode::WriteWeights(path.into()))
        } else if let Some(json) = snapshot_config {
            if barrier {
                return Err(
                    "--snapshot-config and --ready-file/--release-file exclude each other".into(),
                );
            }
            Ok(Mode::Startup(SnapshotConfig::parse(&json)?))
        } else if barrier {
            self.barrier_mode()
        } else {
            self.plain_mode()
        }
    }

    fn barrier_mode(&self) -> Result<Mode, String> {
        let (Some(ready), Some(release)) = (&self.ready_file, &self.release_file) else {
            return Err("--ready-file and --release-file go together".into());
        };
        let timeout_s = match &self.release_timeout {
            Some(text) => text
                .parse::<f64>()
                .map_err(|_| format!("--release-timeout-s {text:?} is not a number"))?,
            None => DEFAULT_RELEASE_TIMEOUT_S,
        };
        Ok(Mode::Barrier {
            ready_file: ready.into(),
            release_file: release.into(),
            release_timeout: seconds("--release-timeout-s", timeout_s)?,
        })
    }

    fn plain_mode(&self) -> Result<Mode, String> {
        let port = match &self.port {
            Some(text) => text
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("--port {text:?} is not a port (1-65535)"))?,
            None => 8000,
        };
        Ok(Mode::Plain {
            host: self.host.clone().unwrap_or_else(|| "0.0.0.0".into()),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn snapshot_config_is_parsed_strictly() {
        let ok =
            SnapshotConfig::parse(r#"{"mode":"startup","control_dir":"/run/c","timeout_s":300.0}"#)
                .unwrap();
        assert_eq!(ok.control_dir, PathBuf::from("/run/c"));
        assert_eq!(ok.timeout, Duration::from_secs(300));

        let default = SnapshotConfig::parse(r#"{"mode":"startup","control_dir":"/c"}"#).unwrap();
        assert_eq!(default.timeout, Duration::from_secs(900));

        for (json, expected) in [
            (
                r#"{"mode":"shutdown","control_dir":"/c"}"#,
                "mode \"shutdown\"",
            ),
            (
                r#"{"mode":"startup","control_dir":"c"}"#,
                "must be absolute",
            ),
            (r#"{"mode":"startup","control_dir":"/a/../c"}"#, "`..`"),
            (
                r#"{"mode":"startup","control_dir":"/c","timeout_s":0}"#,
                "> 0",
            ),
            (
                r#"{"mode":"startup","control_dir":"/c","timeout_s":-1}"#,
                "> 0",
            ),
            (
                r#"{"mode":"startup","control_dir":"/c","timeout_s":1e300}"#,
                "too large",
            ),
            (
                r#"{"mode":"startup","control_dir":"/c","extra":1}"#,
                "unknown field `extra`",
            ),
            (r#"{"mode":"startup"}"#, "missing field `control_dir`"),
            (r#"["startup","/c"]"#, "JSON object"),
            (r#"{"mode":"startup","control_dir":"/c"} x"#, "trailing"),
        ] {
            let err = SnapshotConfig::parse(json).unwrap_err();
            assert!(err.contains(expected), "{json}: {err}");
        }
    }

    #[test]
    fn modes_are_chosen_by_flags() {
        let plain = Options::parse(&args(&["--host", "127.0.0.1", "--port=9000"]), None).unwrap();
        assert_eq!(
            plain.mode,
            Mode::Plain {
                host: "127.0.0.1".into(),
                port: 9000
            }
        );
        let barrier = Options::parse(
            &args(&[
                "--ready-file",
                "/r",
                "--release-file",
                "/s",
                "--",
                "serve",
                "--x",
            ]),
            None,
        )
        .unwrap();
        assert!(matches!(barrier.mode, Mode::Barrier { .. }));
        let env = r#"{"mode":"startup","control_dir":"/c"}"#.to_string();
        let startup = Options::parse(&[], Some(env)).unwrap();
        assert!(matches!(startup.mode, Mode::Startup(_)));
    }

    #[test]
    fn bad_arguments_are_refused() {
        assert!(Options::parse(&args(&["--bogus"]), None).is_err());
        assert!(Options::parse(&args(&["--port"]), None).is_err());
        assert!(Options::parse(&args(&["--port", "0"]), None).is_err());
        assert!(Options::parse(&args(&["--port", "1", "--port", "2"]), None).is_err());
        assert!(Options::parse(&args(&["--ready-file", "/r"]), None).is_err());
        assert!(Options::parse(
            &args(&[
                "--ready-file",
                "/r",
                "--release-file",
                "/s",
                "--release-timeout-s",
                "nan"
            ]),
            None
        )
        .is_err());
    }
}
