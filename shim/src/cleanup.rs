//! Crash-safe cleanup. While a shim lives it records in the bundle what a
//! later `delete` needs if it dies: the runc it used (binary, root, cgroup
//! driver), the control dir, and every long runc invocation in flight
//! (restore, checkpoint) by pid and start time. containerd runs the shim's
//! `delete` command in the bundle after a shim died; [`dead_shim_delete`]
//! stops runc and CRIU first, unmounts what they mounted, and only then lets
//! runc remove its state, so nothing of a rootfs is ever reached.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::{Deserialize, Serialize};

use crate::container::undo_runc_state;
use crate::exits::Exits;
use crate::runc::{kill_tree, Runc};

/// The record's file name in the bundle.
pub const RECORD: &str = "vsnap-shim.json";
/// Prefix of the in-flight markers in the bundle.
const IN_FLIGHT: &str = ".vsnap-inflight-";

/// What a dead shim's `delete` needs to know about the container.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub runc_binary: PathBuf,
    pub runc_root: PathBuf,
    pub systemd_cgroup: bool,
    /// The snapshot plan's control dir, removed with the container.
    pub control_dir: Option<PathBuf>,
}

impl Record {
    /// Written whole (temporary file, then rename) or not at all.
    pub fn write(&self, bundle: &Path) -> std::io::Result<()> {
        let tmp = bundle.join(format!(".{RECORD}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(self)?)?;
        std::fs::rename(&tmp, bundle.join(RECORD))
    }

    pub fn read(bundle: &Path) -> Option<Self> {
        let bytes = std::fs::read(bundle.join(RECORD)).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(r) => Some(r),
            Err(e) => {
                warn!("{}: {e}", bundle.join(RECORD).display());
                None
            }
        }
    }
}

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
fn is_dead(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(true)
}

/// Stops every runc invocation recorded in flight in `bundle`, with the
/// processes under it (CRIU, a partly restored tree), and waits until they
/// are gone. Returns how many it stopped.
pub async fn stop_in_flight(bundle: &Path) -> usize {
    let pids = in_flight_pids(bundle);
    for &pid in &pids {
        let under = kill_tree(pid);
        info!(
            "{}: killed runc {pid} and the {under} processes under it",
            bundle.display()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_dead(pid) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for entry in std::fs::read_dir(bundle).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(IN_FLIGHT) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    pids.len()
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

/// The restored init runc wrote to `<bundle>/init.pid` once CRIU restored
/// the tree, while it waits (stopped) for its pages and its verification,
/// when it is still there.
pub fn restored_init_pid(bundle: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(bundle.join("init.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok())
        .then_some(pid)
}

/// The container's cgroupfs path from its spec, when it has one.
pub fn cgroups_path(bundle: &Path) -> Option<PathBuf> {
    let spec = oci_spec::runtime::Spec::load(bundle.join("config.json")).ok()?;
    let path = spec.linux().as_ref()?.cgroups_path().clone()?;
    path.is_absolute().then_some(path)
}

/// The `delete` containerd runs after the shim of `id` died: stop runc and
/// CRIU, unmount what they mounted, remove runc's state and the cgroups,
/// unmount the rootfs, remove the control dir.
pub async fn dead_shim_delete(bundle: &Path, id: &str, fallback: Runc) {
    let record = Record::read(bundle);
    let runc = match &record {
        Some(r) => Runc {
            binary: r.runc_binary.clone(),
            root: r.runc_root.clone(),
            systemd_cgroup: r.systemd_cgroup,
            ..fallback
        },
        None => fallback,
    };
    let stopped = stop_in_flight(bundle).await;
    if stopped > 0 {
        info!("delete {id}: stopped {stopped} runc invocations in flight");
    }
    let work = bundle.join("criu-work");
    undo_runc_state(&runc, id, &work, cgroups_path(bundle).as_deref()).await;
    let _ = std::fs::remove_dir_all(&work);
    let rootfs = bundle.join("rootfs");
    while nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    if let Some(dir) = record.and_then(|r| r.control_dir) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A Runc for cleanup when no record says otherwise.
pub async fn default_runc(binary: PathBuf, root: PathBuf, systemd_cgroup: bool) -> Runc {
    Runc {
        binary,
        root,
        systemd_cgroup,
        log_dir: std::env::temp_dir(),
        exits: Exits::start().await,
        criu: Default::default(),
    }
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

    #[test]
    fn records_round_trip_and_refuse_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let r = Record {
            runc_binary: "/usr/sbin/runc".into(),
            runc_root: "/run/x/default".into(),
            systemd_cgroup: false,
            control_dir: Some("/var/lib/vsnap/.control/default-x".into()),
        };
        r.write(dir.path()).unwrap();
        assert_eq!(Record::read(dir.path()), Some(r));
        std::fs::write(dir.path().join(RECORD), br#"{"runc_binary":"/r","x":1}"#).unwrap();
        assert_eq!(Record::read(dir.path()), None);
    }

    #[tokio::test]
    async fn in_flight_invocations_are_stopped_and_stale_markers_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let marker = InFlight::record(dir.path(), "restore", pid).expect("recorded");
        // A marker for a pid whose start time differs: a reused pid.
        std::fs::write(
            dir.path().join(format!("{IN_FLIGHT}restore-{pid}0")),
            format!("{pid} 1\n"),
        )
        .unwrap();
        std::mem::forget(marker);
        let waiter = std::thread::spawn(move || child.wait().unwrap());
        assert_eq!(stop_in_flight(dir.path()).await, 1);
        let status = waiter.join().unwrap();
        assert!(!status.success(), "killed: {status:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
