//! The NVIDIA driver versions cuda-checkpoint needs.

/// Oldest driver major version whose cuda-checkpoint handles one process.
pub const MIN_DRIVER_SINGLE_PROCESS: u32 = 555;
/// Oldest driver major version whose cuda-checkpoint handles process trees.
pub const MIN_DRIVER_PROCESS_TREE: u32 = 570;
