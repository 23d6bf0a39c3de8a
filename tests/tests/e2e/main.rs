//! Every end-to-end test in one binary (one link of tonic, k8s-cri and the
//! harness instead of one per file), a module per concern. Each test runs
//! its own private containerd, so they share nothing but the machine.

mod bad_input;
mod barrier;
mod checkpoint;
mod clocks;
mod concurrent_restores;
mod containerd_restart;
mod cri;
mod cri_pods;
mod cri_tenants;
mod docker;
mod events;
mod fleet;
mod gpu_path;
mod hooks;
mod huge_pages;
mod labels;
mod lifecycle;
mod lifecycle_faults;
mod masks;
mod memory;
mod metrics;
mod no_leaks;
mod node_changes;
mod own_netns;
mod refusals;
mod rootfs_carry;
mod snapshot;
mod snapshot_faults;
mod stats_oom;
mod tcp_families;
mod vllm;
mod zero_pages;
