//! The artifact root as the CLI sees it: names, leftovers of writers
//! (`.staging-*`, `.trash-*`), ages, sizes and removal.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use time::OffsetDateTime;
use vsnap_artifact::layout::{bytes_under, sync_dir};
use vsnap_artifact::{ArtifactError, ArtifactLock, HostKey, Manifest};

static TRASH: AtomicU64 = AtomicU64::new(0);

/// As the shim's `vsnap.io/artifact` rule (one definition, in the artifact
/// crate).
pub fn check_name(name: &str) -> Result<(), String> {
    vsnap_artifact::layout::check_name(name)
}

/// Every entry of the root that is not a dot-entry (`.staging-*`, `.trash-*`,
/// `.control`, `.locks`, `.journal`, `.criu-logs`, `.quarantine`, `.host-key`,
/// `.tool-identity.json`), sorted. A missing root has none.
pub fn artifact_names(root: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A folder a writer leaves while it works: `.staging-<name>-<pid>-<n>`
/// (the shim, capturing) or `.trash-<name>-<pid>-<n>` (`vsnap rm`/`gc`,
/// removing). The writer holds `<name>`'s exclusive lock meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    pub file_name: String,
    pub kind: &'static str,
    pub name: String,
    pub pid: u32,
}

pub fn parse_leftover(file_name: &str) -> Option<Leftover> {
    let (kind, rest) = if let Some(rest) = file_name.strip_prefix(".staging-") {
        ("staging", rest)
    } else {
        ("trash", file_name.strip_prefix(".trash-")?)
    };
    let mut parts = rest.rsplitn(3, '-');
    let n = parts.next()?;
    let pid = parts.next()?;
    let name = parts.next()?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || check_name(name).is_err() {
        return None;
    }
    Some(Leftover {
        file_name: file_name.to_string(),
        kind,
        name: name.to_string(),
        pid: pid.parse().ok()?,
    })
}

/// The `.staging-*` and `.trash-*` folders of the root, sorted.
pub fn leftovers(root: &Path) -> io::Result<Vec<Leftover>> {
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in entries {
        if let Some(l) = parse_leftover(&e?.file_name().to_string_lossy()) {
            out.push(l);
        }
    }
    out.sort_by(|a, b| a.file_name.cmp(&b.file_name));
    Ok(out)
}

/// When the manifest says the artifact was captured, if it says so readably.
pub fn created_at(m: &Manifest) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(
        &m.created_at,
        &time::format_description::well_known::Rfc3339,
    )
    .ok()
}

/// `YYYY-MM-DDTHH:MM:SSZ`, UTC, whole seconds.
pub fn format_utc(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

pub fn mtime(path: &Path) -> Option<SystemTime> {
    fs::symlink_metadata(path).and_then(|m| m.modified()).ok()
}

/// `now - then`, zero for a time in the future.
pub fn age_since(then: SystemTime) -> Duration {
    SystemTime::now().duration_since(then).unwrap_or_default()
}

/// An artifact's age: from the manifest's `created_at` (set by the shim at
/// capture and covered by the MAC) when the manifest can be read, else from
/// the artifact folder's mtime.
pub fn artifact_age(root: &Path, name: &str, manifest: Option<&Manifest>) -> Duration {
    if let Some(t) = manifest.and_then(created_at) {
        return age_since(t.into());
    }
    mtime(&root.join(name)).map(age_since).unwrap_or_default()
}

/// Total bytes of the regular files of an artifact (its apparent size);
/// 0 for anything but a real folder (a symlink is never followed).
pub fn disk_bytes(root: &Path, name: &str) -> u64 {
    let dir = root.join(name);
    match fs::symlink_metadata(&dir) {
        Ok(md) if md.is_dir() => bytes_under(&dir),
        _ => 0,
    }
}

/// Whether an artifact's manifest MAC verifies with this host's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MacStatus {
    Verified,
    Fails,
    NoHostKey,
    KeyUnusable(String),
}

impl MacStatus {
    pub fn of(root: &Path, m: &Manifest) -> Self {
        match HostKey::load(root) {
            Ok(key) if m.mac_verifies(&key) => MacStatus::Verified,
            Ok(_) => MacStatus::Fails,
            Err(ArtifactError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                MacStatus::NoHostKey
            }
            Err(e) => MacStatus::KeyUnusable(e.to_string()),
        }
    }

    /// `verified`, `fails`, `no-host-key`, `key-unusable`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MacStatus::Verified => "verified",
            MacStatus::Fails => "fails",
            MacStatus::NoHostKey => "no-host-key",
            MacStatus::KeyUnusable(_) => "key-unusable",
        }
    }

    pub fn describe(&self, root: &Path) -> String {
        match self {
            MacStatus::Verified => "verified (made on this host, unedited)".into(),
            MacStatus::Fails => {
                "FAILS (edited, or made on another host: a restore refuses it)".into()
            }
            MacStatus::NoHostKey => format!(
                "no host key ({} does not exist: nothing made here yet)",
                root.join(".host-key").display()
            ),
            MacStatus::KeyUnusable(e) => format!("host key unusable: {e}"),
        }
    }
}

#[derive(Debug)]
pub enum RemoveError {
    NotFound,
    InUse,
    Failed(String),
}

impl std::fmt::Display for RemoveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoveError::NotFound => f.write_str("no such artifact"),
            RemoveError::InUse => f.write_str("in use (its lock is held)"),
            RemoveError::Failed(e) => f.write_str(e),
        }
    }
}

/// Removes `<root>/<name>` holding its exclusive lock (refused while anyone
/// restores, captures or removes it): renamed to `.trash-<name>-<pid>-<n>`
/// first, so a half-removed artifact is never visible under its name, then
/// deleted. A trash folder left by a crash is removed by `vsnap gc`.
pub fn remove_artifact(root: &Path, name: &str) -> Result<(), RemoveError> {
    let dir = root.join(name);
    let exists = |dir: &Path| match fs::symlink_metadata(dir) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(RemoveError::NotFound),
        Err(e) => Err(RemoveError::Failed(format!("stat {}: {e}", dir.display()))),
    };
    // Checked before locking, so that a typo leaves no lock file behind.
    exists(&dir)?;
    let _lock = match ArtifactLock::exclusive(root, name) {
        Ok(lock) => lock,
        Err(ArtifactError::Locked(_)) => return Err(RemoveError::InUse),
        Err(e) => return Err(RemoveError::Failed(e.to_string())),
    };
    exists(&dir)?;
    let trash = root.join(format!(
        ".trash-{name}-{}-{}",
        std::process::id(),
        TRASH.fetch_add(1, Ordering::Relaxed)
    ));
    fs::rename(&dir, &trash).map_err(|e| {
        RemoveError::Failed(format!(
            "rename {} to {}: {e}",
            dir.display(),
            trash.display()
        ))
    })?;
    sync_dir(root).map_err(|e| RemoveError::Failed(e.to_string()))?;
    remove_tree(&trash).map_err(RemoveError::Failed)
}

/// Removes a leftover folder whose writer is gone, holding `<name>`'s
/// exclusive lock so that no writer can be working in it meanwhile.
pub fn remove_leftover(root: &Path, l: &Leftover) -> Result<(), RemoveError> {
    let _lock = match ArtifactLock::exclusive(root, &l.name) {
        Ok(lock) => lock,
        Err(ArtifactError::Locked(_)) => return Err(RemoveError::InUse),
        Err(e) => return Err(RemoveError::Failed(e.to_string())),
    };
    remove_tree(&root.join(&l.file_name)).map_err(RemoveError::Failed)
}

/// A folder (never following a symlink in it) or any other entry.
fn remove_tree(path: &Path) -> Result<(), String> {
    let is_dir = fs::symlink_metadata(path)
        .map(|m| m.is_dir())
        .unwrap_or(false);
    let result = if is_dir {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("remove {}: {e}", path.display())),
    }
}

/// The artifact root the CLI works on, made absolute without resolving
/// symlinks (the safety checks must see them).
pub fn absolute_root(root: &Path) -> io::Result<PathBuf> {
    std::path::absolute(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_names() {
        for ok in ["demo", "a.b-c_d", "Qwen2.5-7B"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "..", "a/b", "../x", "a b", &"x".repeat(129)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn leftover_names_are_split_from_the_right() {
        assert_eq!(
            parse_leftover(".staging-my-model-v2-1234-7"),
            Some(Leftover {
                file_name: ".staging-my-model-v2-1234-7".into(),
                kind: "staging",
                name: "my-model-v2".into(),
                pid: 1234,
            })
        );
        let t = parse_leftover(".trash-demo-99-0").unwrap();
        assert_eq!((t.kind, t.name.as_str(), t.pid), ("trash", "demo", 99));
        for not in [
            ".staging-",
            ".staging-x",
            ".staging-x-1",
            ".trash-x-p-0",
            ".trash-x-1-n",
            ".control",
            ".locks",
            "demo-1-2",
            ".trash--1-2",
        ] {
            assert_eq!(parse_leftover(not), None, "{not}");
        }
    }

    #[test]
    fn utc_times_are_whole_seconds() {
        let t = OffsetDateTime::parse(
            "2025-03-04T05:06:07.891+02:00",
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        assert_eq!(format_utc(t), "2025-03-04T03:06:07Z");
    }
}
