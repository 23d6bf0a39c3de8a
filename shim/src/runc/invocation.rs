//! One runc command line as a verb builds it: its arguments, flags and
//! CRIU options, what goes to its stdin, the container's stdio, a deadline.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::deadline::Deadline;

/// The descriptors a container process gets as its stdio when runc passes
/// its own through (no terminal).
pub struct ChildStdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

impl ChildStdio {
    /// The same pipes again (each descriptor duplicated).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(ChildStdio {
            stdin: self.stdin.try_clone()?,
            stdout: self.stdout.try_clone()?,
            stderr: self.stderr.try_clone()?,
        })
    }
}

/// Flags of `runc checkpoint` that a caller chooses.
#[derive(Default, Debug, Clone)]
pub struct CheckpointFlags {
    pub leave_running: bool,
    pub tcp_established: bool,
    pub ext_unix_sk: bool,
    pub file_locks: bool,
    pub shell_job: bool,
    pub manage_cgroups_mode: Option<String>,
}

/// One runc command: its verb, arguments, input and stdio.
pub(super) struct Invocation<'a> {
    /// What the invocation is for, in its errors ("create", "pids").
    pub(super) phase: &'a str,
    pub(super) verb: &'static str,
    pub(super) args: Vec<OsString>,
    pub(super) input: Option<Vec<u8>>,
    pub(super) stdio: Option<ChildStdio>,
    /// Past it, runc and everything under it (CRIU, a partly restored
    /// tree) are killed and the invocation fails.
    pub(super) deadline: Option<&'a Deadline>,
}

impl<'a> Invocation<'a> {
    pub(super) fn new(phase: &'a str, verb: &'static str) -> Self {
        Self {
            phase,
            verb,
            args: vec![verb.into()],
            input: None,
            stdio: None,
            deadline: None,
        }
    }

    pub(super) fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    pub(super) fn arg_if(self, cond: bool, a: &str) -> Self {
        if cond {
            self.arg(a)
        } else {
            self
        }
    }

    /// The CRIU options checkpoint and restore share.
    pub(super) fn criu_flags(self, flags: &CheckpointFlags) -> Self {
        let inv = self
            .arg_if(flags.tcp_established, "--tcp-established")
            .arg_if(flags.ext_unix_sk, "--ext-unix-sk")
            .arg_if(flags.file_locks, "--file-locks")
            .arg_if(flags.shell_job, "--shell-job");
        match &flags.manage_cgroups_mode {
            Some(mode) => inv.arg("--manage-cgroups-mode").arg(mode),
            None => inv,
        }
    }

    pub(super) fn opt(self, flag: &str, value: Option<&Path>) -> Self {
        match value {
            Some(v) => self.arg(flag).arg(v),
            None => self,
        }
    }
}
