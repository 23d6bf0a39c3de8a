//! vsnap's snapshot artifacts, shared by the shim (which makes and restores
//! them), the OCI hooks and the operator CLI.
//!
//! An artifact is `<root>/<name>/` (0700, root-owned, no symlink on the path):
//! `images/` (CRIU), `control/` (the control-dir files at capture time),
//! `work/` (CRIU logs) and `manifest.json` (0600, written last, MAC'd with a
//! host-local key, holding a content digest of every file a restore reads). It is built in a staging folder and published atomically.

pub mod arrivals;
pub mod at_rest;
pub mod clocks;
pub mod compat;
pub mod content;
pub mod cpu;
pub mod criu_logs;
pub mod criu_options;
mod durable;
pub mod encryption;
mod error;
pub mod fingerprint;
pub mod gpu;
pub mod journal;
pub mod key;
pub mod layout;
pub mod lock;
pub mod manifest;
pub mod memory;
pub mod name;
pub mod quarantine;
pub mod rootfs;
pub mod signature;
pub mod spawn;
pub mod tenant;
pub mod tool_cache;

pub use clocks::Clocks;
pub use content::{Contents, FileDigest};
pub use criu_options::CriuOptions;
pub use error::{ArtifactError, Result};
pub use fingerprint::{per_pod, HostIdentity, Tools, Workload};
pub use gpu::Gpu;
pub use key::{FingerprintKey, HostKey};
pub use layout::{check_path_safe, ensure_root, path, Staging};
pub use lock::ArtifactLock;
pub use manifest::{Manifest, Origin, Timings, READABLE_SCHEMA_VERSIONS, SCHEMA_VERSION};
pub use memory::{Memory, ZeroPages};
pub use name::{ArtifactName, BadName};
pub use signature::{FleetSignature, FleetSigner, TrustedKeys};
pub use tenant::Tenant;
