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
//! shim that dies closes it too. A restore that refused the artifact, or
//! failed for a reason that is the artifact's, writes a byte into that
//! pipe first ([`abandon`]): the pull then publishes nothing, so what this
//! host refused never lands under the name (where `auto` captures anew).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe;
use vsnap_config::RuntimeConfig;

use crate::exits::Exits;
use crate::pipes::{feed, read_shared};
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
    /// The pull given up: it publishes nothing ([`abandon`]).
    pub fn abandon(&self) {
        abandon(&self.hold);
    }

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

impl Streamed {
    /// Waits for every byte of the tree's pages files (each made at its
    /// size when the pull began): for a restore whose pages CRIU places
    /// itself (a GPU restore). Fails as the pull does.
    pub fn wait_whole(&self) -> Result<(), String> {
        let images = self.tree.join("images");
        let listed =
            std::fs::read_dir(&images).map_err(|e| format!("{}: {e}", images.display()))?;
        let arrivals = self.arrivals();
        let never = std::sync::atomic::AtomicBool::new(false);
        for entry in listed.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("pages-") && name.ends_with(".img")) {
                continue;
            }
            let size = entry.metadata().map_err(|e| format!("{name}: {e}"))?.len();
            arrivals
                .wait(&format!("images/{name}"), 0, size, &never)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
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

/// The pull's process as the shim follows it.
struct Pull {
    pid: i32,
    exit: tokio::sync::oneshot::Receiver<crate::exits::Exit>,
    lines: tokio::io::Lines<BufReader<pipe::Receiver>>,
    /// Its stderr, read to its end by `stderr_read`.
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_read: tokio::task::JoinHandle<()>,
    /// The write end of the gate the pull publishes after, until the
    /// restore takes it.
    gate: Option<OwnedFd>,
}

impl Pull {
    fn kill(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    /// Its last words, once it exited with `code` (stderr ends with it).
    async fn reason(&mut self, code: i32) -> String {
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.stderr_read).await;
        reason(&self.stderr, code)
    }
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
    let mut pull = spawn(config, exits, reference, name)?;
    let head = tokio::time::timeout(timeout, async {
        while let Ok(Some(line)) = pull.lines.next_line().await {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if let Some(tree) = v["head"].as_str() {
                return Some(PathBuf::from(tree));
            }
        }
        None
    })
    .await;
    let expected = partial_tree(&config.artifact_root, name);
    let tree = match head {
        // Only the tree of this name's partial pull, wherever the line
        // says it is.
        Ok(Some(tree)) if tree == expected => tree,
        Ok(Some(tree)) => {
            pull.kill();
            return Err(format!(
                "the pull named {} as its tree, not {}",
                tree.display(),
                expected.display()
            ));
        }
        Ok(None) => {
            let code = (&mut pull.exit).await.map(|e| e.code).unwrap_or(-1);
            return Ok(Start::Failed(pull.reason(code).await));
        }
        Err(_) => {
            pull.kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), pull.exit).await;
            return Ok(Start::TimedOut);
        }
    };
    let streamed = Streamed {
        reference: reference.to_string(),
        tree,
        failure: Arc::new(Mutex::new(None)),
        hold: Arc::new(pull.gate.take().expect("the gate, once")),
    };
    let left = timeout.saturating_sub(began.elapsed());
    tokio::spawn(follow(pull, streamed.failure.clone(), left, timeout));
    Ok(Start::Head(streamed))
}

/// The pull's process, its gate's read end handed over as descriptor 3.
fn spawn(
    config: &RuntimeConfig,
    exits: &Exits,
    reference: &str,
    name: &str,
) -> Result<Pull, String> {
    let cli = vsnap_cli::locate(config)?;
    let (config_arg, input) = vsnap_cli::config_args(config);
    let (gate_read, gate) =
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
    let stdout = child.stdout.take().map(OwnedFd::from);
    let lines = match stdout.map(pipe::Receiver::from_owned_fd) {
        Some(Ok(r)) => BufReader::new(r).lines(),
        _ => return Err("the pull's stdout".into()),
    };
    tokio::spawn(feed(child.stdin.take().map(OwnedFd::from), input));
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let err = child.stderr.take().map(OwnedFd::from);
    let stderr_read = tokio::spawn(read_shared(err, stderr.clone()));
    Ok(Pull {
        pid,
        exit,
        lines,
        stderr,
        stderr_read,
        gate: Some(gate),
    })
}

/// After the head: the pull's end, as `failure` when it did not publish;
/// killed `left` from now (`timeout` from its start).
async fn follow(mut pull: Pull, failure: Failure, left: Duration, timeout: Duration) {
    // The report line, then the end of stdout.
    while let Ok(Some(_)) = pull.lines.next_line().await {}
    let code = match tokio::time::timeout(left, &mut pull.exit).await {
        Ok(exit) => exit.map(|e| e.code).unwrap_or(-1),
        Err(_) => {
            pull.kill();
            *failure.lock().expect("lock") = Some(format!(
                "not done within pull_timeout_s ({}s): killed",
                timeout.as_secs()
            ));
            return;
        }
    };
    if code != 0 {
        let why = pull.reason(code).await;
        log::warn!("streamed pull failed: {why}");
        *failure.lock().expect("lock") = Some(why);
    }
}

/// Tells the pull whose gate's write end is `gate` to publish nothing
/// once the gate closes (`vsnap_artifact::arrivals::ABANDON`). One byte
/// into a pipe never blocks; a pull already gone is nothing to tell.
pub fn abandon(gate: &OwnedFd) {
    let _ = nix::unistd::write(gate, vsnap_artifact::arrivals::ABANDON);
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

#[cfg(test)]
mod tests {
    use super::*;
    use vsnap_artifact::arrivals::{append, Arrival};

    /// A streamed pull's partial folder with a 3-page pages file and a
    /// control file, nothing arrived yet.
    fn streamed(dir: &Path) -> Streamed {
        let tree = dir.join("tree");
        std::fs::create_dir_all(tree.join("images")).unwrap();
        std::fs::write(tree.join("images/pages-1.img"), vec![0u8; 3 * 4096]).unwrap();
        std::fs::write(tree.join("images/pagemap-1.img"), b"x").unwrap();
        let (_, w) = nix::unistd::pipe().unwrap();
        Streamed {
            reference: "reg/a:1".into(),
            tree,
            failure: Arc::new(Mutex::new(None)),
            hold: Arc::new(w),
        }
    }

    #[test]
    fn a_restore_criu_places_alone_waits_for_every_page_and_fails_with_the_pull() {
        let dir = tempfile::tempdir().unwrap();
        let s = streamed(dir.path());
        let mut record = std::fs::File::create(s.record()).unwrap();
        append(&mut record, &[Arrival::now("images/pages-1.img", 0, 8192)]).unwrap();
        let waiting = {
            let s = s.clone();
            std::thread::spawn(move || s.wait_whole())
        };
        append(
            &mut record,
            &[Arrival::now("images/pages-1.img", 8192, 4096)],
        )
        .unwrap();
        waiting.join().unwrap().expect("every page arrived");

        let dir = tempfile::tempdir().unwrap();
        let s = streamed(dir.path());
        *s.failure.lock().unwrap() = Some("blob sha256:ab: reset".into());
        let e = s.wait_whole().unwrap_err();
        assert!(
            e.contains("pull reg/a:1") && e.ends_with("did not arrive: blob sha256:ab: reset"),
            "{e}"
        );
    }
}
