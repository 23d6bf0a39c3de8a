//! CUDA preflight and GPU inventory for snapshot plans on GPU hosts.
//!
//! A container that uses an NVIDIA GPU can only be captured and restored
//! when CRIU has its CUDA plugin, NVIDIA's `cuda-checkpoint` utility is there
//! for the plugin to call, and the driver is new enough. This module checks
//! those conditions and says exactly which one is missing, before CRIU runs
//! and fails with a less helpful message deep in a dump log.
//!
//! It also answers three questions about a container:
//! * does its OCI spec give it NVIDIA devices ([`spec_nvidia_devices`]),
//!   and which GPUs are they ([`container_gpus`]);
//! * which of its processes hold NVIDIA device files open ([`cuda_holders`]);
//! * do they, together, use more than one GPU ([`check_single_gpu`]), which
//!   vsnap refuses (multi-process NCCL cannot be checkpointed).
//!
//! Driver requirements (NVIDIA's cuda-checkpoint): a driver of major version
//! [`MIN_DRIVER_SINGLE_PROCESS`](driver_version::MIN_DRIVER_SINGLE_PROCESS) (555) or
//! newer checkpoints one CUDA process; a tree of several CUDA processes (an
//! engine with worker processes) needs [`MIN_DRIVER_PROCESS_TREE`] (570). The
//! caller picks the minimum.
//!
//! Pure checks: nothing here changes the host or the container.
//!
//! One file per concern:
//! * `preflight`: the plugin, cuda-checkpoint and driver checks (`driver`:
//!   the driver versions they need);
//! * `nvidia_smi`: the one nvidia-smi query, its answer read by the parser
//!   the hooks share (`vsnap_artifact::gpu`, where [`Gpu`] lives);
//! * `devices`: the GPUs a container's spec gives it, matched through `/proc`;
//! * `holders`: the processes holding GPUs, one GPU per tree;
//! * `checkpoint`: cuda-checkpoint's state and restore-thread answers;
//! * `hook`: GPUs given by an OCI hook, refused;
//! * `tool`: running those tools with a timeout; `error`: the refusals.

mod checkpoint;
mod devices;
mod driver_version;
mod error;
mod holders;
mod hook;
mod nvidia_smi;
mod preflight;
#[cfg(test)]
mod testutil;

pub use checkpoint::{cuda_restore_tid, cuda_state, resume_gpu_best_effort};
pub use devices::{container_gpus, spec_nvidia_devices};
pub use driver_version::MIN_DRIVER_PROCESS_TREE;
pub use holders::{check_single_gpu, cuda_holders};
pub use hook::check_no_gpu_hook;
pub use preflight::{preflight, CudaTools};
pub use vsnap_artifact::Gpu;
