//! The long-running shim: the task service over ttrpc on the socket `start`
//! bound, until containerd's Shutdown. Also the reaper every invocation
//! that runs runc needs (the server, `delete`).

use std::os::fd::FromRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use containerd_shim::asynchronous::monitor::monitor_notify_by_pid;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::Flags;
use containerd_shim_protos::shim_async::create_task;
use containerd_shim_protos::ttrpc::r#async::transport::Listener;
use containerd_shim_protos::ttrpc::r#async::Server;
use log::{debug, info, warn};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::bootstrap::{LISTENER_ENV, LISTENER_FD, TTRPC_ADDRESS};
use crate::error::{Error, Result};
use crate::events::Events;
use crate::exits::Exits;
use crate::task::TaskService;

/// The listener `start` handed over as fd 3, taken before anything else
/// runs: close-on-exec from here on (runc must not inherit it), and its
/// marker out of the environment runc and CRIU inherit.
pub fn inherited_listener() -> Option<UnixListener> {
    let fd = std::env::var(LISTENER_ENV).ok()?;
    std::env::remove_var(LISTENER_ENV);
    if fd != LISTENER_FD.to_string() {
        return None;
    }
    // SAFETY: `start` put a listening socket at this fd for us alone.
    unsafe {
        libc::fcntl(LISTENER_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        Some(UnixListener::from_raw_fd(LISTENER_FD))
    }
}

/// Makes the shim the subreaper of what it starts (runc's containers).
pub fn set_subreaper() -> Result<()> {
    // SAFETY: a plain prctl on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } < 0 {
        return Err(Error::io(
            "shim: become a subreaper",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Reaps every exited child on SIGCHLD and hands its status to exits.rs
/// (through containerd-shim's monitor). SIGTERM and SIGINT are noted and
/// ignored, as containerd-shim does: containerd stops a shim with Shutdown.
pub fn start_reaper() -> Result<()> {
    let listen = |kind| signal(kind).map_err(|e| Error::io("shim: listen for signals", e));
    let mut children = listen(SignalKind::child())?;
    for kind in [SignalKind::terminate(), SignalKind::interrupt()] {
        let mut s = listen(kind)?;
        tokio::spawn(async move {
            while s.recv().await.is_some() {
                debug!("received signal {}", kind.as_raw_value());
            }
        });
    }
    tokio::spawn(async move {
        while children.recv().await.is_some() {
            reap().await;
        }
    });
    Ok(())
}

async fn reap() {
    loop {
        let (pid, code) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) => (pid, code),
            Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, 128 + sig as i32),
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                warn!("reaper: waitpid: {e}");
                return;
            }
        };
        if let Err(e) = monitor_notify_by_pid(pid.as_raw(), code).await {
            warn!("reaper: exit of {pid}: {e}");
        }
    }
}

/// Serves the task API until Shutdown, then removes the socket.
pub async fn serve(flags: Flags, listener: Option<UnixListener>) -> Result<()> {
    let listener = match listener {
        Some(l) => l,
        None => bind(&flags.socket)?,
    };
    start_reaper()?;
    containerd_shim::logger::init(flags.debug, "info", &flags.namespace, &flags.id)?;
    let ttrpc_address = std::env::var(TTRPC_ADDRESS)
        .map_err(|_| Error::InvalidArgument(format!("shim: {TTRPC_ADDRESS} is not set")))?;
    let exit = Arc::new(ExitSignal::default());
    let task = TaskService::new(
        Events::new(ttrpc_address, &flags.namespace),
        Exits::start().await,
        exit.clone(),
        &flags.namespace,
        &flags.address,
    );
    let listener = Listener::try_from(listener)
        .map_err(|e| Error::io(format!("shim: serve {}", flags.socket), e))?;
    let mut server = Server::new()
        .add_listener(listener)
        .register_service(create_task(Arc::new(task)));
    server
        .start()
        .await
        .map_err(|e| Error::Other(format!("shim: serve {}: {e}", flags.socket)))?;
    // The socket a later start would find dead, as `address` (in the
    // bundle, the working folder) names it: read now, as containerd may
    // remove the bundle while this shim shuts down.
    let address = std::fs::read_to_string("address").ok();
    info!("Shim successfully started, waiting for exit signal...");
    exit.wait().await;
    info!("Shutting down shim instance");
    server.shutdown().await.unwrap_or_default();
    if let Some(address) = address {
        let path = std::path::Path::new(address.trim().trim_start_matches("unix://"));
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(())
}

/// A listener of its own, when the server was started by hand with `-socket`.
fn bind(address: &str) -> Result<UnixListener> {
    if address.is_empty() {
        return Err(Error::InvalidArgument(
            "shim: no socket to serve (-socket)".into(),
        ));
    }
    let path = std::path::Path::new(address.trim_start_matches("unix://"));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("shim: {}", dir.display()), e))?;
    }
    UnixListener::bind(path).map_err(|e| Error::io(format!("shim: listen on {address}"), e))
}
