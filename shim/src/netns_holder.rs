//! A network namespace of the container's own, made by the shim before
//! runc sees the container, when a snapshot plan runs it (`ctr run`
//! without `--with-ns`, `docker run` on any network but the host's).
//!
//! Why: a restore has no process until Start (CRIU makes it), and dockerd
//! configures a container's network between Create and Start through
//! `/proc/<the pid Create returned>/ns/net`. So the namespace is made at
//! Create by a holder process, bound at the bundle's `vsnap-netns`, and the
//! spec names that file: runc's `create` joins it (a capture), runc hands it
//! to CRIU as the external network namespace (a restore), and Create
//! returns the holder's pid for a restore, whose namespace is the one the
//! copy is restored into. The holder goes at Start; the bind goes at
//! delete. Capture and restore both name a path, so the workload they
//! record agrees.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The file in the bundle the namespace is bound at.
pub const NETNS_FILE: &str = "vsnap-netns";

/// Gives `spec` the bundle's [`NETNS_FILE`] as its network namespace when
/// it has one of its own without a path; returns that file, or None for a
/// spec in the host's namespace or one that joins a namespace (a pod's).
pub fn name_in_spec(spec: &mut Value, bundle: &Path) -> Option<PathBuf> {
    let ns = spec["linux"]["namespaces"]
        .as_array_mut()?
        .iter_mut()
        .find(|n| n["type"] == "network")?;
    if ns.get("path").is_some() {
        return None;
    }
    let file = bundle.join(NETNS_FILE);
    ns["path"] = Value::String(file.display().to_string());
    Some(file)
}

/// A namespace bound at its file, and while it is needed, its holder.
#[derive(Debug)]
pub struct NetnsHold {
    file: PathBuf,
    holder: Option<i32>,
}

impl NetnsHold {
    /// A fresh network namespace, its loopback up, held by a child that
    /// dies with the shim, bound at `file`.
    pub fn make(file: &Path) -> std::io::Result<Self> {
        let mut cmd = Command::new("sleep");
        cmd.arg("infinity")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                    || libc::unshare(libc::CLONE_NEWNET) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                loopback_up()
            });
        }
        let child = cmd.spawn()?;
        let mut hold = NetnsHold {
            file: file.to_path_buf(),
            holder: Some(child.id() as i32),
        };
        // The shim's reaper collects the holder's exit (exits.rs).
        std::mem::forget(child);
        if let Err(e) = hold.bind() {
            hold.remove();
            return Err(e);
        }
        Ok(hold)
    }

    fn bind(&self) -> std::io::Result<()> {
        let pid = self.holder.expect("held while bound");
        std::fs::File::create(&self.file)?;
        nix::mount::mount(
            Some(Path::new(&format!("/proc/{pid}/ns/net"))),
            &self.file,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(std::io::Error::from)
    }

    /// The holder's pid while it lives.
    pub fn holder(&self) -> Option<i32> {
        self.holder
    }

    /// The holder goes; the namespace stays bound at its file.
    pub fn release_holder(&mut self) {
        if let Some(pid) = self.holder.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// The holder, the bind and the file go.
    pub fn remove(&mut self) {
        self.release_holder();
        unbind(&self.file);
    }
}

impl Drop for NetnsHold {
    fn drop(&mut self) {
        self.release_holder();
    }
}

/// Takes the namespace's bind off `file` and removes it (a delete, or the
/// delete after the shim died).
pub fn unbind(file: &Path) {
    while nix::mount::umount2(file, nix::mount::MntFlags::MNT_DETACH).is_ok() {}
    let _ = std::fs::remove_file(file);
}

/// Sets `lo` up in the calling process's network namespace (runc does so
/// for a namespace it makes; this one is the shim's).
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket and ioctl calls on a zeroed ifreq naming "lo".
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr);
        if rc == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr);
        }
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_namespace_of_the_containers_own_is_named() {
        let bundle = Path::new("/b");
        let mut own = json!({"linux": {"namespaces": [{"type": "pid"}, {"type": "network"}]}});
        assert_eq!(
            name_in_spec(&mut own, bundle),
            Some(bundle.join(NETNS_FILE))
        );
        assert_eq!(own["linux"]["namespaces"][1]["path"], "/b/vsnap-netns");
        let mut pod =
            json!({"linux": {"namespaces": [{"type": "network", "path": "/var/run/netns/x"}]}});
        assert_eq!(name_in_spec(&mut pod, bundle), None);
        assert_eq!(pod["linux"]["namespaces"][0]["path"], "/var/run/netns/x");
        let mut host = json!({"linux": {"namespaces": [{"type": "pid"}]}});
        assert_eq!(name_in_spec(&mut host, bundle), None);
    }

    #[test]
    fn a_held_namespace_is_its_own_with_loopback_up_until_removed() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to bind a namespace");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(NETNS_FILE);
        let mut hold = NetnsHold::make(&file).unwrap();
        let pid = hold.holder().unwrap();
        let ns = |p: &str| std::fs::read_link(p).unwrap();
        assert_ne!(ns(&format!("/proc/{pid}/ns/net")), ns("/proc/self/ns/net"));
        let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap();
        assert!(dev.contains("lo:"), "{dev}");
        let flags = std::process::Command::new("nsenter")
            .arg(format!("--net={}", file.display()))
            .args(["ip", "-o", "link", "show", "lo"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&flags.stdout).contains("UP"),
            "{flags:?}"
        );
        hold.release_holder();
        assert!(hold.holder().is_none());
        // The namespace outlives its holder, reachable through its file.
        let joined = std::process::Command::new("nsenter")
            .arg(format!("--net={}", file.display()))
            .arg("true")
            .status()
            .unwrap();
        assert!(joined.success());
        hold.remove();
        assert!(!file.exists());
    }
}
