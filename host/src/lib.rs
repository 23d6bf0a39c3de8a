//! Facts of the host that several of vsnap's crates read from `/proc`,
//! each read and parsed here once:
//!
//! - `buddyinfo`: the free 2 MiB blocks of physical memory (what the page
//!   server's `when-free` policy and the huge-page benchmark count);
//! - `fds`: the descriptors a process holds (`/proc/<pid>/fd`: the shim's
//!   capture checks, the OCI hook's io_uring check, the tests);
//! - `mountinfo`: the mount table, a row per mount (the shim, the hooks,
//!   the CLI, the tests).
//!
//! Nothing here changes the host; a fact that cannot be read is said so
//! (`None`, an empty list or an error), never guessed.

pub mod buddyinfo;
pub mod fds;
pub mod mountinfo;
