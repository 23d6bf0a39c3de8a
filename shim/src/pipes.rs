//! A helper program's standard streams as the shim runs it (runc, the
//! vsnap CLI, a streamed pull): its input written whole, its output read
//! to the end. A stream that cannot be had, or that fails, ends the
//! writing or reading quietly: the program's exit status says what went
//! wrong.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

/// `input` written to `fd` (a child's stdin), which is then closed.
pub async fn feed(fd: Option<OwnedFd>, input: Vec<u8>) {
    if let Some(Ok(mut w)) = fd.map(pipe::Sender::from_owned_fd) {
        let _ = w.write_all(&input).await;
    }
}

/// Everything read from `fd` (a child's stdout or stderr) until its end.
pub async fn read_all(fd: Option<OwnedFd>, buf: &mut Vec<u8>) {
    if let Some(Ok(mut r)) = fd.map(pipe::Receiver::from_owned_fd) {
        let _ = r.read_to_end(buf).await;
    }
}

/// As [`read_all`], into a buffer others read while the child runs.
pub async fn read_shared(fd: Option<OwnedFd>, into: Arc<Mutex<Vec<u8>>>) {
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
