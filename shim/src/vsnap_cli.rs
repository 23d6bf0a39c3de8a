//! The `vsnap` CLI as the shim's helper process. Registry pulls and pushes
//! run there (vsnap-registry with its HTTP and TLS stack), so the shim of a
//! plain container never maps that code. The CLI reads the shim's own
//! runtime config (its file, or the inline body or defaults on stdin), so
//! it applies the same registries, credentials, mirrors (containerd's
//! `hosts.toml` under `registry_config_path`) and trusted keys: the trust
//! checks are vsnap-registry's, the same code `vsnap pull` runs.
//!
//! Its exit is awaited through the shim's reaper (never `waitpid`), as runc's.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use vsnap_config::{ConfigSource, RuntimeConfig};

use crate::exits::Exits;
use crate::pipes::{feed, read_all};

/// How one run of the CLI ended.
#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Ran {
    /// The CLI's own words for a failure: its last line on stderr.
    pub fn reason(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let line = text.lines().rev().find(|l| !l.trim().is_empty());
        match line {
            Some(l) => l.trim().trim_start_matches("vsnap: ").to_string(),
            None => format!("the vsnap CLI exited with status {}", self.code),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Failed(String),
    #[error("not done within {0:?}; the vsnap CLI was killed")]
    TimedOut(Duration),
}

/// The CLI the config names (`vsnap_cli`): a path with a `/` as it is; a
/// bare name beside the shim's own binary, else on PATH.
pub fn locate(config: &RuntimeConfig) -> Result<PathBuf, String> {
    let named = &config.vsnap_cli;
    let missing = |where_: String| {
        format!(
            "the vsnap CLI (vsnap_cli = {:?}) is needed for registry transfers and was not found {where_}; install it beside the shim or set vsnap_cli in the runtime config",
            named.display().to_string()
        )
    };
    if named.components().count() > 1 || named.is_absolute() {
        return if is_executable(named) {
            Ok(named.clone())
        } else {
            Err(missing(format!("at {}", named.display())))
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(named)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(named));
    beside
        .into_iter()
        .chain(on_path)
        .find(|p| is_executable(p))
        .ok_or_else(|| missing("beside the shim or on PATH".into()))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `--config` for the CLI, and what goes to its stdin: the shim's config
/// file by path, else its body (the defaults: empty) on stdin.
pub fn config_args(config: &RuntimeConfig) -> (OsString, Vec<u8>) {
    match &config.source {
        ConfigSource::File(path) => (path.clone().into_os_string(), Vec::new()),
        ConfigSource::Body(body) => ("/dev/stdin".into(), body.clone().into_bytes()),
        ConfigSource::Defaults => ("/dev/stdin".into(), Vec::new()),
    }
}

/// Runs `vsnap --config <the shim's config> ARGS` to its end, or kills it
/// past `timeout`.
pub async fn run(
    config: &RuntimeConfig,
    exits: &Exits,
    args: &[OsString],
    timeout: Duration,
) -> Result<Ran, CliError> {
    let cli = locate(config).map_err(CliError::Failed)?;
    let (config_arg, input) = config_args(config);
    let mut cmd = Command::new(&cli);
    cmd.arg("--config")
        .arg(config_arg)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mark = exits.mark();
    let mut child = cmd
        .spawn()
        .map_err(|e| CliError::Failed(format!("spawn {}: {e}", cli.display())))?;
    let pid = child.id() as i32;
    let mut exit = exits.watch(pid, mark);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let stdin = child.stdin.take().map(OwnedFd::from);
    let so = child.stdout.take().map(OwnedFd::from);
    let se = child.stderr.take().map(OwnedFd::from);
    let finished = async {
        tokio::join!(
            feed(stdin, input),
            read_all(so, &mut out),
            read_all(se, &mut err)
        );
        (&mut exit).await
    };
    let code = match tokio::time::timeout(timeout, finished).await {
        Ok(Ok(exit)) => exit.code,
        Ok(Err(_)) => return Err(CliError::Failed(format!("{}: exit lost", cli.display()))),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = tokio::time::timeout(Duration::from_secs(10), exit).await;
            return Err(CliError::TimedOut(timeout));
        }
    };
    Ok(Ran {
        code,
        stdout: out,
        stderr: err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cli_is_named_with_how_to_fix_it() {
        let config = RuntimeConfig {
            vsnap_cli: PathBuf::from("/nonexistent/vsnap"),
            ..RuntimeConfig::default()
        };
        let e = locate(&config).unwrap_err();
        assert!(
            e.contains("/nonexistent/vsnap") && e.contains("vsnap_cli"),
            "{e}"
        );
        let config = RuntimeConfig {
            vsnap_cli: PathBuf::from("vsnap-surely-not-installed"),
            ..RuntimeConfig::default()
        };
        let e = locate(&config).unwrap_err();
        assert!(e.contains("beside the shim or on PATH"), "{e}");
    }

    #[test]
    fn a_bare_name_is_found_on_path() {
        let config = RuntimeConfig {
            vsnap_cli: PathBuf::from("sh"),
            ..RuntimeConfig::default()
        };
        assert!(locate(&config).unwrap().ends_with("sh"));
    }

    #[test]
    fn the_cli_reads_the_shims_config() {
        let mut config = RuntimeConfig::default();
        assert_eq!(config_args(&config), ("/dev/stdin".into(), Vec::new()));
        config.source = ConfigSource::Body("x = 1".into());
        assert_eq!(
            config_args(&config),
            ("/dev/stdin".into(), b"x = 1".to_vec())
        );
        config.source = ConfigSource::File("/etc/v.toml".into());
        assert_eq!(config_args(&config), ("/etc/v.toml".into(), Vec::new()));
    }
}
