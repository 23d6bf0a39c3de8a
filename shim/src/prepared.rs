//! A process's stdio made ready for runc (create, exec, restore): the
//! pipes it gets, or the console socket through which runc hands over its
//! terminal; after runc ran, the terminal taken or the stdio undone.

use std::path::PathBuf;

use crate::console::ConsoleSocket;
use crate::error::{Error, Result};
use crate::process::Process;
use crate::runc::ChildStdio;
use crate::stdio;

/// A process's stdio made ready for runc: the pipes it gets, or the console
/// socket through which runc will hand over its terminal.
pub struct Prepared {
    pub console_path: Option<PathBuf>,
    pub receive: Option<Receive>,
    pub child_stdio: Option<ChildStdio>,
}

pub struct Receive {
    path: PathBuf,
    task: tokio::task::JoinHandle<Result<std::fs::File>>,
}

impl Prepared {
    pub fn new(p: &mut Process) -> Result<Self> {
        if p.stdio.terminal {
            let console = ConsoleSocket::new()?;
            let path = console.path().to_path_buf();
            Ok(Self {
                console_path: Some(path.clone()),
                receive: Some(Receive {
                    path,
                    task: tokio::spawn(console.receive()),
                }),
                child_stdio: None,
            })
        } else {
            Ok(Self {
                console_path: None,
                receive: None,
                child_stdio: Some(stdio::pipes(&p.stdio, &p.io, &mut p.files)?),
            })
        }
    }

    /// After runc ran: take the terminal, or undo the stdio on failure.
    pub async fn finish(receive: Option<Receive>, ran: Result<()>, p: &mut Process) -> Result<()> {
        if let Err(e) = ran {
            if let Some(r) = receive {
                ConsoleSocket::cancel(&r.path);
                r.task.abort();
            }
            p.io.abort().await;
            return Err(e);
        }
        if let Some(r) = receive {
            let master = r
                .task
                .await
                .map_err(|e| Error::Other(format!("console: {e}")))??;
            p.pty = Some(stdio::terminal(&p.stdio, &p.io, master)?);
        }
        Ok(())
    }
}
