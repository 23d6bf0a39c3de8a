//! containerd with its CRI plugin on, driven as kubelet drives it: a CRI
//! client over the instance's unix socket (no crictl).
//!
//! The instance has its own root, state and socket, NRI off, CNI from
//! Debian's `containernetworking-plugins` (a `ptp` network whose IPAM data
//! stays in the instance's folder), a pause image built here from
//! `tests/pause/pause.c` and pinned as the sandbox image, and three handlers:
//! `runc` (containerd's runc shim), `vsnap` (`io.vsnap.v1`, as in
//! `config/examples/containerd-runtime.toml`) and `vsnap-features` (typed
//! `io.containerd.runc.v2` with `runtime_path` at the vsnap shim, so CRI
//! introspects its features).

mod client;
mod env;
mod request;

pub use client::Cri;
pub use env::CriEnv;
pub use request::{
    annotations, container_config, envs, BUSYBOX_IMAGE, ENGINE_IMAGE, NAMESPACE, PAUSE_IMAGE, RUNC,
    VSNAP, VSNAP_FEATURES,
};
