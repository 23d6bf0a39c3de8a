//! The partial folders an interrupted `vsnap pull` leaves for the next pull
//! of a name to resume from (registry/src/pull/partial.rs), as `vsnap gc`
//! sees them: `<root>/.pull/partial/<name>/`, guarded by the pull lock
//! `<root>/.pull/locks/<name>.lock`, an flock a pull holds from its start
//! to its publish (and so while a restore streams from it). Their age,
//! their allocated bytes (the tree is sparse) and their removal under that
//! lock. Nothing here follows a symlink.

use std::fs::{self, DirBuilder, TryLockError};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use vsnap_artifact::lock::open_lock_file;

use crate::store::{self, RemoveError};

/// Where the partial folders are, under the root.
pub const DIR: &str = ".pull/partial";
const LOCKS: &str = ".pull/locks";
/// What a pull writes as it works: the newest mtime of these and of the
/// folder itself is when a pull last worked in it.
const RECORDS: [&str; 3] = ["digest", "landed", "arrived"];

/// One entry of `<root>/.pull/partial/` (or that folder itself when it is
/// not a folder).
pub struct Partial {
    /// Its path under the root, as gc shows it.
    pub shown: String,
    /// The artifact name it is the partial folder of, or why it is none
    /// (left alone).
    pub name: Result<String, String>,
    /// Since a pull last worked in it (see [`RECORDS`]).
    pub age: Duration,
    /// Allocated bytes: what removing it frees.
    pub bytes: u64,
}

/// The entries of `<root>/.pull/partial/`, sorted; none when it is missing.
pub fn list(root: &Path) -> Result<Vec<Partial>, String> {
    for dir in [".pull", DIR] {
        let path = root.join(dir);
        match folder(&path) {
            Ok(true) => {}
            Ok(false) => return Ok(Vec::new()),
            Err(why) => return Ok(vec![odd(dir.to_string(), &path, why)]),
        }
    }
    let dir = root.join(DIR);
    let read = |e: io::Error| format!("read {}: {e}", dir.display());
    let mut out = Vec::new();
    for e in fs::read_dir(&dir).map_err(read)? {
        let e = e.map_err(read)?;
        let file_name = e.file_name().to_string_lossy().into_owned();
        let shown = format!("{DIR}/{file_name}");
        let path = e.path();
        if let Err(why) = store::check_name(&file_name) {
            // `"NAME" is not an artifact name (the rule)`.
            out.push(odd(shown, &path, why));
            continue;
        }
        match folder(&path) {
            Ok(true) => out.push(Partial {
                shown,
                age: age(&path),
                bytes: allocated(&path),
                name: Ok(file_name),
            }),
            // Gone since it was listed.
            Ok(false) => {}
            Err(why) => out.push(odd(shown, &path, why)),
        }
    }
    out.sort_by(|a, b| a.shown.cmp(&b.shown));
    Ok(out)
}

/// An entry gc leaves alone, and why.
fn odd(shown: String, path: &Path, why: String) -> Partial {
    Partial {
        shown,
        name: Err(format!("{why}: left alone")),
        age: store::mtime(path).map(store::age_since).unwrap_or_default(),
        bytes: allocated(path),
    }
}

/// Whether `path` is a folder (not a symlink to one): Ok(false) when
/// missing, Err(why) when it is something else.
fn folder(path: &Path) -> Result<bool, String> {
    match fs::symlink_metadata(path) {
        Ok(md) if md.is_dir() => Ok(true),
        Ok(md) if md.file_type().is_symlink() => Err("a symlink, not a folder".into()),
        Ok(_) => Err("not a folder".into()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("stat: {e}")),
    }
}

/// Since a pull last worked in the partial folder `dir`: the newest mtime
/// of the folder and of its records.
fn age(dir: &Path) -> Duration {
    let newest = RECORDS
        .iter()
        .filter_map(|r| store::mtime(&dir.join(r)))
        .chain(store::mtime(dir))
        .max();
    newest
        .unwrap_or(SystemTime::UNIX_EPOCH)
        .elapsed()
        .unwrap_or_default()
}

/// The bytes allocated to `path` and, for a folder, to everything under it
/// (as `du`: a sparse file counts the blocks it holds, not its length).
pub fn allocated(path: &Path) -> u64 {
    let Ok(md) = fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = md.blocks() * 512;
    if md.is_dir() {
        if let Ok(entries) = fs::read_dir(path) {
            total += entries.flatten().map(|e| allocated(&e.path())).sum::<u64>();
        }
    }
    total
}

/// Removes the partial folder of `name` if a pull last worked in it longer
/// ago than `limit`, holding its pull lock, taken without waiting: a pull
/// under way (or a restore streaming from one) keeps it (`InUse`), and a
/// pull that starts meanwhile waits until it is gone, then starts afresh.
/// Returns the bytes freed.
pub fn remove(root: &Path, name: &str, limit: Duration) -> Result<u64, RemoveError> {
    let failed = |what: &str, path: &Path, e: io::Error| {
        RemoveError::Failed(format!("{what} {}: {e}", path.display()))
    };
    let locks = root.join(LOCKS);
    match DirBuilder::new().mode(0o700).create(&locks) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(failed("create", &locks, e)),
    }
    folder(&locks).map_err(|why| RemoveError::Failed(format!("{}: {why}", locks.display())))?;
    let path = locks.join(format!("{name}.lock"));
    let lock = open_lock_file(&path).map_err(|e| RemoveError::Failed(e.to_string()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(RemoveError::InUse),
        Err(TryLockError::Error(e)) => return Err(failed("lock", &path, e)),
    }
    let dir = root.join(DIR).join(name);
    match folder(&dir) {
        Ok(true) => {}
        // Published by a pull since it was listed.
        Ok(false) => return Err(RemoveError::NotFound),
        Err(why) => return Err(RemoveError::Failed(format!("{}: {why}", dir.display()))),
    }
    // A pull worked in it since it was listed (and let go): kept for the
    // next one to resume from.
    if age(&dir) <= limit {
        return Err(RemoveError::InUse);
    }
    let bytes = allocated(&dir);
    // Its digest first: a removal cut short leaves a folder the next pull
    // starts afresh in, never one it takes over.
    match fs::remove_file(dir.join("digest")) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed("remove", &dir.join("digest"), e)),
    }
    fs::remove_dir_all(&dir).map_err(|e| failed("remove", &dir, e))?;
    Ok(bytes)
}
