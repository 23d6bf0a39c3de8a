//! The control dir: a private, empty-at-start directory through which engine and capturer
//! talk. Both sides check the same rules before every read and write, because a directory
//! an attacker can swap or pre-fill would let them forge an activation or an oracle.

use std::fs::{self, DirBuilder, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::error::{ProtocolError, Result};
use crate::file::{read_bytes, read_json, to_canonical_json, write_atomic_for, Received};
use crate::files;
use crate::messages::Message;

/// Whether opening a control dir also requires it to be empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The engine's view at start: nothing may be in the directory yet.
    Empty,
    /// Any contents (the rules on the directory and its ancestors still apply).
    AnyContents,
}

/// A validated control dir. The owner is the uid the engine runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlDir {
    path: PathBuf,
    owner: u32,
}

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl ControlDir {
    /// Creates a fresh, empty 0700 control dir owned by this process.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        Self::create_owned_by(path, euid(), None)
    }

    /// Creates a fresh, empty 0700 control dir and hands it to `uid` (and `gid` when
    /// given), for an engine that runs as another user. Missing ancestors are created
    /// 0755 so that user can reach the directory.
    pub fn create_owned_by(path: impl AsRef<Path>, uid: u32, gid: Option<u32>) -> Result<Self> {
        let path = checked_syntax(path.as_ref())?;
        check_ancestors(&path, uid)?;
        if let Some(parent) = path.parent() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| ProtocolError::io(parent, "mkdir", e))?;
        }
        match DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ProtocolError::unsafe_dir(
                    &path,
                    "already exists (a control dir must be fresh)",
                ))
            }
            Err(e) => return Err(ProtocolError::io(&path, "mkdir", e)),
        }
        // The umask may have removed bits but never adds any; set the mode explicitly anyway
        // so the result does not depend on the caller's umask.
        fs::set_permissions(&path, Permissions::from_mode(0o700))
            .map_err(|e| ProtocolError::io(&path, "chmod", e))?;
        if uid != euid() || gid.is_some() {
            std::os::unix::fs::chown(&path, Some(uid), gid)
                .map_err(|e| ProtocolError::io(&path, "chown", e))?;
        }
        Self::open_owned_by(path, uid, Expect::Empty)
    }

    /// Opens an existing control dir that must belong to this process's effective uid.
    pub fn open(path: impl AsRef<Path>, expect: Expect) -> Result<Self> {
        Self::open_owned_by(path, euid(), expect)
    }

    /// Opens an existing control dir that must belong to `owner` (the engine's uid).
    pub fn open_owned_by(path: impl AsRef<Path>, owner: u32, expect: Expect) -> Result<Self> {
        let dir = ControlDir {
            path: checked_syntax(path.as_ref())?,
            owner,
        };
        dir.validate()?;
        if expect == Expect::Empty {
            dir.ensure_empty()?;
        }
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid the directory must belong to.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// The path of a file inside the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Re-checks the directory rules: ancestors first (a symlinked ancestor would make every
    /// later check look at the wrong place), then the directory itself.
    pub fn validate(&self) -> Result<()> {
        check_ancestors(&self.path, self.owner)?;
        let meta = match fs::symlink_metadata(&self.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ProtocolError::unsafe_dir(&self.path, "does not exist"))
            }
            Err(e) => return Err(ProtocolError::io(&self.path, "lstat", e)),
        };
        let reason = if meta.file_type().is_symlink() {
            Some("is a symlink".to_string())
        } else if !meta.is_dir() {
            Some("is not a directory".to_string())
        } else if meta.uid() != self.owner {
            Some(format!(
                "owned by uid {}, expected uid {}",
                meta.uid(),
                self.owner
            ))
        } else if meta.mode() & 0o077 != 0 {
            Some(format!(
                "mode {:04o} grants group/other access (must be 0700)",
                meta.mode() & 0o7777
            ))
        } else {
            None
        };
        match reason {
            Some(reason) => Err(ProtocolError::unsafe_dir(&self.path, reason)),
            None => Ok(()),
        }
    }

    /// The names in the directory, sorted.
    pub fn entries(&self) -> Result<Vec<String>> {
        let read =
            fs::read_dir(&self.path).map_err(|e| ProtocolError::io(&self.path, "readdir", e))?;
        let mut names = Vec::new();
        for entry in read {
            let entry = entry.map_err(|e| ProtocolError::io(&self.path, "readdir", e))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    pub fn ensure_empty(&self) -> Result<()> {
        let names = self.entries()?;
        if names.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::NotEmpty {
                path: self.path.clone(),
                entries: names.join(", "),
            })
        }
    }

    /// Protocol files that an activation must not find (see
    /// [`files::STALE_BEFORE_ACTIVATION`]). Anything at those names counts, even a symlink.
    pub fn stale_files(&self) -> Result<Vec<&'static str>> {
        let mut stale = Vec::new();
        for name in files::STALE_BEFORE_ACTIVATION {
            let path = self.file(name);
            match fs::symlink_metadata(&path) {
                Ok(_) => stale.push(name),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ProtocolError::io(path, "lstat", e)),
            }
        }
        Ok(stale)
    }

    pub fn ensure_no_stale_files(&self) -> Result<()> {
        let stale = self.stale_files()?;
        if stale.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::StaleFiles {
                path: self.path.clone(),
                files: stale.join(", "),
            })
        }
    }

    /// Validates the directory, then reads one message strictly. `Ok(None)`: not there yet.
    pub fn read<T: Message>(&self) -> Result<Option<Received<T>>> {
        self.validate()?;
        read_json(&self.file(T::FILE))
    }

    /// Validates the directory, then reads a file's bytes strictly. `Ok(None)`: not there yet.
    pub fn read_raw(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.validate()?;
        read_bytes(&self.file(name))
    }

    /// Validates the message and the directory, then writes the message atomically as
    /// compact JSON with sorted keys. Returns the bytes written.
    pub fn write<T: Message>(&self, message: &T) -> Result<Vec<u8>> {
        let path = self.file(T::FILE);
        let bytes = to_canonical_json(&path, message)?;
        self.write_raw(T::FILE, &bytes)?;
        Ok(bytes)
    }

    /// Validates the directory, then writes bytes atomically. Written by another user
    /// than the directory's owner (the capturer as root), the file is given to the owner,
    /// the engine that reads it.
    pub fn write_raw(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.validate()?;
        let owner = (self.owner != euid()).then_some(self.owner);
        write_atomic_for(&self.file(name), bytes, owner)
    }
}

/// A control dir path is absolute and has no `..`, so what is checked is what is used.
fn checked_syntax(path: &Path) -> Result<PathBuf> {
    if !path.is_absolute() {
        return Err(ProtocolError::unsafe_dir(path, "path must be absolute"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(ProtocolError::unsafe_dir(
            path,
            "path must not contain `..`",
        ));
    }
    Ok(path.to_path_buf())
}

/// Every existing ancestor: a real directory, owned by root or `owner`, and not writable by
/// group or others unless it is root-owned and sticky (like /tmp).
fn check_ancestors(dir: &Path, owner: u32) -> Result<()> {
    for ancestor in dir.ancestors().skip(1) {
        let meta = match fs::symlink_metadata(ancestor) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ProtocolError::io(ancestor, "lstat", e)),
        };
        let shown = ancestor.display();
        let mode = meta.mode() & 0o7777;
        let uid = meta.uid();
        let sticky_root = uid == 0 && mode & 0o1000 != 0;
        let reason = if meta.file_type().is_symlink() {
            Some(format!("ancestor {shown} is a symlink"))
        } else if !meta.is_dir() {
            Some(format!("ancestor {shown} is not a directory"))
        } else if uid != 0 && uid != owner {
            Some(format!(
                "ancestor {shown} is owned by uid {uid} (expected root or uid {owner})"
            ))
        } else if mode & 0o020 != 0 && !sticky_root {
            Some(format!(
                "ancestor {shown} is group-writable (mode {mode:04o})"
            ))
        } else if mode & 0o002 != 0 && !sticky_root {
            Some(format!(
                "ancestor {shown} is world-writable (mode {mode:04o})"
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ProtocolError::unsafe_dir(dir, reason));
        }
    }
    Ok(())
}
