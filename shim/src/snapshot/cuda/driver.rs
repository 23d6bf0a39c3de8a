//! The NVIDIA driver versions cuda-checkpoint needs, and reading a driver
//! version's major number.

/// Oldest driver major version whose cuda-checkpoint handles one process.
pub const MIN_DRIVER_SINGLE_PROCESS: u32 = 555;
/// Oldest driver major version whose cuda-checkpoint handles process trees.
pub const MIN_DRIVER_PROCESS_TREE: u32 = 570;

/// The major version of a driver version string: `570` for `570.124.06`.
pub fn driver_major(version: &str) -> Option<u32> {
    let major = version.split('.').next()?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    major.parse().ok()
}
