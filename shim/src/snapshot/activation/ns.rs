//! Work done inside one namespace of an engine: on a thread of its own that
//! joined it (a namespace is a thread's; the shim's other threads stay where
//! they are, and the thread ends with the work).

use std::os::fd::AsFd;

use nix::sched::CloneFlags;

/// Runs `f` on a thread that joined `pid`'s namespace `kind` (`net`,
/// `uts`: its file under `/proc/<pid>/ns`, of type `flag`).
pub fn in_ns_of<T: Send + 'static>(
    pid: i32,
    kind: &str,
    flag: CloneFlags,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
        .map_err(|e| format!("open the {kind} namespace of pid {pid}: {e}"))?;
    let joined = kind.to_string();
    std::thread::spawn(move || {
        nix::sched::setns(ns.as_fd(), flag)
            .map_err(|e| format!("join the {joined} namespace: {e}"))?;
        f()
    })
    .join()
    .map_err(|_| format!("the {kind} namespace thread panicked"))?
}
