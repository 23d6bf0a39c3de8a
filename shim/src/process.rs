//! One process of a container (its init or an exec): status, stdio, exit.

use containerd_shim::asynchronous::io::{IoTasks, Pty, Stdio};
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::exits::Exit;
pub use crate::init_state::{Status, Transition};
use crate::stdio::FileCopies;

pub struct Process {
    /// The exec id; empty for the init process.
    pub exec_id: String,
    pub pid: i32,
    /// Written only through [`Process::transition`] (lifecycle/state.rs).
    status: Status,
    pub stdio: Stdio,
    pub io: IoTasks,
    pub files: FileCopies,
    pub pty: Option<Pty>,
    exit: watch::Sender<Option<Exit>>,
}

impl Process {
    pub fn new(exec_id: &str, stdio: Stdio) -> Self {
        Self {
            exec_id: exec_id.to_string(),
            pid: 0,
            status: Status::Created,
            stdio,
            io: IoTasks::default(),
            files: FileCopies::default(),
            pty: None,
            exit: watch::channel(None).0,
        }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// Moves the status by `via`; an illegal move is refused and changes
    /// nothing. `what` names the operation in the error.
    pub fn transition(&mut self, what: &str, via: Transition) -> Result<()> {
        self.status = self.status.next(via).map_err(|e| {
            Error::FailedPrecondition(format!("{what}: process {}: {e}", self.display_id()))
        })?;
        Ok(())
    }

    pub fn exit(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Records the exit; returns false when it was already recorded.
    pub fn set_exited(&mut self, exit: Exit) -> bool {
        if self.exit().is_some() {
            return false;
        }
        // Every state but Stopped may exit, and Stopped has its exit.
        self.status = self
            .status
            .next(Transition::Exit)
            .unwrap_or(Status::Stopped);
        self.exit.send_replace(Some(exit));
        true
    }

    /// Drains and stops every stdio copy of the process.
    pub async fn shutdown_io(&mut self) {
        self.io.shutdown().await;
        self.files.shutdown().await;
    }

    /// A receiver that sees the exit once it is recorded.
    pub fn exit_watch(&self) -> watch::Receiver<Option<Exit>> {
        self.exit.subscribe()
    }

    pub fn exit_status(&self) -> (u32, Option<OffsetDateTime>) {
        match self.exit() {
            Some(e) => (e.code as u32, Some(e.at)),
            None => (0, None),
        }
    }

    pub fn ensure_running(&self, what: &str) -> Result<()> {
        match self.status {
            Status::Stopped => Err(Error::NotFound(format!(
                "{what}: process {} already finished",
                self.display_id()
            ))),
            Status::Created | Status::Restoring if self.pid == 0 => Err(Error::FailedPrecondition(
                format!("{what}: process {} is not started", self.display_id()),
            )),
            _ => Ok(()),
        }
    }

    pub fn display_id(&self) -> &str {
        if self.exec_id.is_empty() {
            "init"
        } else {
            &self.exec_id
        }
    }
}

/// Waits until the process behind `rx` has exited.
pub async fn wait_exit(mut rx: watch::Receiver<Option<Exit>>) -> Exit {
    loop {
        if let Some(exit) = *rx.borrow_and_update() {
            return exit;
        }
        if rx.changed().await.is_err() {
            // The process was deleted; its last value is final.
            if let Some(exit) = *rx.borrow() {
                return exit;
            }
            std::future::pending::<()>().await;
        }
    }
}
