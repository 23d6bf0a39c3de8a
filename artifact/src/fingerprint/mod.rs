//! What an artifact is valid for: the host it was made on and the workload
//! it captured. At restore both are taken again and compared: the workload
//! field by field, the host by the compatibility rules of [`crate::compat`];
//! every difference that forbids the restore is named with its captured and
//! live value (or digest).

mod diff;
mod host;
mod secrets;
#[cfg(test)]
mod testing;
mod workload;

pub use host::{HostIdentity, Tools};
pub use secrets::{env_fingerprint, redact_argv};
pub use workload::{per_pod, Workload};
