//! The console socket through which runc hands over a terminal's master end.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::pty::Winsize;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use crate::error::{Error, Result};

static SOCKETS: AtomicU64 = AtomicU64::new(0);

/// How long runc may take between starting and sending the terminal.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// A listening socket in a private folder, removed with the value.
pub struct ConsoleSocket {
    dir: PathBuf,
    path: PathBuf,
    listener: Option<UnixListener>,
}

impl ConsoleSocket {
    pub fn new() -> Result<Self> {
        // Socket paths are limited to 108 bytes: stay short, under the temp dir.
        let n = SOCKETS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("vsnap-pty-{}-{}", std::process::id(), n));
        std::fs::create_dir(&dir)
            .map_err(|e| Error::io(format!("console: create {}", dir.display()), e))?;
        let path = dir.join("s");
        let listener = UnixListener::bind(&path)
            .map_err(|e| Error::io(format!("console: bind {}", path.display()), e))?;
        Ok(Self {
            dir,
            path,
            listener: Some(listener),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for runc to connect and send the terminal master.
    pub async fn receive(mut self) -> Result<File> {
        let listener = self.listener.take().expect("receive is called once");
        let task = tokio::task::spawn_blocking(move || -> Result<File> {
            let (stream, _) = listener
                .accept()
                .map_err(|e| Error::io("console: accept", e))?;
            let mut buf = [0u8; 4096];
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let msg = recvmsg::<()>(
                std::os::fd::AsRawFd::as_raw_fd(&stream),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| Error::io("console: receive", e.into()))?;
            for c in msg
                .cmsgs()
                .map_err(|e| Error::io("console: control message", e.into()))?
            {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    if let Some(fd) = fds.first() {
                        // SAFETY: SCM_RIGHTS just gave this process a new descriptor.
                        return Ok(File::from(unsafe { OwnedFd::from_raw_fd(*fd) }));
                    }
                }
            }
            Err(Error::Other(
                "console: runc sent no terminal descriptor".into(),
            ))
        });
        match tokio::time::timeout(RECEIVE_TIMEOUT, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(Error::Other(format!("console: {e}"))),
            Err(_) => Err(Error::Other(format!(
                "console: runc sent no terminal within {RECEIVE_TIMEOUT:?}"
            ))),
        }
    }

    /// Unblocks a pending `receive` when runc failed before connecting.
    pub fn cancel(path: &Path) {
        let _ = std::os::unix::net::UnixStream::connect(path);
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

nix::ioctl_write_ptr_bad!(set_window_size, libc::TIOCSWINSZ, Winsize);

/// Sets a terminal's window size.
pub fn resize(pty: &impl std::os::fd::AsFd, width: u32, height: u32) -> Result<()> {
    let ws = Winsize {
        ws_row: height as u16,
        ws_col: width as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer passed, which
    // points at `ws` for the call.
    unsafe { set_window_size(pty.as_fd().as_raw_fd(), &ws) }
        .map_err(|e| Error::io("resize pty", e.into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    nix::ioctl_read_bad!(window_size, libc::TIOCGWINSZ, Winsize);

    #[test]
    fn a_resized_terminal_reports_its_new_size() {
        let pty = nix::pty::openpty(None, None).unwrap();
        resize(&pty.master, 132, 43).unwrap();
        let mut ws = Winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes a winsize to the pointer passed.
        unsafe { window_size(pty.slave.as_raw_fd(), &mut ws) }.unwrap();
        assert_eq!((ws.ws_col, ws.ws_row), (132, 43));
        let file = File::open("/dev/null").unwrap();
        let e = resize(&file, 1, 1).unwrap_err();
        assert!(e.to_string().contains("resize pty"), "{e}");
    }
}
