//! Snapshots: a container annotated for `create` is cold-started, captured
//! with runc + CRIU once its engine is capture-ready, and published as an
//! artifact; a container annotated for `restore` is restored from one and
//! becomes visible only after its engine validated its canary and listens.
//! What a container gets is prepared at create as a plan (plan/).

pub mod argparse;
pub mod barrier;
pub mod canary;
pub mod criu;
pub mod criu_image;
pub mod cuda;
pub mod fetch;
pub mod fsnotify;
pub mod inventory;
pub mod journal;
pub mod listener;
pub mod memory;
pub mod pages;
pub mod plan;
pub mod proc_fds;
pub mod profile;
pub mod records;
pub mod restore;
pub mod restore_oom;
pub mod rootfs;
pub mod shm;
pub mod sock_diag;
pub mod spec;
pub mod tcp_table;
pub mod tenant;
pub mod vllm_command;

pub use vsnap_protocol::{CONTROL_MOUNT, SNAPSHOT_CONFIG_ENV};

/// Threads hashing an artifact's files (capture and restore): this is
/// what a 2-core machine has (BLAKE3 runs near 3.3 GB/s on one of them).
pub const DIGEST_THREADS: usize = 2;

use std::path::Path;

use vsnap_artifact::ArtifactError;

use crate::error::Error;

/// An artifact error as the shim reports it, with its phase.
pub fn artifact_error(phase: &str, e: ArtifactError) -> Error {
    match e {
        ArtifactError::NotFound(_) => Error::NotFound(format!("{phase}: {e}")),
        ArtifactError::Io { context, source } => Error::io(format!("{phase}: {context}"), source),
        e => Error::FailedPrecondition(format!("{phase}: {e}")),
    }
}

pub(crate) fn remove_control_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}
