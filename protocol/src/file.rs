//! Strict reads and atomic writes of protocol files.
//!
//! A protocol file is never seen half-written: writers create `<name>.tmp` exclusively,
//! fsync it, rename it over `<name>` and fsync the directory. So a reader treats anything
//! odd (a symlink, a fifo, a truncated document, a key it does not know) as a hard failure
//! rather than something to wait out; only a missing file means "not yet".

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{ProtocolError, Result};
use crate::messages::Schema;

/// Largest protocol file accepted, in bytes.
pub const MAX_FILE_BYTES: u64 = 65_536;

/// A message together with the exact bytes it was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct Received<T> {
    pub value: T,
    pub bytes: Vec<u8>,
    pub path: PathBuf,
}

/// Reads a protocol file's bytes: regular file only (a symlink is refused, not followed),
/// at most [`MAX_FILE_BYTES`]. `Ok(None)` when the file does not exist.
pub fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ProtocolError::io(path, "lstat", e)),
    };
    check_regular(path, &meta)?;
    // O_NOFOLLOW closes the window between lstat and open; O_NONBLOCK keeps a fifo swapped
    // in meanwhile from blocking the open. A rename over the file in that window is fine:
    // it is another complete version, and the fstat below checks it again.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ProtocolError::Symlink { path: path.into() })
        }
        Err(e) => return Err(ProtocolError::io(path, "open", e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| ProtocolError::io(path, "fstat", e))?;
    check_regular(path, &meta)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ProtocolError::io(path, "read", e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ProtocolError::TooLarge {
            path: path.into(),
            size: meta.len().max(bytes.len() as u64),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(Some(bytes))
}

fn check_regular(path: &Path, meta: &fs::Metadata) -> Result<()> {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        return Err(ProtocolError::Symlink { path: path.into() });
    }
    if !file_type.is_file() {
        let kind = if file_type.is_dir() {
            "directory"
        } else if file_type.is_fifo() {
            "fifo"
        } else if file_type.is_socket() {
            "socket"
        } else if file_type.is_block_device() || file_type.is_char_device() {
            "device"
        } else {
            "unknown type"
        };
        return Err(ProtocolError::NotRegularFile {
            path: path.into(),
            kind,
        });
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ProtocolError::TooLarge {
            path: path.into(),
            size: meta.len(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(())
}

/// Parses exactly one JSON object into `T` and checks its values. `path` only names the
/// source in errors.
pub fn parse<T: Schema>(path: &Path, bytes: &[u8]) -> Result<T> {
    // serde also accepts a struct written as a JSON array; the protocol allows objects only.
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(malformed(path, "empty file")),
        Some(b'{') => {}
        Some(_) => return Err(malformed(path, "not a JSON object")),
    }
    let value: T = serde_json::from_slice(bytes).map_err(|e| malformed(path, e.to_string()))?;
    value
        .check()
        .map_err(|detail| ProtocolError::invalid(path, detail))?;
    Ok(value)
}

fn malformed(path: &Path, detail: impl Into<String>) -> ProtocolError {
    ProtocolError::Malformed {
        path: path.into(),
        detail: detail.into(),
    }
}

/// Reads and parses a protocol file. `Ok(None)` when the file does not exist.
pub fn read_json<T: Schema>(path: &Path) -> Result<Option<Received<T>>> {
    let Some(bytes) = read_bytes(path)? else {
        return Ok(None);
    };
    let value = parse(path, &bytes)?;
    Ok(Some(Received {
        value,
        bytes,
        path: path.into(),
    }))
}

/// Checks a message and renders it as compact JSON with keys sorted at every level.
/// `path` only names the destination in errors.
pub fn to_canonical_json<T: Schema>(path: &Path, message: &T) -> Result<Vec<u8>> {
    // Checking first also keeps a non-finite float from being written as `null`.
    message
        .check()
        .map_err(|detail| ProtocolError::invalid(path, format!("refusing to write: {detail}")))?;
    let value = serde_json::to_value(message).map_err(|e| malformed(path, e.to_string()))?;
    // Sort explicitly: if another crate in the build enables serde_json's `preserve_order`,
    // maps keep insertion order instead of sorting.
    serde_json::to_vec(&sorted(value)).map_err(|e| malformed(path, e.to_string()))
}

fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Writes `bytes` to `path` so a reader sees either the old file or the whole new one:
/// `<name>.tmp` is created with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, written, fsynced
/// and renamed over `<name>`; then the directory is fsynced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_for(path, bytes, None)
}

/// [`write_atomic`] for a reader running as another user (`owner`, a uid): the file is
/// given to it before it appears under its name, so it is never a 0600 file the reader
/// cannot open. Changing the owner needs root (CAP_CHOWN).
pub fn write_atomic_for(path: &Path, bytes: &[u8], owner: Option<u32>) -> Result<()> {
    let Some(name) = path.file_name() else {
        return Err(ProtocolError::invalid(path, "no file name"));
    };
    let mut tmp_name = name.to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(|e| ProtocolError::io(&tmp, "create", e))?;
    let given = match owner {
        Some(uid) => std::os::unix::fs::fchown(&file, Some(uid), None)
            .map_err(|e| ProtocolError::io(&tmp, "chown", e)),
        None => Ok(()),
    };
    let written = given
        .and_then(|()| {
            file.write_all(bytes)
                .map_err(|e| ProtocolError::io(&tmp, "write", e))
        })
        .and_then(|()| {
            file.sync_all()
                .map_err(|e| ProtocolError::io(&tmp, "fsync", e))
        })
        .and_then(|()| fs::rename(&tmp, path).map_err(|e| ProtocolError::io(path, "rename", e)));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ProtocolError::io(dir, "fsync", e))
}
