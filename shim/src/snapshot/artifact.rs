//! An artifact on disk: `<root>/<name>/` (0700) holding `images/` (CRIU),
//! `control/` (the control-dir files at capture time) and `manifest.json`
//! (0600, written last). It is built in a staging folder beside it and
//! published by an atomic rename (an exchange when an older artifact of the
//! same name exists, so the old one stays intact until the new one is whole).

use std::fs::{self, DirBuilder, File};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use vsnap_protocol::Oracle;

use crate::error::{Error, Result};

pub const MANIFEST: &str = "manifest.json";
pub const SCHEMA_VERSION: u32 = 1;
const MANIFEST_MAX_BYTES: u64 = 1 << 20;

static STAGING: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema_version: u32,
    pub name: String,
    pub created_at: String,
    pub capture_id: String,
    pub oracle: Oracle,
    /// The container the capture was taken from.
    pub source_container: String,
    pub image_bytes: u64,
    pub timings_ms: Timings,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Timings {
    pub cold_start_to_capture_ready: u64,
    pub inventory: u64,
    pub checkpoint: u64,
}

/// `<root>/<name>`.
pub fn path(root: &Path, name: &str) -> PathBuf {
    root.join(name)
}

/// Creates the artifact root (0700) if missing and checks every component.
pub fn ensure_root(root: &Path) -> Result<()> {
    if !root.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| Error::io(format!("artifact root {}", root.display()), e))?;
    }
    check_path_safe(root)
}

/// Every component of `path`: no symlink, root-owned, not group/world
/// writable unless root-owned and sticky.
pub fn check_path_safe(path: &Path) -> Result<()> {
    let mut current = PathBuf::from("/");
    for part in path.components().skip(1) {
        current.push(part);
        let md = fs::symlink_metadata(&current)
            .map_err(|e| Error::io(format!("preflight: {}", current.display()), e))?;
        if md.file_type().is_symlink() {
            return Err(Error::FailedPrecondition(format!(
                "preflight: {} is a symlink",
                current.display()
            )));
        }
        let mode = md.mode() & 0o7777;
        if md.uid() != 0 {
            return Err(Error::FailedPrecondition(format!(
                "preflight: {} is owned by uid {}, not root",
                current.display(),
                md.uid()
            )));
        }
        let sticky = mode & 0o1000 != 0;
        if mode & 0o022 != 0 && !sticky {
            return Err(Error::FailedPrecondition(format!(
                "preflight: {} is group/world-writable (mode {:04o})",
                current.display(),
                mode
            )));
        }
    }
    Ok(())
}

/// A staging folder beside the final artifact, removed unless published.
pub struct Staging {
    pub dir: PathBuf,
    published: bool,
}

impl Staging {
    pub fn new(root: &Path, name: &str) -> Result<Self> {
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!(".staging-{name}-{}-{n}", std::process::id()));
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::io(format!("capture: staging {}", dir.display()), e))?;
        for sub in ["images", "work", "control"] {
            DirBuilder::new()
                .mode(0o700)
                .create(dir.join(sub))
                .map_err(|e| Error::io(format!("capture: staging {}", dir.display()), e))?;
        }
        Ok(Self {
            dir,
            published: false,
        })
    }

    pub fn images(&self) -> PathBuf {
        self.dir.join("images")
    }

    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    pub fn control(&self) -> PathBuf {
        self.dir.join("control")
    }

    /// Writes the manifest (0600, fsync) and renames the staging folder to
    /// `<root>/<name>`, swapping out an older artifact atomically.
    pub fn publish(mut self, root: &Path, manifest: &Manifest) -> Result<PathBuf> {
        // CRIU's work folder holds logs only: keep them for diagnosis.
        let bytes = serde_json::to_vec_pretty(manifest)
            .map_err(|e| Error::Other(format!("capture: manifest: {e}")))?;
        write_synced(&self.dir.join(MANIFEST), &bytes)?;
        sync_dir(&self.dir)?;
        let target = path(root, &manifest.name);
        let exchanged = if target.exists() {
            nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &self.dir,
                nix::fcntl::AT_FDCWD,
                &target,
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(|e| Error::io(format!("capture: publish {}", target.display()), e.into()))?;
            true
        } else {
            fs::rename(&self.dir, &target)
                .map_err(|e| Error::io(format!("capture: publish {}", target.display()), e))?;
            false
        };
        sync_dir(root)?;
        self.published = !exchanged;
        // After an exchange the staging path holds the previous artifact:
        // dropping `self` removes it.
        Ok(target)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("fsync {}", dir.display()), e))
}

/// Total size of the regular files under `dir`.
pub fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += bytes_under(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// Checks a published artifact before anything runs from it and returns its
/// manifest: safe path, 0700 folder, 0600 root-owned manifest, strict schema.
pub fn validate(root: &Path, name: &str) -> Result<Manifest> {
    let dir = path(root, name);
    let fail = |m: String| Error::FailedPrecondition(format!("restore: preflight: {m}"));
    if fs::symlink_metadata(&dir).is_err() {
        return Err(Error::NotFound(format!(
            "restore: preflight: artifact {} does not exist",
            dir.display()
        )));
    }
    check_path_safe(&dir).map_err(|e| fail(e.to_string().replace("preflight: ", "")))?;
    let md = fs::symlink_metadata(&dir).map_err(|e| Error::io("restore: preflight", e))?;
    if md.mode() & 0o777 != 0o700 {
        return Err(fail(format!(
            "{} has mode {:04o}, expected 0700",
            dir.display(),
            md.mode() & 0o7777
        )));
    }
    let manifest_path = dir.join(MANIFEST);
    let mmd = fs::symlink_metadata(&manifest_path)
        .map_err(|e| fail(format!("{}: {e}", manifest_path.display())))?;
    if !mmd.file_type().is_file() {
        return Err(fail(format!(
            "{} is not a regular file",
            manifest_path.display()
        )));
    }
    if mmd.mode() & 0o777 != 0o600 || mmd.uid() != 0 {
        return Err(fail(format!(
            "{} has mode {:04o} owner {}, expected 0600 root",
            manifest_path.display(),
            mmd.mode() & 0o7777,
            mmd.uid()
        )));
    }
    if mmd.len() > MANIFEST_MAX_BYTES {
        return Err(fail(format!("{} is too large", manifest_path.display())));
    }
    let bytes =
        fs::read(&manifest_path).map_err(|e| fail(format!("{}: {e}", manifest_path.display())))?;
    let manifest: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| fail(format!("{}: {e}", manifest_path.display())))?;
    if manifest.schema_version != SCHEMA_VERSION {
        return Err(fail(format!(
            "{}: schema_version {} is not {SCHEMA_VERSION}",
            manifest_path.display(),
            manifest.schema_version
        )));
    }
    if manifest.name != name {
        return Err(fail(format!(
            "{}: names artifact {:?}, not {name:?}",
            manifest_path.display(),
            manifest.name
        )));
    }
    for sub in ["images", "control"] {
        let p = dir.join(sub);
        let ok = fs::symlink_metadata(&p)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if !ok {
            return Err(fail(format!("{} is missing", p.display())));
        }
    }
    Ok(manifest)
}

/// Copies the regular files of `from` into `to` (0600), for control dirs.
pub fn copy_files(from: &Path, to: &Path) -> Result<()> {
    for e in fs::read_dir(from).map_err(|e| Error::io(format!("read {}", from.display()), e))? {
        let e = e.map_err(|e| Error::io(format!("read {}", from.display()), e))?;
        let md = fs::symlink_metadata(e.path()).map_err(|err| Error::io("copy", err))?;
        if !md.file_type().is_file() || e.file_name().to_string_lossy().ends_with(".tmp") {
            continue;
        }
        let bytes = fs::read(e.path())
            .map_err(|err| Error::io(format!("read {}", e.path().display()), err))?;
        let dest = to.join(e.file_name());
        write_synced(&dest, &bytes)?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o600))
            .map_err(|err| Error::io(format!("chmod {}", dest.display()), err))?;
    }
    sync_dir(to)
}
