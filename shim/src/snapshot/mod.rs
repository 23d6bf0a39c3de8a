//! Snapshots: a container annotated for `create` is cold-started, captured
//! with runc + CRIU once its engine is capture-ready, and published as an
//! artifact; a container annotated for `restore` is restored from one and
//! becomes visible only after its engine validated its canary and listens.
//!
//! A facade over rooms by concern, each with one job:
//! - `plan/`: the annotations, the engine read from the spec, the choice
//!   between a capture and a restore, the prepared plans, the restore
//!   preflight and the bundle's edits;
//! - `engine_argv/`: the engine's command line as the engine reads it
//!   (argparse, vLLM's serve arguments and environment) and its profile;
//! - `criu/`: CRIU's options and config, its images, the page server that
//!   places a restore's memory, memory limits and out-of-memory;
//! - `gpu/`: NVIDIA devices, the CUDA preflight, cuda-checkpoint;
//! - `inventory/`: what a capture checks of the process tree (sockets,
//!   inotify and fanotify watches, open descriptors);
//! - `activation/`: waking a copy (control dir or barrier), its canary,
//!   its listener;
//! - `rootfs/`: the writable layer and /dev/shm a capture carries;
//! - `registry/`: an artifact pulled from or pushed to a registry;
//! - `records/`: what outlives the task: the metrics journal, a restore's
//!   timings, a failure's record, CRIU's log.

pub mod activation;
pub mod criu;
pub mod engine_argv;
pub mod gpu;
pub mod inventory;
pub mod plan;
pub mod records;
pub mod registry;
pub mod rootfs;

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
        ArtifactError::Damaged(_) => Error::Damaged(format!("{phase}: {e}")),
        e => Error::FailedPrecondition(format!("{phase}: {e}")),
    }
}

pub(crate) fn remove_control_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}
