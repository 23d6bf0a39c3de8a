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

use crate::bundle_spec::BundleSpec;
use crate::error::Error;
use crate::exits::Exits;
use crate::inflight::{in_flight_pids, is_dead, IN_FLIGHT};
use crate::mounts;
use crate::runc::{kill_tree, Runc, RuncVerbs};

/// The record's file name in the bundle.
pub const RECORD: &str = "vsnap-shim.json";

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
    /// Written whole or not at all (`write_atomic`).
    pub fn write(&self, bundle: &Path) -> std::io::Result<()> {
        vsnap_protocol::write_atomic(&bundle.join(RECORD), &serde_json::to_vec(self)?)
            .map_err(std::io::Error::other)
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

/// The container's cgroupfs path from its bundle's spec, when it has one
/// (no container holds the spec here: its shim died).
pub fn cgroups_path(bundle: &Path) -> Option<PathBuf> {
    BundleSpec::read(bundle).ok()?.cgroups_path()
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
    let rootfs = rootfs_path(bundle);
    undo_runc_state(
        &runc,
        id,
        &work,
        rootfs.as_deref(),
        cgroups_path(bundle).as_deref(),
    )
    .await;
    let _ = std::fs::remove_dir_all(&work);
    let rootfs = bundle.join("rootfs");
    while nix::mount::umount2(&rootfs, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    crate::netns_holder::unbind(&bundle.join(crate::netns_holder::NETNS_FILE));
    if let Some(dir) = record.and_then(|r| r.control_dir) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The bundle's spec's `root.path` as config.json holds it now (a plan's
/// edits included), absolute (a relative one is under the bundle).
pub fn rootfs_path(bundle: &Path) -> Option<PathBuf> {
    Some(bundle.join(BundleSpec::read(bundle).ok()?.root_path()?))
}

/// Undoes what a killed or failed `runc restore` leaves: runc's criu-root
/// and CRIU's cgroup yard are unmounted before runc removes its state (a
/// `runc delete` through a live bind mount would unlink the rootfs), then
/// runc's state, then (cgroupfs) the container's cgroups. So are the bind
/// mounts runc puts on the rootfs for CRIU (`/etc/hosts`,
/// `/etc/resolv.conf`: runc 1.1 mounts them on the host's side and removes
/// them only when its restore returns, which a killed runc never does); the
/// rootfs's own mount (at `rootfs`, not below it) stays for the delete.
pub async fn undo_runc_state(
    runc: &dyn RuncVerbs,
    id: &str,
    work: &Path,
    rootfs: Option<&Path>,
    cgroups: Option<&Path>,
) {
    mounts::unmount_under(work);
    if let Some(rootfs) = rootfs {
        mounts::unmount_below(rootfs);
    }
    // No state folder: runc does not know the container (the live shim
    // deleted it, or runc was killed before it made one). Asking it would
    // cost a runc run on every container's dead-shim delete.
    if runc.state_dir(id).exists() {
        if let Err(e @ Error::FailedPrecondition(_)) = runc.delete(id, true).await {
            warn!("{id}: {e}");
            return;
        }
    }
    // Killed before it recorded its state, runc cannot find the container's
    // cgroups to remove them: remove them here.
    if !runc.systemd_cgroup() {
        if let Some(path) = cgroups {
            remove_cgroups(path).await;
        }
    }
}

/// Removes the (empty) cgroup `path` from every hierarchy that has it,
/// waiting a little for killed members to finish exiting. rmdir refuses a
/// cgroup that still has processes or children, so nothing in use goes.
pub async fn remove_cgroups(path: &Path) {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(relative)];
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        dirs.push(e.path().join(relative));
    }
    dirs.retain(|d| d.is_dir());
    for _ in 0..100 {
        dirs.retain(|d| match std::fs::remove_dir(d) {
            Ok(()) => false,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        });
        if dirs.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for d in dirs {
        warn!("cgroup {} is left: not empty", d.display());
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
    use crate::inflight::InFlight;

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
        assert_eq!(Record::read(dir.path()), Some(r.clone()));
        // Written again, whole, with nothing left beside it.
        r.write(dir.path()).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [RECORD]);
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
