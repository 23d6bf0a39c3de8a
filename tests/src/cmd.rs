//! Running commands with a deadline, capturing what they print.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct CmdOutput {
    /// The exit code, or 128+N for a signal death, or None on timeout.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `cmd` with `input` on stdin; kills it after `timeout`.
pub fn run(mut cmd: Command, input: Option<&[u8]>, timeout: Duration) -> CmdOutput {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    if let Some(input) = input {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input).unwrap();
    }
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let code = wait_deadline(&mut child, timeout);
    CmdOutput {
        code,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

/// Waits for `child` until `timeout`, then kills it (by its pid) and returns None.
pub fn wait_deadline(child: &mut Child, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            use std::os::unix::process::ExitStatusExt;
            return status.code().or(status.signal().map(|s| 128 + s));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The installed binary `name`: the first folder of PATH (then the sbin
/// folders) that has it.
pub fn which(name: &str) -> std::path::PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"])
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("{name} is not installed (scripts/setup.sh installs it)"))
}
