//! Long runc invocations in flight (restore, checkpoint), recorded in the
//! bundle by pid and start time while they run, so a `delete` after the
//! shim's death can stop them, and a restoring task can list them as its
//! pids; with the process facts they rest on (start time, gone or zombie).
//! Below both the runc invoker and the cleanup.

use std::path::{Path, PathBuf};

/// Prefix of the in-flight markers in the bundle.
pub const IN_FLIGHT: &str = ".vsnap-inflight-";

/// A long runc invocation in flight, recorded in `dir` until dropped.
pub struct InFlight {
    path: PathBuf,
}

impl InFlight {
    pub fn record(dir: &Path, verb: &str, pid: i32) -> Option<Self> {
        let start = start_time(pid)?;
        let path = dir.join(format!("{IN_FLIGHT}{verb}-{pid}"));
        std::fs::write(&path, format!("{pid} {start}\n")).ok()?;
        Some(Self { path })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks
/// since boot. With the pid it names one process, never a reused pid.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses;
    // after it, starttime is the 20th field.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Gone, or a zombie.
pub fn is_dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(true)
}

/// The pids of the runc invocations recorded in flight in `bundle` (still
/// the processes they were).
pub fn in_flight_pids(bundle: &Path) -> Vec<i32> {
    let entries = std::fs::read_dir(bundle).into_iter().flatten().flatten();
    entries
        .filter(|e| e.file_name().to_string_lossy().starts_with(IN_FLIGHT))
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let mut fields = text.split_whitespace().map(str::parse::<u64>);
            let (pid, start) = (fields.next()?.ok()? as i32, fields.next()?.ok()?);
            (start_time(pid) == Some(start)).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_the_22nd_field_whatever_the_name() {
        let stat =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("1 (x) S 0"), None);
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some_and(|t| t > 0));
    }
}
