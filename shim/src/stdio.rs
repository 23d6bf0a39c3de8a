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

/// Makes the pipes for a process without a terminal and starts the copies.
/// The returned descriptors are the process's ends, to hand to runc.
pub fn pipes(stdio: &Stdio, io: &IoTasks) -> Result<ChildStdio> {
    let stdin = if stdio.stdin.is_empty() {
        dev_null()?
    } else {
        let (r, w) = std::io::pipe().map_err(|e| Error::io("stdio: stdin pipe", e))?;
        let w = pipe::Sender::from_owned_fd(OwnedFd::from(w))
            .map_err(|e| Error::io("stdio: stdin pipe", e))?;
        io.copy_from_fifo(&stdio.stdin, w)?;
        OwnedFd::from(r)
    };
    let stdout = output(&stdio.stdout, io)?;
    let stderr = output(&stdio.stderr, io)?;
    Ok(ChildStdio {
        stdin,
        stdout,
        stderr,
    })
}

fn output(fifo: &str, io: &IoTasks) -> Result<OwnedFd> {
    if fifo.is_empty() {
        return dev_null();
    }
    let (r, w) = std::io::pipe().map_err(|e| Error::io(format!("stdio: pipe for {fifo}"), e))?;
    let r = pipe::Receiver::from_owned_fd(OwnedFd::from(r))
        .map_err(|e| Error::io(format!("stdio: pipe for {fifo}"), e))?;
    io.copy_to_fifo(r, fifo)?;
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
