//! A restore from `vsnap.io/artifact-ref` that starts while its artifact
//! still arrives: the shim runs `vsnap pull --stream-fd 3` and goes on
//! with the create as soon as the pull says the partial tree holds all
//! CRIU reads itself (its `{"head": TREE}` line; the CLI's
//! vsnap-registry `pull/streamed.rs`). The preflight, CRIU and the
//! verification then read that tree; vsnap's page server reads each span
//! of the tasks' pages once the pull recorded it as arrived, and fails
//! naming the reference and the chunk if the pull fails instead.
//!
//! The pull publishes the artifact (every byte checked again) only once
//! the restore let go of the tree: the restore holds the write end of a
//! pipe whose read end is the pull's descriptor 3 ([`Streamed::hold`]),
//! dropped where a restore of a local artifact drops its shared lock. A
//! shim that dies closes it too.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use vsnap_config::RuntimeConfig;

use crate::exits::Exits;
use crate::vsnap_cli;

/// Chunks transferred at once, by every pull the shim runs.
pub const JOBS: &str = "4";

/// The descriptor the pull's gate is handed over as.
const GATE_FD: i32 = 3;

/// The pull's outcome once it ended without publishing every byte.
pub type Failure = Arc<Mutex<Option<String>>>;

/// A pull under way that a restore reads from.
#[derive(Clone, Debug)]
pub struct Streamed {
    /// The registry reference, named in every error.
    pub reference: String,
    /// The partial pull's tree: the artifact as it will be published.
    pub tree: PathBuf,
    /// Why the pull ended without publishing, once it did.
    pub failure: Failure,
    /// The restore's hold on the tree: while any clone lives, the pull
    /// does not publish (and so does not move the tree).
    pub hold: Arc<OwnedFd>,
}

impl Streamed {
    /// The pull's record of what arrived (`vsnap_artifact::arrivals`).
    pub fn record(&self) -> PathBuf {
        let dir = self.tree.parent().unwrap_or(Path::new("/"));
        dir.join(vsnap_artifact::arrivals::FILE)
    }

    /// The page server's view of the arrivals: it waits on them.
    pub fn arrivals(&self) -> Arc<vsnap_pages::Arrivals> {
        let failure = self.failure.clone();
        Arc::new(vsnap_pages::Arrivals::new(
            &self.record(),
            &format!("pull {}", self.reference),
            Arc::new(move || failure.lock().expect("lock").clone()),
        ))
    }
}

/// How a streamed pull ended before its head.
pub enum Start {
    /// A restore can start (the pull goes on in the background).
    Head(Streamed),
    /// The pull ended first: its CLI's words, or the deadline.
    Failed(String),
    TimedOut,
}

/// Runs `vsnap pull REF NAME --stream-fd 3` and waits for its head, at most
/// `timeout` from now (which also bounds the whole pull: past it the pull
/// is killed).
pub async fn start(
    config: &RuntimeConfig,
    exits: &Exits,
    (reference, name): (&str, &str),
    timeout: Duration,
) -> Result<Start, String> {
    let began = Instant::now();
    let cli = vsnap_cli::locate(config)?;
    let (config_arg, input) = vsnap_cli::config_args(config);
    let (gate_read, gate_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    let mut cmd = Command::new(&cli);
    cmd.arg("--config").arg(config_arg);
    cmd.args(["pull", reference, name, "--jobs", JOBS, "--json"]);
    cmd.args(["--stream-fd", &GATE_FD.to_string()]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let read_fd = gate_read.as_raw_fd();
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork
    // and exec, and leaves the read end at 3 without close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(read_fd, GATE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mark = exits.mark();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", cli.display()))?;
    drop(gate_read);
    let pid = child.id() as i32;
    let exit = exits.watch(pid, mark);
    let stdin = child.stdin.take().map(OwnedFd::from);
    let stdout = child.stdout.take().map(OwnedFd::from);
    let stderr = child.stderr.take().map(OwnedFd::from);
    let mut lines = match stdout.map(pipe::Receiver::from_owned_fd) {
        Some(Ok(r)) => BufReader::new(r).lines(),
        _ => return Err("the pull's stdout".into()),
    };
    tokio::spawn(feed(stdin, input));
    let failure: Failure = Arc::new(Mutex::new(None));
    let stderr_text = Arc::new(Mutex::new(Vec::new()));
    let mut stderr_read = tokio::spawn(read_all(stderr, stderr_text.clone()));
    let head = tokio::time::timeout(timeout, async {
        while let Ok(Some(line)) = lines.next_line().await {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if let Some(tree) = v["head"].as_str() {
                return Some(PathBuf::from(tree));
            }
        }
        None
    })
    .await;
    let kill = move || {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    };
    let tree = match head {
        // Only the tree of this name's partial pull, wherever the line
        // says it is.
        Ok(Some(tree)) if tree == partial_tree(&config.artifact_root, name) => tree,
        Ok(Some(tree)) => {
            kill();
            return Err(format!(
                "the pull named {} as its tree, not {}",
                tree.display(),
                partial_tree(&config.artifact_root, name).display()
            ));
        }
        Ok(None) => {
            let code = exit.await.map(|e| e.code).unwrap_or(-1);
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut stderr_read).await;
            return Ok(Start::Failed(reason(&stderr_text, code)));
        }
        Err(_) => {
            kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), exit).await;
            return Ok(Start::TimedOut);
        }
    };
    let streamed = Streamed {
        reference: reference.to_string(),
        tree,
        failure: failure.clone(),
        hold: Arc::new(gate_write),
    };
    let left = timeout.saturating_sub(began.elapsed());
    tokio::spawn(async move {
        // The report line, then the end of stdout.
        while let Ok(Some(_)) = lines.next_line().await {}
        let code = match tokio::time::timeout(left, exit).await {
            Ok(exit) => exit.map(|e| e.code).unwrap_or(-1),
            Err(_) => {
                kill();
                *failure.lock().expect("lock") = Some(format!(
                    "not done within pull_timeout_s ({}s): killed",
                    timeout.as_secs()
                ));
                return;
            }
        };
        if code != 0 {
            // Its last words: stderr ends with the process.
            let _ = tokio::time::timeout(Duration::from_secs(5), stderr_read).await;
            let why = reason(&stderr_text, code);
            log::warn!("streamed pull failed: {why}");
            *failure.lock().expect("lock") = Some(why);
        }
    });
    Ok(Start::Head(streamed))
}

/// `<root>/.pull/partial/<name>/tree`: where the pull of `name` writes.
fn partial_tree(root: &Path, name: &str) -> PathBuf {
    root.join(".pull").join("partial").join(name).join("tree")
}

/// The CLI's own words for a failure: its last line on stderr.
fn reason(stderr: &Mutex<Vec<u8>>, code: i32) -> String {
    let ran = vsnap_cli::Ran {
        code,
        stdout: Vec::new(),
        stderr: stderr.lock().expect("lock").clone(),
    };
    ran.reason()
}

async fn feed(fd: Option<OwnedFd>, input: Vec<u8>) {
    if let Some(Ok(mut w)) = fd.map(pipe::Sender::from_owned_fd) {
        let _ = w.write_all(&input).await;
    }
}

async fn read_all(fd: Option<OwnedFd>, into: Arc<Mutex<Vec<u8>>>) {
    if let Some(Ok(mut r)) = fd.map(pipe::Receiver::from_owned_fd) {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
            into.lock().expect("lock").extend_from_slice(&buf[..n]);
        }
    }
}
