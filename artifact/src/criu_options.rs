//! The CRIU options a capture's dump used, recorded in its manifest (format
//! 7), so that every restore of it repeats them by reading them: CRIU
//! refuses an image whose dump used an option its restore lacks ("Connected
//! TCP socket in image" without `tcp-established`), or silently drops what
//! it stored (file locks without `file-locks`).

use serde::{Deserialize, Serialize};

/// What a dump was told, as its restores must be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriuOptions {
    /// Established TCP connections dumped (`tcp-established`).
    pub tcp_established: bool,
    /// Unix sockets with a peer outside the tree dumped (`ext-unix-sk`).
    pub ext_unix_sk: bool,
    /// File locks dumped (`file-locks`).
    pub file_locks: bool,
    /// The tree's session leader had a terminal (`shell-job`).
    pub shell_job: bool,
    /// runc's masked folders the dump stored as external mounts (CRIU's
    /// key `vsnap-empty`) rather than as tmpfs contents: a restore binds
    /// the host's empty read-only tmpfs at each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_masks: Vec<String>,
}

impl CriuOptions {
    /// The options every snapshot dump of vsnap uses (a terminal: `shell_job`).
    pub fn snapshot(shell_job: bool, external_masks: Vec<String>) -> Self {
        Self {
            tcp_established: true,
            ext_unix_sk: true,
            file_locks: true,
            shell_job,
            external_masks,
        }
    }

    /// What an artifact of format 5 or 6 was dumped with: those formats did
    /// not record it, and every vsnap that made them used the snapshot
    /// options. Which masked folders it stored as external is unknown (the
    /// list is empty): a restore of one maps the key whether its images
    /// use it or not, as those vsnaps did.
    pub fn before_recorded(shell_job: bool) -> Self {
        Self::snapshot(shell_job, Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip_and_an_empty_mask_list_is_not_written() {
        let o = CriuOptions::snapshot(false, Vec::new());
        let text = serde_json::to_string(&o).unwrap();
        assert!(!text.contains("external_masks"), "{text}");
        assert_eq!(serde_json::from_str::<CriuOptions>(&text).unwrap(), o);
        let masked = CriuOptions::snapshot(true, vec!["/proc/acpi".into()]);
        let back: CriuOptions =
            serde_json::from_str(&serde_json::to_string(&masked).unwrap()).unwrap();
        assert_eq!(back.external_masks, ["/proc/acpi"]);
        assert!(back.shell_job && back.tcp_established && back.file_locks && back.ext_unix_sk);
    }

    #[test]
    fn an_unknown_option_is_refused_not_dropped() {
        let text = r#"{"tcp_established":true,"ext_unix_sk":true,"file_locks":true,"shell_job":false,"new":1}"#;
        assert!(serde_json::from_str::<CriuOptions>(text).is_err());
    }
}
