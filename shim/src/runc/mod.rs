//! The runc CLI, driven the way containerd's runc shim drives it.
//!
//! Every invocation is spawned under an exit `Mark` and awaited through
//! `Exits`, never with `waitpid` on the child, because the shim's reaper owns
//! all exit statuses. Failures carry runc's own last error line from its JSON
//! log, which says far more than an exit code.
//!
//! - `invocation`: one command line as a verb builds it, and its flags;
//! - `tools`: CRIU and cuda-checkpoint as runc and CRIU find them;
//! - `run`: running an invocation under the reaper, a deadline, a cancel;
//! - `failure`: what a failed invocation says;
//! - `verbs`: create, start, exec, kill, delete, ps, checkpoint, restore...;
//! - `kill_tree`: a process tree stopped, then killed.

mod failure;
mod invocation;
mod kill_tree;
mod native;
mod run;
mod tools;
mod verbs;

pub use invocation::{CheckpointFlags, ChildStdio};
pub use kill_tree::kill_tree;
pub use run::Runc;
pub use tools::CriuTools;
pub use verbs::{RestoreFiles, RuncVerbs};
