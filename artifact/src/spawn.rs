//! Running a short-lived tool (a `--version` probe, nvidia-smi,
//! cuda-checkpoint) with a timeout, its output captured, without taking an
//! exit status that belongs to the shim's reaper.
//!
//! The shim is a subreaper whose reaper waits for any child
//! (`waitpid(-1)`), so it may collect the tool's exit before this waits for
//! it: `waitpid` on the tool then fails with `ECHILD`. That is no error
//! here: the tool has exited, its status is lost ([`Ran::status`] is
//! `None`) and its output tells how it went ([`Ran::failure`]). Only the
//! tool's own pid is ever waited for (never `-1`), and never again once its
//! exit is known, so no other child's status is taken. Outside the shim
//! (the OCI hooks, the CLI) nothing else reaps and the status is always
//! there.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The most of each of stdout and stderr that is kept.
pub const OUTPUT_LIMIT: u64 = 1 << 20;

/// How often a running tool is looked at.
const POLL: Duration = Duration::from_millis(20);

/// What a tool printed, and its status unless the shim's reaper took it.
#[derive(Debug)]
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Why a tool did not run to its end.
#[derive(Debug)]
pub enum RunError {
    /// It could not be started.
    Spawn(std::io::Error),
    /// Waiting for it failed (other than `ECHILD`); it was killed.
    Wait(std::io::Error),
    /// It was still running at the timeout; it was killed.
    Timeout,
}

impl Ran {
    /// `(status, last line of its output)` when it failed. With the status
    /// lost (reaped by the shim), output on stderr or none at all counts as
    /// a failure.
    pub fn failure(&self) -> Option<(String, String)> {
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

/// Runs `cmd` with stdin from /dev/null and stdout and stderr captured
/// (up to [`OUTPUT_LIMIT`] each); killed past `timeout`.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Ran, RunError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = spawn_retrying(cmd).map_err(RunError::Spawn)?;
    collect(child, timeout)
}

/// Reads `child`'s output and waits for it, at most `timeout`.
fn collect(mut child: Child, timeout: Duration) -> Result<Ran, RunError> {
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
                let _ = s.take(OUTPUT_LIMIT).read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Timeout);
            }
            // The shim's reaper (waitpid(-1)) collected it first: it has
            // exited, its status is lost, its output tells.
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => break None,
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Wait(source));
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
fn spawn_retrying(cmd: &mut Command) -> std::io::Result<Child> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::path::Path;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn a_tool_that_finishes_gives_its_status_and_output() {
        let ran = run(
            &mut sh("echo out; echo err >&2; exit 3"),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(ran.status.and_then(|s| s.code()), Some(3));
        assert_eq!(
            (ran.stdout.as_str(), ran.stderr.as_str()),
            ("out\n", "err\n")
        );
        assert_eq!(
            ran.failure(),
            Some(("exit status: 3".to_string(), "err".to_string()))
        );
        let ok = run(&mut sh("echo fine"), Duration::from_secs(30)).unwrap();
        assert!(ok.status.is_some_and(|s| s.success()));
        assert_eq!(ok.failure(), None);
    }

    #[test]
    fn output_past_a_pipes_buffer_does_not_block_the_tool() {
        let ran = run(
            &mut sh("head -c 300000 /dev/zero; head -c 200000 /dev/zero >&2"),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!((ran.stdout.len(), ran.stderr.len()), (300_000, 200_000));
        assert!(ran.status.is_some_and(|s| s.success()));
    }

    #[test]
    fn a_tool_past_its_timeout_is_killed_and_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
        let started = Instant::now();
        let e = run(&mut sh(&script), Duration::from_secs(2)).unwrap_err();
        assert!(matches!(e, RunError::Timeout), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(30));
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        // Killed and collected: not even a zombie is left.
        assert!(
            !Path::new(&format!("/proc/{}", pid.trim())).exists(),
            "{pid} still there"
        );
    }

    #[test]
    fn a_tool_that_cannot_start_is_a_spawn_error() {
        let e = run(
            &mut Command::new("/nonexistent/vsnap-no-such-tool"),
            Duration::from_secs(30),
        )
        .unwrap_err();
        assert!(
            matches!(&e, RunError::Spawn(e) if e.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
    }

    /// The reaper's part played by this test: the child's status collected
    /// with `waitpid` on its pid before the helper waits, as the shim's
    /// `waitpid(-1)` would.
    #[test]
    fn a_tool_whose_status_the_reaper_took_is_judged_by_its_output() {
        let mut cmd = sh("echo 4242");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let mut status = 0;
        // SAFETY: waits for this test's own child.
        let reaped = unsafe { libc::waitpid(child.id() as i32, &mut status, 0) };
        assert_eq!(reaped, child.id() as i32);
        assert_eq!(ExitStatus::from_raw(status).code(), Some(0));
        let ran = collect(child, Duration::from_secs(30)).unwrap();
        assert!(ran.status.is_none(), "{ran:?}");
        assert_eq!(ran.stdout, "4242\n");
        assert_eq!(ran.failure(), None);
    }

    #[test]
    fn with_the_status_lost_stderr_or_silence_is_a_failure() {
        let lost = |stdout: &str, stderr: &str| Ran {
            status: None,
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
        };
        let reaped = "unknown (reaped by the shim)".to_string();
        assert_eq!(lost("42\n", "").failure(), None);
        assert_eq!(
            lost("", "").failure(),
            Some((reaped.clone(), "no output".to_string()))
        );
        assert_eq!(
            lost("42\n", "warning\nbroken\n").failure(),
            Some((reaped, "broken".to_string()))
        );
    }
}
