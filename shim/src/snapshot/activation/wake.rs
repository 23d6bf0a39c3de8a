//! Waking a captured engine (the donor, or a restored copy): the activation
//! handshake, then a probe of its listener from inside its network namespace.
//! Only after both does the container count as started.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use vsnap_protocol::{activate, Activation, ActivationKind, CaptureReady, ControlDir, Expect};

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::snapshot::activation::target::Target;

pub fn is_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// Activation ids allow `[A-Za-z0-9_.-]`, at most 128 characters.
pub fn activation_id(kind: &str, container: &str) -> String {
    let id: String = format!("{kind}-{container}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    id.chars().take(128).collect()
}

/// Runs the handshake with the engine `pid` waiting in `control_dir` (the
/// folder of uid `owner`, the engine's user), then waits until its listener
/// accepts a connection. Blocking: call it from a blocking thread.
pub fn activate_and_probe(
    phase: &str,
    t: &Target,
    capture: &CaptureReady,
    kind: ActivationKind,
    deadline: &Deadline,
) -> Result<Duration> {
    let started = Instant::now();
    let (host, port, pid) = (t.host.clone(), t.port, t.pid);
    let dir = ControlDir::open_owned_by(&t.control_dir, t.owner, Expect::AnyContents)
        .map_err(|e| Error::FailedPrecondition(format!("{phase}: control dir: {e}")))?;
    let kind_name = match kind {
        ActivationKind::Donor => "donor",
        ActivationKind::Copy => "copy",
    };
    let activation = Activation::new(
        capture,
        activation_id(kind_name, &t.container),
        kind,
        host.clone(),
        port,
    );
    // Its own hostname, addresses and seed, applied after its canary.
    let identity =
        super::identity::of_process(pid).map_err(|e| deadline.fail(format!("{phase}: {e}")))?;
    dir.write(&identity)
        .map_err(|e| deadline.fail(format!("{phase}: identity: {e}")))?;
    activate(&dir, capture, &activation, deadline.at, &mut || {
        is_alive(pid) && !deadline.cancel.is_cancelled()
    })
    .map_err(|e| deadline.fail(format!("{phase}: activation: {e}")))?;
    let validated = started.elapsed();
    probe_listener(pid, host.as_deref(), port, deadline.at).map_err(|e| {
        // An engine that failed after it validated (binding its port, say)
        // left its own record of why: that is the error, not what the
        // probe saw of the process it no longer finds.
        match dir.read::<vsnap_protocol::ErrorRecord>() {
            Ok(Some(r)) if !is_alive(pid) => deadline.fail(format!(
                "{phase}: activation: {}: the engine failed after it validated, in phase {}: {}: {}",
                dir.file(vsnap_protocol::files::ERROR).display(),
                r.value.phase,
                r.value.error_type,
                r.value.error
            )),
            _ => deadline.fail(format!("{phase}: listener: {e}")),
        }
    })?;
    Ok(validated)
}

/// Connects to the engine's listener from inside its network namespace
/// until it accepts or `deadline` passes; returns the address that answered,
/// once its listening socket proved to be held by the engine's container.
pub fn probe_listener(
    pid: i32,
    host: Option<&str>,
    port: u16,
    deadline: Instant,
) -> std::result::Result<SocketAddr, String> {
    let host = match host {
        None | Some("0.0.0.0") | Some("::") => "127.0.0.1".to_string(),
        Some(h) => h.to_string(),
    };
    in_netns(pid, move || {
        let addrs: Vec<SocketAddr> = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("{host}:{port}: {e}"))?
            .collect();
        loop {
            for a in &addrs {
                if TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok() {
                    // Something listens: it must be the engine's container.
                    return crate::snapshot::activation::listener::check_owned(pid, *a)
                        .map(|()| *a);
                }
            }
            if !is_alive(pid) {
                return Err(format!(
                    "engine pid {pid} exited before listening on {host}:{port}"
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("nothing listens on {host}:{port} by the deadline"));
            }
            // A refused connect to a local port costs microseconds; the
            // engine listens within a millisecond or two of validating, so
            // a short interval keeps the restore from waiting on the probe.
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// Runs `f` on a thread that joined the network namespace of `pid`.
pub fn in_netns<T: Send + 'static>(
    pid: i32,
    f: impl FnOnce() -> std::result::Result<T, String> + Send + 'static,
) -> std::result::Result<T, String> {
    super::ns::in_ns_of(pid, "net", nix::sched::CloneFlags::CLONE_NEWNET, f)
}

/// Wakes a restored copy: its control dir (uid `owner`'s) holds the
/// capture's own capture-ready.json, which names the capture to activate.
pub fn activate_copy(
    t: &Target,
    deadline: &Deadline,
    trusted: Option<vsnap_protocol::Oracle>,
) -> Result<Duration> {
    let dir = ControlDir::open_owned_by(&t.control_dir, t.owner, Expect::AnyContents)
        .map_err(|e| Error::FailedPrecondition(format!("restore: control dir: {e}")))?;
    let capture = dir
        .read::<CaptureReady>()
        .map_err(|e| Error::FailedPrecondition(format!("restore: {e}")))?
        .ok_or_else(|| {
            Error::FailedPrecondition(format!(
                "restore: {} has no capture-ready.json",
                t.control_dir.display()
            ))
        })?
        .value;
    // The copy is held to the manifest's oracle, not to the file's.
    let capture = CaptureReady {
        oracle: trusted.unwrap_or(capture.oracle),
        ..capture
    };
    activate_and_probe("restore", t, &capture, ActivationKind::Copy, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restored copy that runs as another user: its control dir is that
    /// user's, and is accepted as such (here it then lacks capture-ready.json).
    #[test]
    fn a_copys_control_dir_belongs_to_its_user() {
        if vsnap_protocol::euid() != 0 {
            eprintln!("skipped: needs root to hand a folder to another uid");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir =
            ControlDir::create_owned_by(tmp.path().join("control"), 54321, Some(54321)).unwrap();
        let deadline = Deadline::new(Instant::now() + Duration::from_secs(1), "a test deadline");
        let copy = |owner| {
            let t = Target {
                container: "c1".into(),
                pid: 1,
                control_dir: dir.path().to_path_buf(),
                owner,
                host: None,
                port: 80,
            };
            activate_copy(&t, &deadline, None).unwrap_err().to_string()
        };
        let e = copy(54321);
        assert!(e.contains("has no capture-ready.json"), "{e}");
        let e = copy(0);
        assert!(e.contains("owned by uid 54321, expected uid 0"), "{e}");
    }

    #[test]
    fn activation_ids_are_sanitized() {
        assert_eq!(activation_id("copy", "a b/c"), "copy-a_b_c");
        assert_eq!(activation_id("donor", &"x".repeat(300)).len(), 128);
    }
}
