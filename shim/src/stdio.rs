//! A container process's stdio: real pipes the shim copies to and from
//! containerd's FIFOs, or a terminal received through a console socket.
//!
//! The pipes are what make a container restorable: runc can re-wire stdio at
//! restore only when it was `pipe:[N]` at checkpoint time.

use std::fs::File;
use std::os::fd::OwnedFd;

use containerd_shim::asynchronous::io::{IoTasks, Pty, Stdio};
use tokio::net::unix::pipe;

use crate::error::{Error, Result};
use crate::runc::ChildStdio;

/// Copies into log files (`file://` URIs), which IoTasks (FIFOs only) does
/// not cover; shut down with the process's other copies.
#[derive(Default)]
pub struct FileCopies(Vec<tokio::task::JoinHandle<()>>);

impl FileCopies {
    /// Waits for the copies to drain, at most `IO_DRAIN`, then stops them.
    pub async fn shutdown(&mut self) {
        for handle in self.0.drain(..) {
            let abort = handle.abort_handle();
            if tokio::time::timeout(IO_DRAIN, handle).await.is_err() {
                abort.abort();
            }
        }
    }
}

const IO_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Makes the pipes for a process without a terminal and starts the copies.
/// The returned descriptors are the process's ends, to hand to runc.
pub fn pipes(stdio: &Stdio, io: &IoTasks, files: &mut FileCopies) -> Result<ChildStdio> {
    let stdin = if stdio.stdin.is_empty() {
        dev_null()?
    } else {
        let (r, w) = std::io::pipe().map_err(|e| Error::io("stdio: stdin pipe", e))?;
        let w = pipe::Sender::from_owned_fd(OwnedFd::from(w))
            .map_err(|e| Error::io("stdio: stdin pipe", e))?;
        io.copy_from_fifo(&stdio.stdin, w)?;
        OwnedFd::from(r)
    };
    let stdout = output(&stdio.stdout, io, files)?;
    let stderr = output(&stdio.stderr, io, files)?;
    Ok(ChildStdio {
        stdin,
        stdout,
        stderr,
    })
}

fn output(fifo: &str, io: &IoTasks, files: &mut FileCopies) -> Result<OwnedFd> {
    if fifo.is_empty() {
        return dev_null();
    }
    if let Some(rest) = fifo.strip_prefix("binary://") {
        return Err(Error::InvalidArgument(format!(
            "stdio: binary:// log URIs are not supported (binary://{rest}); use file:// or FIFOs"
        )));
    }
    if let Some(path) = fifo.strip_prefix("file://") {
        return log_file(path, files);
    }
    let (r, w) = std::io::pipe().map_err(|e| Error::io(format!("stdio: pipe for {fifo}"), e))?;
    let r = pipe::Receiver::from_owned_fd(OwnedFd::from(r))
        .map_err(|e| Error::io(format!("stdio: pipe for {fifo}"), e))?;
    io.copy_to_fifo(r, fifo)?;
    Ok(OwnedFd::from(w))
}

/// `ctr run --log-uri file:///x.log`: the output is appended to a file.
fn log_file(path: &str, files: &mut FileCopies) -> Result<OwnedFd> {
    let path = path.split('?').next().unwrap_or(path);
    if !path.starts_with('/') {
        return Err(Error::InvalidArgument(format!(
            "stdio: file:// log URI {path:?} must be an absolute path"
        )));
    }
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("stdio: create {}", dir.display()), e))?;
    }
    let file = File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(format!("stdio: open log file {path}"), e))?;
    let (r, w) = std::io::pipe().map_err(|e| Error::io(format!("stdio: pipe for {path}"), e))?;
    let mut r = pipe::Receiver::from_owned_fd(OwnedFd::from(r))
        .map_err(|e| Error::io(format!("stdio: pipe for {path}"), e))?;
    let mut file = tokio::fs::File::from_std(file);
    files.0.push(tokio::spawn(async move {
        if let Err(e) = tokio::io::copy(&mut r, &mut file).await {
            log::warn!("copy to log file: {e}");
        }
    }));
    Ok(OwnedFd::from(w))
}

fn dev_null() -> Result<OwnedFd> {
    File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| Error::io("stdio: open /dev/null", e))
}

/// Starts the copies for a terminal's master end.
pub fn terminal(stdio: &Stdio, io: &IoTasks, master: File) -> Result<Pty> {
    let pty = Pty::new(master)?;
    if !stdio.stdin.is_empty() {
        io.copy_from_fifo(&stdio.stdin, pty.clone())?;
    }
    if !stdio.stdout.is_empty() {
        io.copy_to_fifo(pty.clone(), &stdio.stdout)?;
    }
    Ok(pty)
}
