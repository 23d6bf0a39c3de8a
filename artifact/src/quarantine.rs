//! Artifacts set aside: an artifact that cannot be restored on this host
//! (a host reason, damage, a restore that failed after CRIU started) is
//! moved out of the way under `vsnap.io/plan=auto`, not deleted, so the
//! start becomes a create and an operator can still read what went wrong.
//!
//! `<root>/.quarantine/<name>/` holds the artifact's files as they were
//! plus `quarantine.json` (the [`Reason`]); at most one copy per name (a
//! later one replaces it). The folder's name is no artifact name (names do
//! not start with a dot): `ls`, `gc`'s sizes, the metrics' store and the
//! registry never take it for an artifact. `vsnap ls` lists the copies,
//! `vsnap inspect --quarantined` reads one, `vsnap gc --older-than` removes
//! them by the age their reason records.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{ArtifactError, Result};
use crate::layout::{sync_dir, write_synced};

/// The folder under the artifact root.
pub const DIR: &str = ".quarantine";
/// The reason's file in a quarantined copy.
pub const REASON: &str = "quarantine.json";
/// Most bytes a reason file may hold to be read.
const MAX_REASON_BYTES: u64 = 1 << 20;

static TRASH: AtomicU64 = AtomicU64::new(0);

/// Why and when an artifact was set aside.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// A short stable slug: "host" (another runc, CRIU, kernel, driver, GPU
    /// set, artifact format, clocks), "damaged" (MAC, signature, missing or
    /// wrong-size file, a digest mismatch), "restore" (a restore that failed
    /// after CRIU started: CRIU, canary, activation deadline).
    pub cause: String,
    /// The refusal or failure, whole (the shim's error message).
    pub message: String,
    /// Seconds since the epoch when it was set aside.
    pub at: u64,
    /// The container whose start set it aside.
    pub container: String,
}

/// Moves `<root>/<name>` to `<root>/.quarantine/<name>` with one rename
/// (replacing an older quarantined copy of that name: at most one per
/// name; the older one is renamed away first and then removed), then
/// writes `reason` as `<root>/.quarantine/<name>/quarantine.json` (written
/// whole: write then rename). The caller holds the artifact's exclusive
/// lock (`ArtifactLock::exclusive`). `Ok(None)` when `<root>/<name>` does
/// not exist. Errors name the path and the step.
pub fn set_aside(root: &Path, name: &str, reason: &Reason) -> Result<Option<PathBuf>> {
    check_name(name)?;
    let from = root.join(name);
    match fs::symlink_metadata(&from) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ArtifactError::io(&from, "set aside: stat", e)),
    }
    let dir = quarantine_dir(root)?;
    let to = dir.join(name);
    remove_copy(&dir, name)?;
    fs::rename(&from, &to).map_err(|e| ArtifactError::Io {
        context: format!("set aside: rename {} to {}", from.display(), to.display()),
        source: e,
    })?;
    sync_dir(root)?;
    sync_dir(&dir)?;
    write_reason(&to, reason)?;
    Ok(Some(to))
}

/// Every quarantined copy: (name, reason, path), sorted by name. A copy
/// without a readable `quarantine.json` is listed with cause "unknown"
/// (its message says why, its time is the folder's mtime).
pub fn list(root: &Path) -> Result<Vec<(String, Reason, PathBuf)>> {
    let dir = root.join(DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ArtifactError::io(&dir, "list quarantine", e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ArtifactError::io(&dir, "list quarantine", e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // `.trash-*` (a copy being removed) and anything not named as an
        // artifact is no quarantined copy.
        if check_name(&name).is_err() || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let reason = read_reason(&path).unwrap_or_else(|e| Reason {
            cause: "unknown".into(),
            message: e.to_string(),
            at: mtime_seconds(&path),
            container: String::new(),
        });
        out.push((name, reason, path));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Removes the quarantined copy of `name` (Ok when there is none).
pub fn remove(root: &Path, name: &str) -> Result<()> {
    check_name(name)?;
    let dir = root.join(DIR);
    match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ArtifactError::io(&dir, "remove quarantined copy: stat", e)),
        Ok(_) => remove_copy(&dir, name),
    }
}

/// The reason of one quarantined copy's folder `copy`.
pub fn read_reason(copy: &Path) -> Result<Reason> {
    let path = copy.join(REASON);
    let md = fs::symlink_metadata(&path).map_err(|e| ArtifactError::io(&path, "stat", e))?;
    if !md.is_file() || md.len() > MAX_REASON_BYTES {
        return Err(ArtifactError::Invalid(format!(
            "{} is not a regular file of at most {MAX_REASON_BYTES} bytes",
            path.display()
        )));
    }
    let bytes = fs::read(&path).map_err(|e| ArtifactError::io(&path, "read", e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ArtifactError::Invalid(format!("{}: {e}", path.display())))
}

/// A quarantined copy's name is an artifact name: never a path.
fn check_name(name: &str) -> Result<()> {
    crate::ArtifactName::new(name)
        .map(drop)
        .map_err(|e| ArtifactError::Invalid(e.to_string()))
}

/// `<root>/.quarantine`, made 0700 when missing; never a symlink.
fn quarantine_dir(root: &Path) -> Result<PathBuf> {
    let dir = root.join(DIR);
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ArtifactError::io(&dir, "set aside: create", e))?;
    let md =
        fs::symlink_metadata(&dir).map_err(|e| ArtifactError::io(&dir, "set aside: stat", e))?;
    if !md.is_dir() {
        return Err(ArtifactError::Unsafe(format!(
            "{} is not a folder (a symlink?)",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Renames `<dir>/<name>` to `<dir>/.trash-<name>-<pid>-<n>` (so a half
/// removed copy is never listed under its name), then removes it.
fn remove_copy(dir: &Path, name: &str) -> Result<()> {
    let copy = dir.join(name);
    let trash = dir.join(format!(
        ".trash-{name}-{}-{}",
        std::process::id(),
        TRASH.fetch_add(1, Ordering::Relaxed)
    ));
    match fs::rename(&copy, &trash) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(ArtifactError::Io {
                context: format!(
                    "remove quarantined copy: rename {} to {}",
                    copy.display(),
                    trash.display()
                ),
                source: e,
            })
        }
    }
    let is_dir = fs::symlink_metadata(&trash).is_ok_and(|m| m.is_dir());
    let removed = if is_dir {
        fs::remove_dir_all(&trash)
    } else {
        fs::remove_file(&trash)
    };
    removed.map_err(|e| ArtifactError::io(&trash, "remove quarantined copy: remove", e))?;
    sync_dir(dir)
}

/// Writes `reason` into the copy `copy` whole: a temporary file, fsynced,
/// renamed over `quarantine.json`.
fn write_reason(copy: &Path, reason: &Reason) -> Result<()> {
    let path = copy.join(REASON);
    let tmp = copy.join(format!("{REASON}.tmp"));
    let mut bytes = serde_json::to_vec_pretty(reason).expect("a reason serializes");
    bytes.push(b'\n');
    // A temporary file left by a writer that died is stale.
    let _ = fs::remove_file(&tmp);
    write_synced(&tmp, &bytes)?;
    fs::rename(&tmp, &path).map_err(|e| ArtifactError::Io {
        context: format!("set aside: rename {} to {}", tmp.display(), path.display()),
        source: e,
    })?;
    sync_dir(copy)
}

fn mtime_seconds(path: &Path) -> u64 {
    fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(cause: &str, at: u64) -> Reason {
        Reason {
            cause: cause.into(),
            message: format!("restore: preflight: {cause}\nsecond line"),
            at,
            container: "c1".into(),
        }
    }

    /// `<root>/<name>` with one file holding `text`.
    fn artifact(root: &Path, name: &str, text: &str) {
        fs::create_dir_all(root.join(name).join("images")).unwrap();
        fs::write(root.join(name).join("images/pages-1.img"), text).unwrap();
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_artifact_is_set_aside_with_its_files_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        artifact(root, "m", "first");
        let to = set_aside(root, "m", &reason("damaged", 100)).unwrap();
        assert_eq!(to, Some(root.join(".quarantine/m")));
        assert!(!root.join("m").exists());
        let copy = root.join(".quarantine/m");
        assert_eq!(
            fs::read_to_string(copy.join("images/pages-1.img")).unwrap(),
            "first"
        );
        assert_eq!(read_reason(&copy).unwrap(), reason("damaged", 100));
        assert_eq!(names_in(&copy), ["images", "quarantine.json"]);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode(&root.join(DIR)), mode(&copy.join(REASON))),
            (0o700, 0o600)
        );
    }

    #[test]
    fn a_second_set_aside_of_a_name_replaces_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        artifact(root, "m", "first");
        set_aside(root, "m", &reason("damaged", 100)).unwrap();
        artifact(root, "m", "second");
        set_aside(root, "m", &reason("host", 200)).unwrap();
        let copy = root.join(".quarantine/m");
        assert_eq!(
            fs::read_to_string(copy.join("images/pages-1.img")).unwrap(),
            "second"
        );
        assert_eq!(read_reason(&copy).unwrap(), reason("host", 200));
        // No trash of the first is left behind.
        assert_eq!(names_in(&root.join(DIR)), ["m"]);
    }

    #[test]
    fn a_missing_artifact_is_not_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            set_aside(dir.path(), "m", &reason("host", 1)).unwrap(),
            None
        );
        assert!(!dir.path().join(DIR).exists());
        for bad in ["../m", ".quarantine", "a/b"] {
            assert!(set_aside(dir.path(), bad, &reason("host", 1)).is_err());
            assert!(remove(dir.path(), bad).is_err());
        }
    }

    #[test]
    fn copies_are_listed_by_name_and_an_unreadable_reason_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert!(list(root).unwrap().is_empty());
        for (name, cause) in [("zeta", "restore"), ("alpha", "host")] {
            artifact(root, name, name);
            set_aside(root, name, &reason(cause, 7)).unwrap();
        }
        artifact(root, "bare", "x");
        fs::rename(root.join("bare"), root.join(".quarantine/bare")).unwrap();
        fs::create_dir(root.join(".quarantine/.trash-old-1-0")).unwrap();
        let listed = list(root).unwrap();
        let names: Vec<(&str, &str)> = listed
            .iter()
            .map(|(n, r, _)| (n.as_str(), r.cause.as_str()))
            .collect();
        assert_eq!(
            names,
            [("alpha", "host"), ("bare", "unknown"), ("zeta", "restore")]
        );
        assert_eq!(listed[0].1, reason("host", 7));
        assert_eq!(listed[0].2, root.join(".quarantine/alpha"));
        assert!(
            listed[1].1.message.contains("quarantine.json"),
            "{:?}",
            listed[1].1
        );
        assert!(listed[1].1.at > 0);
    }

    #[test]
    fn a_copy_is_removed_and_removing_none_is_ok() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        remove(root, "m").unwrap();
        artifact(root, "m", "x");
        set_aside(root, "m", &reason("host", 1)).unwrap();
        remove(root, "m").unwrap();
        assert!(names_in(&root.join(DIR)).is_empty());
        remove(root, "m").unwrap();
    }

    #[test]
    fn a_reason_reads_back_as_written() {
        let r = reason("restore", 1_770_000_000);
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"cause":"restore","message":"restore: preflight: restore\nsecond line","at":1770000000,"container":"c1"}"#
        );
        assert_eq!(serde_json::from_str::<Reason>(&text).unwrap(), r);
    }
}
