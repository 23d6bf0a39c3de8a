//! Two runc verbs the shim does itself where runc's own work is small and
//! runc's start as a process (a Go binary: 5-6 ms before it does anything)
//! is most of their cost, on the path of every plain container:
//!
//! - `start` of a created container: runc opens the container's
//!   `exec.fifo` for reading, which lets the waiting `runc init` exec the
//!   container's process, reads what init wrote, and removes the fifo;
//! - `delete` of a container whose init has exited: runc removes its
//!   cgroups and its state folder (and would run poststop hooks).
//!
//! Each first checks, in runc's `state.json`, that the container is in the
//! one case it handles: for a delete, an init that is gone (its pid, with
//! its start time, no longer runs), its own pid namespace (the kernel
//! killed every other process of the container with its init), cgroups
//! driven by runc's fs manager (not systemd), no poststop hooks and no
//! Intel RDT group. Anything else, or any step that fails, answers
//! [`Outcome::Runc`] and the caller runs runc as before, which finishes
//! what was left.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What the native verb did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Not a case it handles, or it could not finish: run runc.
    Runc,
}

fn state(dir: &Path) -> Option<Value> {
    let bytes = std::fs::read(dir.join("state.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Whether `pid` still runs the process that started at `start` (clock
/// ticks since boot), a zombie not counted.
fn runs(pid: i64, start: u64) -> bool {
    let pid = pid as i32;
    !crate::inflight::is_dead(pid) && crate::inflight::start_time(pid) == Some(start)
}

fn init_of(state: &Value) -> Option<(i64, u64)> {
    Some((
        state["init_process_pid"].as_i64().filter(|p| *p > 0)?,
        state["init_process_start"].as_u64()?,
    ))
}

/// `runc start` of the created container whose state folder is `dir`. An
/// error is one before init read anything: runc may still be tried.
pub fn start(dir: &Path, deadline: Duration) -> std::io::Result<Outcome> {
    start_with(dir, deadline, runs)
}

/// [`start`], asking `runs` whether the init still runs.
fn start_with(
    dir: &Path,
    deadline: Duration,
    mut runs: impl FnMut(i64, u64) -> bool,
) -> std::io::Result<Outcome> {
    let fifo = dir.join("exec.fifo");
    let Some((pid, since)) = state(dir).as_ref().and_then(init_of) else {
        return Ok(Outcome::Runc);
    };
    let poststart = state(dir).is_some_and(|s| {
        s["config"]["Hooks"]["poststart"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    });
    if poststart || !fifo.exists() || !runs(pid, since) {
        return Ok(Outcome::Runc);
    }
    // Non-blocking: an open for reading waits for no writer. `runc init`
    // is blocked opening it for writing; it then writes and execs (its
    // end closes on exec), which is our end of file.
    let mut f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&fifo)?;
    let mut data = Vec::new();
    let until = Instant::now() + deadline;
    loop {
        // Looked at before the read: what an init wrote before it was gone
        // (it may exec a process that exits at once) is in the fifo, and
        // this read sees it.
        let ran = runs(pid, since);
        let mut buf = [0u8; 64];
        match f.read(&mut buf) {
            Ok(0) if !data.is_empty() => break,
            Ok(0) => {}
            Ok(n) => {
                data.extend_from_slice(&buf[..n]);
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if !ran && data.is_empty() {
            return Err(std::io::Error::other(
                "the container's init exited before it started",
            ));
        }
        if Instant::now() > until {
            return Err(std::io::Error::other(format!(
                "the container's init did not open {} within {deadline:?}",
                fifo.display()
            )));
        }
        wait_readable(&f, 10);
    }
    // Started: a fifo left behind is only untidy (runc's delete takes it).
    if let Err(e) = std::fs::remove_file(&fifo) {
        log::warn!("start: remove {}: {e}", fifo.display());
    }
    Ok(Outcome::Done)
}

/// Waits until `f` is readable (or hung up), at most `ms` milliseconds.
fn wait_readable(f: &File, ms: i32) {
    let mut p = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// `runc delete` of the container whose state folder is `dir`, when its
/// init has exited (the cases above); its cgroups go first, then the
/// folder.
pub fn delete(dir: &Path) -> Outcome {
    let Some(state) = state(dir) else {
        return Outcome::Runc;
    };
    let Some((pid, since)) = init_of(&state) else {
        return Outcome::Runc;
    };
    let config = &state["config"];
    let own_pid_ns = config["namespaces"].as_array().is_some_and(|ns| {
        ns.iter()
            .any(|n| n["type"] == "NEWPID" && n["path"].as_str().unwrap_or("").is_empty())
    });
    let poststop = config["Hooks"]["poststop"]
        .as_array()
        .is_some_and(|h| !h.is_empty());
    let systemd = config["cgroups"]["Systemd"].as_bool().unwrap_or(true);
    let rdt = state["intel_rdt_path"]
        .as_str()
        .is_some_and(|p| !p.is_empty());
    if runs(pid, since) || !own_pid_ns || poststop || systemd || rdt {
        return Outcome::Runc;
    }
    let Some(paths) = state["cgroup_paths"].as_object() else {
        return Outcome::Runc;
    };
    let mut dirs: Vec<&str> = paths.values().filter_map(Value::as_str).collect();
    dirs.sort();
    dirs.dedup();
    for d in dirs {
        if !remove_cgroup(Path::new(d)) {
            return Outcome::Runc;
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Outcome::Done,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Outcome::Done,
        Err(_) => Outcome::Runc,
    }
}

/// Removes a cgroup folder and the cgroups below it, deepest first, as
/// runc does: a cgroup holding a process still exiting is busy for a
/// moment, so each rmdir is tried a few times (10, 20, 40, 80 ms apart).
/// False when one stays.
fn remove_cgroup(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        // Gone already (or never made in this hierarchy).
        return !dir.exists();
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) && !remove_cgroup(&e.path()) {
            return false;
        }
    }
    let mut pause = Duration::from_millis(10);
    for _ in 0..5 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(_) => std::thread::sleep(pause),
        }
        pause *= 2;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_state(dir: &Path, state: &Value) {
        std::fs::write(dir.join("state.json"), state.to_string()).unwrap();
    }

    fn stopped(extra: impl FnOnce(&mut Value)) -> Value {
        let mut s = serde_json::json!({
            "init_process_pid": 999_999_999,
            "init_process_start": 1,
            "config": {
                "namespaces": [{"type": "NEWPID", "path": ""}],
                "Hooks": null,
                "cgroups": {"Systemd": false},
            },
            "cgroup_paths": {},
            "intel_rdt_path": "",
        });
        extra(&mut s);
        s
    }

    #[test]
    fn a_stopped_container_without_cgroups_left_is_deleted_with_its_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c1");
        std::fs::create_dir(&dir).unwrap();
        let gone = tmp.path().join("no-such-cgroup");
        write_state(
            &dir,
            &stopped(|s| s["cgroup_paths"] = serde_json::json!({ "pids": gone })),
        );
        assert_eq!(delete(&dir), Outcome::Done);
        assert!(!dir.exists());
    }

    #[test]
    fn what_runc_must_do_is_left_to_runc() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c2");
        std::fs::create_dir(&dir).unwrap();
        let me = std::process::id() as i64;
        let my_start = crate::inflight::start_time(me as i32).unwrap();
        type Edit = Box<dyn Fn(&mut Value)>;
        let cases: Vec<Edit> = vec![
            // Its init still runs (this test's own process).
            Box::new(move |s| {
                s["init_process_pid"] = me.into();
                s["init_process_start"] = my_start.into();
            }),
            Box::new(|s| s["config"]["namespaces"] = serde_json::json!([])),
            Box::new(|s| {
                s["config"]["namespaces"] =
                    serde_json::json!([{"type": "NEWPID", "path": "/proc/1/ns/pid"}])
            }),
            Box::new(|s| {
                s["config"]["Hooks"] = serde_json::json!({"poststop": [{"path": "/bin/true"}]})
            }),
            Box::new(|s| s["config"]["cgroups"]["Systemd"] = true.into()),
            Box::new(|s| s["intel_rdt_path"] = "/sys/fs/resctrl/x".into()),
        ];
        for (i, case) in cases.iter().enumerate() {
            write_state(&dir, &stopped(|s| case(s)));
            assert_eq!(delete(&dir), Outcome::Runc, "case {i}");
            assert!(dir.join("state.json").exists(), "case {i} kept the state");
        }
        std::fs::remove_file(dir.join("state.json")).unwrap();
        assert_eq!(delete(&dir), Outcome::Runc, "no state");
    }

    /// A cgroup of this test's own in one hierarchy (v2, else v1's pids).
    fn real_cgroup(name: &str) -> std::path::PathBuf {
        let root = Path::new("/sys/fs/cgroup");
        let base = if root.join("cgroup.controllers").exists() {
            root.to_path_buf()
        } else {
            root.join("pids")
        };
        let dir = base.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    #[test]
    fn a_stopped_containers_real_cgroups_go_children_first() {
        let cg = real_cgroup("vsnap-native-delete");
        std::fs::create_dir(cg.join("nested")).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c3");
        std::fs::create_dir(&dir).unwrap();
        write_state(
            &dir,
            &stopped(|s| s["cgroup_paths"] = serde_json::json!({ "pids": cg, "": cg })),
        );
        let outcome = delete(&dir);
        let left = cg.exists();
        let _ = std::fs::remove_dir(cg.join("nested"));
        let _ = std::fs::remove_dir(&cg);
        assert_eq!(outcome, Outcome::Done);
        assert!(!left, "{} removed", cg.display());
        assert!(!dir.exists());
    }

    #[test]
    fn a_cgroup_with_a_live_process_stays_and_runc_is_asked() {
        let cg = real_cgroup("vsnap-native-busy");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        std::fs::write(cg.join("cgroup.procs"), child.id().to_string()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c4");
        std::fs::create_dir(&dir).unwrap();
        write_state(
            &dir,
            &stopped(|s| s["cgroup_paths"] = serde_json::json!({ "pids": cg })),
        );
        let outcome = delete(&dir);
        let left = cg.exists();
        child.kill().unwrap();
        child.wait().unwrap();
        for _ in 0..100 {
            if std::fs::remove_dir(&cg).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(outcome, Outcome::Runc);
        assert!(left, "a cgroup in use is never removed");
        assert!(
            dir.join("state.json").exists(),
            "runc's state stays for runc"
        );
    }

    #[test]
    fn a_busy_cgroup_is_not_removed() {
        // A folder that is not empty stands for a cgroup rmdir refuses.
        let tmp = tempfile::tempdir().unwrap();
        let cg = tmp.path().join("cg");
        std::fs::create_dir(&cg).unwrap();
        std::fs::write(cg.join("cgroup.procs"), "1\n").unwrap();
        assert!(!remove_cgroup(&cg));
        assert!(cg.exists());
    }

    #[test]
    fn start_reads_the_fifo_init_writes_and_removes_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let fifo = dir.join("exec.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // A child stands for `runc init`: it opens the fifo for writing
        // (blocking until a reader comes), writes "0" and exits.
        let mut init = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf 0 > {}", fifo.display()))
            .spawn()
            .unwrap();
        let pid = init.id() as i64;
        let start = crate::inflight::start_time(pid as i32).unwrap();
        write_state(
            dir,
            &serde_json::json!({"init_process_pid": pid, "init_process_start": start}),
        );
        assert_eq!(start_fifo(dir), Outcome::Done);
        assert!(!fifo.exists());
        assert!(init.wait().unwrap().success());
    }

    fn start_fifo(dir: &Path) -> Outcome {
        start(dir, Duration::from_secs(30)).unwrap()
    }

    /// The moment a loaded host showed (no_leaks, 2 of 3 runs): `runc
    /// init` writes, execs a short process that exits, all between the
    /// shim's empty read and its look at the init. What it wrote is in the
    /// fifo: the container started.
    #[test]
    fn an_init_that_wrote_and_exited_between_two_looks_has_started() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let fifo = dir.join("exec.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        write_state(
            dir,
            &serde_json::json!({"init_process_pid": 1, "init_process_start": 1}),
        );
        // Look 1 is before the fifo is open; at look 2 the init writes
        // "0" and is gone from then on.
        let mut looks = 0;
        let init = |_: i64, _: u64| {
            looks += 1;
            if looks == 2 {
                let mut w = File::options()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&fifo)
                    .unwrap();
                std::io::Write::write_all(&mut w, b"0").unwrap();
            }
            looks < 2
        };
        let outcome = start_with(dir, Duration::from_secs(30), init);
        assert_eq!(outcome.unwrap(), Outcome::Done);
        assert!(!fifo.exists());
    }

    #[test]
    fn start_without_a_fifo_or_a_live_init_is_runcs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write_state(dir, &stopped(|_| {}));
        assert_eq!(start_fifo(dir), Outcome::Runc);
    }
}
