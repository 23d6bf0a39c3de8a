//! A container's CRIU options, in one place. What a dump uses
//! ([`dump_options`]) is decided once at create and kept in the capture's
//! plan, then recorded in its manifest (`criu`); a restore's plan holds
//! what its artifact recorded and repeats it: runc's flags at Start
//! ([`flags`]) come from it for both. The bundle's CRIU config file
//! ([`Options::config_text`]) is built at create from the plan and the
//! edited spec. A new per-container option is a field of [`Options`], where
//! its value comes from and its line; a new option of the dump that its
//! restores must repeat, a field of the manifest's `CriuOptions`
//! (artifact/src/criu_options.rs) and its flag or line here.
//!
//! runc passes CRIU exactly one config file: the one named by the spec's
//! `org.criu.config` annotation or, without it, `/etc/criu/runc.conf`;
//! options in that file override the ones runc sets over RPC. So the
//! config vsnap writes keeps the operator's file ([`base_config`]) and
//! ends with vsnap's lines, which win.

use std::path::{Path, PathBuf};

use serde_json::Value;
use vsnap_artifact::CriuOptions;
use vsnap_config::RuntimeConfig;

use super::{masks, pod, GHOST_LIMIT_BYTES};
use crate::error::{Error, Result};
use crate::runc::CheckpointFlags;

/// The options a capture's dump uses (recorded in its manifest): the
/// snapshot options, runc's masked folders named external where the
/// runtime config says so.
pub fn dump_options(spec: &Value, config: &RuntimeConfig) -> CriuOptions {
    let masked = match config.external_masks {
        true => masks::masked_folders(spec),
        false => Vec::new(),
    };
    CriuOptions::snapshot(terminal(spec), masked)
}

/// runc's flags for a dump or a restore: the dump's options (`dump`; a
/// restore repeats them, and an artifact that did not record them was
/// dumped with what every vsnap used), with `shell-job` also where the
/// container has a terminal.
pub fn flags(dump: Option<&CriuOptions>, terminal: bool) -> CheckpointFlags {
    let dump = dump
        .cloned()
        .unwrap_or_else(|| CriuOptions::before_recorded(terminal));
    CheckpointFlags {
        leave_running: false,
        tcp_established: dump.tcp_established,
        ext_unix_sk: dump.ext_unix_sk,
        file_locks: dump.file_locks,
        shell_job: dump.shell_job || terminal,
        manage_cgroups_mode: None,
    }
}

/// What one container's CRIU config file says beyond the operator's.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// A capture's masked folders its dump stores as external.
    pub external_masks: Vec<String>,
    /// A restore held stopped until every byte is verified.
    pub leave_stopped: bool,
    /// vsnap's page server places the memory.
    pub lazy_pages: bool,
    /// A capture's host /dev/shm, where CRIU's link remaps are kept.
    pub keep_link_remaps_in: Option<PathBuf>,
    /// A restore's empty read-only tmpfs, bound at each masked folder an
    /// artifact names external (masks.rs).
    pub empty_masks: Option<PathBuf>,
    /// A restore's namespaces the spec joins (pod.rs): CRIU's `join-ns`.
    pub join_ns: Vec<pod::JoinNs>,
    /// A restore into a network namespace that exists (a pod's): no
    /// network lock (pod.rs).
    pub skip_network_lock: bool,
}

impl Options {
    /// A capture's: what its dump uses (`dump`), link remaps kept in
    /// `host_shm`.
    pub fn capture(dump: &CriuOptions, host_shm: Option<&Path>) -> Self {
        Self {
            external_masks: dump.external_masks.clone(),
            keep_link_remaps_in: host_shm.map(Path::to_path_buf),
            ..Self::default()
        }
    }

    /// A restore's, into the container of the edited `spec`: the tree
    /// held stopped while vsnap verifies (`held`), the memory placed by
    /// vsnap's page server (`lazy`), the pod's namespaces joined, and the
    /// masked folders bound from the host's empty tmpfs where the dump
    /// (`dumped`, None where the artifact did not record it) may have
    /// named any external.
    pub fn restore(
        spec: &Value,
        config: &RuntimeConfig,
        dumped: Option<&CriuOptions>,
        (held, lazy): (bool, bool),
    ) -> Result<Self> {
        let maps_masks = dumped.is_none_or(|d| !d.external_masks.is_empty());
        Ok(Self {
            empty_masks: maps_masks.then(|| empty_masks(config)).transpose()?,
            join_ns: pod_namespaces(spec, config)?,
            skip_network_lock: pod::joins_network(spec),
            leave_stopped: held,
            lazy_pages: lazy,
            ..Self::default()
        })
    }

    /// The config a container's CRIU reads: what the operator's config held
    /// (`base`: its path and text, the spec's own `org.criu.config` file or
    /// runc's default), then vsnap's lines, which come last so that they
    /// win. `post_dump_script`: a capture's action script (the link remaps).
    pub fn config_text(
        &self,
        base: Option<(&Path, &str)>,
        plugin_dir: &Path,
        post_dump_script: Option<&Path>,
    ) -> String {
        let mut body = String::new();
        if let Some((path, text)) = base {
            body.push_str(&format!("# from {}\n", path.display()));
            for line in text.lines() {
                body.push_str(line);
                body.push('\n');
            }
        }
        body.push_str("# vsnap's options for this container (they override the ones above)\n");
        body.push_str(&format!("ghost-limit {GHOST_LIMIT_BYTES}\n"));
        body.push_str(&format!("libdir {}\n", plugin_dir.display()));
        // A file open or mapped under a name it no longer has while another
        // name still links it (a spawn-context multiprocessing semaphore in
        // /dev/shm) is linked back as `link_remap.N` for the restore (shm.rs
        // carries those and removes them from the donor's folder).
        body.push_str("link-remap\n");
        // A connection the kernel accepted and the engine has not (a client
        // of the donor's listener during start-up) fails a dump without it
        // ("In-flight connection"): it stays the donor's, a copy's listener
        // starts with an empty queue. Read by dumps only.
        body.push_str("skip-in-flight\n");
        if self.leave_stopped {
            body.push_str("leave-stopped\n");
        }
        if self.lazy_pages {
            body.push_str("lazy-pages\n");
        }
        if let Some(script) = post_dump_script {
            body.push_str(&format!("action-script {}\n", script.display()));
        }
        body.push_str(&masks::dump_lines(&self.external_masks));
        if let Some(empty) = &self.empty_masks {
            body.push_str(&masks::restore_line(empty));
        }
        body.push_str(&pod::lines(&self.join_ns, self.skip_network_lock));
        body
    }
}

/// Whether the spec's process has a terminal.
fn terminal(spec: &Value) -> bool {
    spec["process"]["terminal"].as_bool().unwrap_or(false)
}

/// The pod's UTS and IPC namespaces a restore joins (pod.rs), once CRIU
/// proved it can.
fn pod_namespaces(spec: &Value, config: &RuntimeConfig) -> Result<Vec<pod::JoinNs>> {
    let join = pod::joined(spec).map_err(|e| Error::InvalidArgument(format!("restore: {e}")))?;
    if !join.is_empty() {
        pod::check_patched(&config.criu_binary)
            .map_err(|e| Error::FailedPrecondition(format!("restore: preflight: {e}")))?;
    }
    Ok(join)
}

/// The host's empty read-only tmpfs a restore binds at runc's masked
/// folders (masks.rs), mounted if it is not yet.
fn empty_masks(config: &RuntimeConfig) -> Result<PathBuf> {
    masks::ensure_empty(&config.runtime_dir).map_err(|e| {
        Error::io(
            format!(
                "restore: mount the empty read-only tmpfs for runc's masked folders under {}",
                config.runtime_dir.display()
            ),
            e,
        )
    })
}

/// The config file runc would give CRIU without vsnap: the one the spec's
/// annotation names (`named`, an empty name meaning none at all), else
/// `default` (runc's `/etc/criu/runc.conf`). Returns its path and text when
/// it exists; a named file that cannot be read is an error naming it.
pub fn base_config(named: Option<&str>, default: &Path) -> Result<Option<(PathBuf, String)>> {
    let path = match named {
        Some("") => return Ok(None),
        Some(p) => PathBuf::from(p),
        None => default.to_path_buf(),
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some((path, text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && named.is_none() => Ok(None),
        Err(e) => Err(Error::io(
            format!("create: CRIU config {} (org.criu.config)", path.display()),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RuntimeConfig {
        RuntimeConfig {
            external_masks: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_restore_repeats_the_options_its_dump_recorded() {
        let spec = serde_json::json!({"process": {"terminal": false}});
        let dump = dump_options(&spec, &config());
        let f = flags(Some(&dump), false);
        assert!(f.tcp_established && f.ext_unix_sk && f.file_locks);
        assert!(!f.shell_job && !f.leave_running);
        let recorded = CriuOptions {
            tcp_established: false,
            file_locks: false,
            ..CriuOptions::snapshot(true, Vec::new())
        };
        let f = flags(Some(&recorded), false);
        assert!(!f.tcp_established && !f.file_locks && f.ext_unix_sk && f.shell_job);
        // An artifact that recorded nothing: what every vsnap dumped with,
        // shell-job with the restoring container's terminal.
        let f = flags(None, true);
        assert!(f.tcp_established && f.ext_unix_sk && f.file_locks && f.shell_job);
        assert!(!flags(None, false).shell_job);
    }

    #[test]
    fn the_config_keeps_the_base_and_ends_with_vsnaps_lines() {
        let dump = CriuOptions::snapshot(false, vec!["/proc/acpi".into()]);
        let capture = Options::capture(&dump, Some(Path::new("/dev/shm-of-pod")));
        let text = capture.config_text(
            Some((Path::new("/etc/criu/runc.conf"), "tcp-close\nlibdir /old\n")),
            Path::new("/opt/criu/plugins"),
            Some(Path::new("/b/vsnap-post-dump.sh")),
        );
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                "tcp-close",
                "libdir /old",
                "ghost-limit 68719476736",
                "libdir /opt/criu/plugins",
                "link-remap",
                "skip-in-flight",
                "action-script /b/vsnap-post-dump.sh",
                "external mnt[/proc/acpi]:vsnap-empty",
            ]
        );
        assert!(text.starts_with("# from /etc/criu/runc.conf\n"));
        let restore = Options {
            leave_stopped: true,
            lazy_pages: true,
            empty_masks: Some("/run/vsnap/empty".into()),
            ..Options::default()
        };
        let text = restore.config_text(None, Path::new("/usr/lib/criu"), None);
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines[4..],
            [
                "leave-stopped",
                "lazy-pages",
                "external mnt[vsnap-empty]:/run/vsnap/empty"
            ]
        );
        let plain = Options::default().config_text(None, Path::new("/usr/lib/criu"), None);
        assert!(!plain.contains("action-script"));
        assert!(!plain.contains("leave-stopped"));
        assert!(!plain.contains("lazy-pages"));
        assert!(!plain.contains("external"));
        assert!(plain.contains("libdir /usr/lib/criu\n"));
    }

    #[test]
    fn a_restore_maps_the_masks_only_where_its_dump_may_have_named_some() {
        let dir = tempfile::tempdir().unwrap();
        let config = RuntimeConfig {
            runtime_dir: dir.path().to_path_buf(),
            ..config()
        };
        let spec = serde_json::json!({});
        let none = CriuOptions::snapshot(false, Vec::new());
        let o = Options::restore(&spec, &config, Some(&none), (true, false)).unwrap();
        assert!(o.empty_masks.is_none() && o.leave_stopped && !o.lazy_pages);
        assert!(o.join_ns.is_empty() && !o.skip_network_lock);
    }

    #[test]
    fn the_base_config_is_the_named_one_or_runcs_default() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("runc.conf");
        assert!(
            base_config(None, &default).unwrap().is_none(),
            "absent default"
        );
        std::fs::write(&default, "log-level 4\n").unwrap();
        let (p, t) = base_config(None, &default).unwrap().unwrap();
        assert_eq!((p, t.as_str()), (default.clone(), "log-level 4\n"));
        assert!(
            base_config(Some(""), &default).unwrap().is_none(),
            "none at all"
        );
        let named = dir.path().join("mine.conf");
        let err = base_config(Some(named.to_str().unwrap()), &default)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mine.conf") && err.contains("org.criu.config"),
            "{err}"
        );
        std::fs::write(&named, "tcp-established\n").unwrap();
        let (p, _) = base_config(Some(named.to_str().unwrap()), &default)
            .unwrap()
            .unwrap();
        assert_eq!(p, named);
    }
}
