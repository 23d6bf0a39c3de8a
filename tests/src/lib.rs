//! The test harness: a private containerd instance (its own root, state,
//! socket and runc root) with the vsnap shim on its PATH, `ctr` against it,
//! and root filesystems / OCI images built from busybox. The containerd
//! config and the root filesystems are `scripts/lib.sh`'s ([`lib_sh`]).
//!
//! Nothing here mocks containerd, runc or CRIU: `scripts/setup.sh` installs
//! them and the tests drive them for real.

pub mod bench;
pub mod cmd;
pub mod containerd;
pub mod cri;
pub mod disk;
pub mod docker;
pub mod engine;
pub mod events;
pub mod ids;
pub mod image;
pub mod lib_sh;
pub mod pod_net;
pub mod prometheus;
pub mod registry;
pub mod smaps;
pub mod snapshot_env;
pub mod vllm;

pub use cmd::{run, CmdOutput};
pub use containerd::Containerd;
