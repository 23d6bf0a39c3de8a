//! Running a CUDA tool (nvidia-smi, cuda-checkpoint): its output captured,
//! killed past a timeout, its status possibly taken by the shim's reaper.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a tool printed, and its status unless the shim's reaper took it.
pub(super) struct Ran {
    pub(super) status: Option<std::process::ExitStatus>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

pub(super) enum ToolError {
    Spawn(std::io::Error),
    Wait(std::io::Error),
    Timeout,
}

impl Ran {
    /// `(status, last line of its output)` when it failed. With the status
    /// lost (reaped by the shim), output on stderr or none at all counts as
    /// a failure.
    pub(super) fn failure(&self) -> Option<(String, String)> {
        let status = match self.status {
            Some(status) => (!status.success()).then(|| status.to_string()),
            None => (self.stdout.trim().is_empty() || !self.stderr.trim().is_empty())
                .then(|| "unknown (reaped by the shim)".to_string()),
        }?;
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let output = text
            .trim()
            .lines()
            .last()
            .unwrap_or("no output")
            .to_string();
        Some((status, output))
    }
}

/// Runs `path args` with its output captured, killed past `timeout`.
pub(super) fn run_tool(path: &Path, args: &[&str], timeout: Duration) -> Result<Ran, ToolError> {
    let mut child = spawn_retrying(
        Command::new(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .map_err(ToolError::Spawn)?;
    // Readers on threads, so a chatty child never blocks on a full pipe.
    let readers = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .map(|stream| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(s) = stream {
                let _ = s.take(1 << 20).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::Timeout);
            }
            // The shim's reaper (waitpid(-1)) collected it first: it has
            // exited, its status is lost, its output tells.
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => break None,
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::Wait(source));
            }
        }
    };
    let [stdout, stderr] = readers.map(|r| r.join().unwrap_or_default());
    Ok(Ran {
        status,
        stdout,
        stderr,
    })
}

/// Spawns, retrying briefly on ETXTBSY (an executable just written by this
/// process may still be open for writing in a child forked meanwhile).
fn spawn_retrying(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}
