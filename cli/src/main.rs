//! `vsnap`: the operator CLI for vsnap's snapshot artifacts.
//!
//! Nothing here executes anything from an artifact: it reads metadata and the
//! manifest (strictly, as the shim does), checks the MAC with this host's key
//! and compares fingerprints. Looking (`inspect`, `verify`, `ls`) takes no
//! lock, so it never makes a concurrent restore or capture fail; removing
//! (`rm`, `gc`) takes the artifact's exclusive lock and is refused while
//! anyone holds it. See docs/cli.md.

mod fleet;
mod gc;
mod host;
mod inspect;
mod key;
mod ls;
mod metrics;
mod partial;
mod quarantined;
mod rm;
mod store;
mod table;
mod units;
mod verify;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde::Serialize;
use vsnap_artifact::{ArtifactError, Tools};
use vsnap_config::{RuntimeConfig, DEFAULT_CONFIG_PATH};

/// Exit status of a command that did what was asked and found nothing wrong.
pub const OK: u8 = 0;
/// The artifact is invalid, or something asked for could not be done
/// (in use, not removable, size target not reached).
pub const FAILED: u8 = 1;
/// Usage, configuration or I/O errors (clap's own usage errors are 2 too).
pub const ERROR: u8 = 2;

/// `Ok(exit status)`, or a message for an error that ends the command (2).
pub type Outcome = Result<u8, String>;

#[derive(Parser)]
#[command(
    name = "vsnap",
    version,
    about = "Inspect, verify, list, remove, garbage-collect, push and pull vsnap snapshot artifacts; make fleet keys; export metrics",
    after_help = "Exit status: 0 ok, 1 invalid artifact or refused removal, 2 usage, configuration or I/O error. See docs/cli.md."
)]
struct Cli {
    /// Artifact root [default: the runtime config's artifact_root]
    #[arg(long, global = true, value_name = "DIR", display_order = 100)]
    root: Option<PathBuf>,
    /// Runtime config to read [default: /etc/vsnap/config.toml when present]
    #[arg(long, global = true, value_name = "FILE", display_order = 101)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show an artifact's manifest (identity, oracle, sizes, timings) and MAC status
    Inspect {
        name: String,
        /// Read the quarantined copy of NAME (set aside by an `auto` start) and why it was set aside
        #[arg(long)]
        quarantined: bool,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// Check layout, ownership, MAC, every file's content digests and this host's fingerprint (exit 1 if invalid)
    Verify {
        name: String,
        /// Check the files' sizes only, not their content digests
        #[arg(long)]
        quick: bool,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// List the artifacts under the root with their status, then the quarantined copies
    #[command(visible_alias = "list")]
    Ls {
        /// List only the quarantined copies (artifacts set aside by `auto` starts)
        #[arg(long)]
        quarantined: bool,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// Remove artifacts (refused while one is in use)
    #[command(visible_alias = "remove")]
    Rm {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// Remove old artifacts, then the oldest until the total fits, stale leftovers and abandoned partial pulls
    Gc {
        /// Remove artifacts older than this (e.g. 7d, 12h, 30m, 1d12h)
        #[arg(long, value_name = "DURATION", value_parser = units::parse_duration)]
        older_than: Option<Duration>,
        /// Then remove the oldest until all artifacts fit (e.g. 50G, 512M; powers of 1024)
        #[arg(long, value_name = "SIZE", value_parser = units::parse_size)]
        max_total_size: Option<u64>,
        /// Remove the partial folders of interrupted pulls (.pull/partial/NAME) no pull worked in for longer than this, unless a pull holds them
        #[arg(long, value_name = "DURATION", value_parser = units::parse_duration, default_value = "24h")]
        partial_older_than: Duration,
        /// Show what would be removed, remove nothing
        #[arg(long)]
        dry_run: bool,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// Push an artifact of this host to an OCI registry (REF: host[:port]/repo:tag)
    Push {
        name: String,
        #[arg(value_name = "REF")]
        reference: String,
        /// Chunks uploaded at once
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
        jobs: u16,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// Pull an artifact from an OCI registry, verify every byte and publish it sealed for this host
    Pull {
        #[arg(value_name = "REF")]
        reference: String,
        /// Name to publish it as [default: the name it was pushed with]
        name: Option<String>,
        /// Chunks downloaded at once
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
        jobs: u16,
        /// JSON for tools
        #[arg(long)]
        json: bool,
        /// For a restore that starts before the pull ends (the shim's): print a line {"head": TREE} once a restore can start from the partial tree, and publish only after descriptor FD (a pipe's read end) reaches its end
        #[arg(long, value_name = "FD")]
        stream_fd: Option<i32>,
    },
    /// Restores, captures, pulls and pushes (counts, phases, bytes, failures), auto fallbacks, the store's size and quarantined copies, in the Prometheus text format
    Metrics {
        /// Serve them at http://ADDR:PORT/metrics instead of printing them once
        #[arg(long, value_name = "ADDR:PORT")]
        listen: Option<std::net::SocketAddr>,
    },
    /// Fleet signing and encryption keys (docs/fleet.md)
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Prepare this host for CRIU (docs/operations.md)
    Host {
        #[command(subcommand)]
        command: HostCommand,
    },
}

#[derive(Subcommand)]
enum HostCommand {
    /// Keep CRIU's kernel-probe cache (criu.kdat) on a tmpfs where the run folder is none (once per boot; again after a CRIU upgrade)
    CriuCache {
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Make an ed25519 key pair: the private key (0600) for the hosts that push, the public key for every host that pulls
    Generate {
        /// Where the private key goes (must not exist)
        #[arg(long, value_name = "PATH")]
        private: PathBuf,
        /// Where the public key goes (must not exist)
        #[arg(long, value_name = "PATH")]
        public: PathBuf,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
    /// Make a fleet encryption key (32 random bytes, 0600) for every host that pushes or pulls (fleet_encryption_key)
    GenerateEncryption {
        /// Where the key goes (must not exist)
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// JSON for tools
        #[arg(long)]
        json: bool,
    },
}

/// What every command works with.
pub struct Ctx {
    pub root: PathBuf,
    pub config: RuntimeConfig,
}

impl Ctx {
    /// The binaries the fingerprint names, as the shim finds them.
    pub fn tools(&self) -> Tools {
        Tools {
            runc: self.config.runc_binary.clone(),
            criu: self.config.criu_binary.clone(),
            cuda_plugin: self.config.cuda_plugin_dir.join("cuda_plugin.so"),
            cuda_checkpoint: self.config.cuda_checkpoint.clone(),
        }
    }
}

fn load_config(explicit: Option<&Path>) -> Result<RuntimeConfig, String> {
    match explicit {
        Some(path) => RuntimeConfig::load(path).map_err(|e| e.to_string()),
        None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
            RuntimeConfig::load(Path::new(DEFAULT_CONFIG_PATH)).map_err(|e| e.to_string())
        }
        None => Ok(RuntimeConfig::default()),
    }
}

fn run(cli: Cli) -> Outcome {
    // Artifact commands need the config and the root; making keys neither.
    let ctx = || -> Result<Ctx, String> {
        let config = load_config(cli.config.as_deref())?;
        let root = cli
            .root
            .clone()
            .unwrap_or_else(|| config.artifact_root.clone());
        let root = store::absolute_root(&root)
            .map_err(|e| format!("artifact root {}: {e}", root.display()))?;
        Ok(Ctx { root, config })
    };
    match cli.command {
        Command::Inspect {
            ref name,
            json,
            quarantined,
        } => inspect::run(&ctx()?, name, json, quarantined),
        Command::Verify {
            ref name,
            quick,
            json,
        } => verify::run(&ctx()?, name, quick, json),
        Command::Ls { json, quarantined } => ls::run(&ctx()?, json, quarantined),
        Command::Rm { ref names, json } => rm::run(&ctx()?, names, json),
        Command::Gc {
            older_than,
            max_total_size,
            partial_older_than,
            dry_run,
            json,
        } => gc::run(
            &ctx()?,
            gc::Policy {
                older_than,
                max_total_size,
                partial_older_than,
                dry_run,
            },
            json,
        ),
        Command::Push {
            ref name,
            ref reference,
            jobs,
            json,
        } => fleet::push(&ctx()?, name, reference, jobs.into(), json),
        Command::Pull {
            ref reference,
            ref name,
            jobs,
            json,
            stream_fd,
        } => fleet::pull(
            &ctx()?,
            (reference, name.as_deref()),
            jobs.into(),
            json,
            stream_fd,
        ),
        Command::Metrics { listen } => metrics::run(&ctx()?, listen),
        Command::Host {
            command: HostCommand::CriuCache { json },
        } => host::criu_cache(&load_config(cli.config.as_deref())?.criu_binary, json),
        Command::Key {
            command:
                KeyCommand::Generate {
                    ref private,
                    ref public,
                    json,
                },
        } => key::generate(private, public, json),
        Command::Key {
            command: KeyCommand::GenerateEncryption { ref path, json },
        } => key::generate_encryption(path, json),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("vsnap: {message}");
            ExitCode::from(ERROR)
        }
    }
}

/// Writes to stdout; a closed pipe (`vsnap ls | head`) is not an error.
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

pub fn emit_json<T: Serialize>(value: &T) {
    let mut text = serde_json::to_string_pretty(value).expect("a report serializes");
    text.push('\n');
    emit(&text);
}

pub fn warn(text: &str) {
    eprintln!("vsnap: {text}");
}

/// Loading an artifact for a report: missing or unreadable is an error (2),
/// present but unsafe or malformed is a finding (1).
pub enum LoadFailure {
    Error(String),
    Invalid(String),
}

pub fn classify(root: &Path, name: &str, e: ArtifactError) -> LoadFailure {
    match e {
        ArtifactError::NotFound(_) => LoadFailure::Error(format!(
            "artifact {name} does not exist under {}",
            root.display()
        )),
        ArtifactError::Io { ref source, .. } if source.kind() != std::io::ErrorKind::NotFound => {
            LoadFailure::Error(e.to_string())
        }
        e => LoadFailure::Invalid(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn gc_reads_durations_and_sizes_and_refuses_bad_ones() {
        let cli = Cli::try_parse_from([
            "vsnap",
            "--root",
            "/r",
            "gc",
            "--older-than",
            "7d",
            "--max-total-size",
            "50G",
            "--dry-run",
        ])
        .unwrap();
        match cli.command {
            Command::Gc {
                older_than,
                max_total_size,
                partial_older_than,
                dry_run,
                json,
            } => {
                assert_eq!(older_than, Some(Duration::from_secs(7 * 86_400)));
                assert_eq!(max_total_size, Some(50 << 30));
                assert_eq!(partial_older_than, Duration::from_secs(86_400), "24h");
                assert!(dry_run && !json);
            }
            _ => panic!("not gc"),
        }
        match Cli::try_parse_from(["vsnap", "gc", "--partial-older-than", "2h"]) {
            Ok(Cli {
                command: Command::Gc {
                    partial_older_than, ..
                },
                ..
            }) => assert_eq!(partial_older_than, Duration::from_secs(7200)),
            _ => panic!("not gc"),
        }
        assert!(Cli::try_parse_from(["vsnap", "gc", "--partial-older-than", "x"]).is_err());
        assert!(Cli::try_parse_from(["vsnap", "gc", "--older-than", "7"]).is_err());
        assert!(Cli::try_parse_from(["vsnap", "gc", "--max-total-size", "lots"]).is_err());
        assert!(
            Cli::try_parse_from(["vsnap", "rm"]).is_err(),
            "rm needs a name"
        );
    }
}
