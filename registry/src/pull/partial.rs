//! A pull under way, the one place its chunks are written to:
//!
//! ```text
//! <root>/.pull/locks/<name>.lock     flock: one pull of <name> at a time
//! <root>/.pull/partial/<name>/       0700
//!     digest    the OCI manifest digest being pulled
//!     landed    a line per chunk that landed: its layer digest, appended
//!               once its bytes verified and are at every place of it
//!     arrived   the same, as places (file, offset, length) with the time:
//!               what a restore streaming from this pull follows
//!               (`vsnap_artifact::arrivals`; made afresh by each pull)
//!     sealed    with `seal_at_rest`: the tree's sealing (its salt), so
//!               that a pull taking the folder over seals alike (sealing.rs)
//!     tree/     the artifact as it will be published (images/, control/,
//!               dev-shm/, work/), every file made at its size (sparse)
//! ```
//!
//! A chunk lands once: it is fetched into memory, checked against its
//! digest (sealed: opened, tag and keyed id checked) and only then written
//! at each of its places in the tree: a chunk used twice is written twice,
//! both places being bytes of the artifact. No download cache, no
//! ciphertext and no second plaintext is kept: a pull needs the artifact's
//! size on disk. Each content chunk of the manifest is checked against its
//! digest once its last byte landed (checks.rs); with every chunk landed
//! the rest of the tree is checked (the chunks an earlier pull landed, or
//! all of it under a streamed restore) and renamed into place
//! (`Staging::publish`).
//!
//! A pull that dies leaves its partial folder, and the next pull of `<name>`
//! at the same digest takes it over: every chunk `landed` names is checked
//! again where it lies (in clear the sha256 of its bytes; sealed the sha256
//! of its envelope sealed again, sealing being deterministic), at each of
//! its places, and only those that hold are not fetched again. A partial
//! folder of another digest is removed first.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{DirBuilder, File};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use oci_client::manifest::OciDescriptor;
use vsnap_artifact::content::{self, Contents};
use vsnap_artifact::layout::Staging;
use vsnap_artifact::{ArtifactLock, HostKey, Manifest};

use crate::crypt::Sealer;
use crate::error::{RegistryError, Result};
use crate::index::ArtifactConfig;
use crate::sha256_digest;
use checks::Checks;
use records::{open_journal, open_record};
use sealing::Sealing;

/// Where one chunk's bytes go: a file of the tree (its index), an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    file: usize,
    offset: u64,
    len: u64,
}

/// What a partial pull is of: the artifact's description and layers.
pub(super) struct Spec {
    pub(super) root: PathBuf,
    pub(super) name: String,
    /// The OCI manifest digest.
    pub(super) digest: String,
    pub(super) config: ArtifactConfig,
    /// Layer digest to its size (sealed: the envelope's).
    pub(super) layers: BTreeMap<String, u64>,
    pub(super) sealer: Option<Sealer>,
    /// Threads that check the chunks a resumed pull finds.
    pub(super) threads: usize,
    /// Seal the pages files at rest with this host's key as they land.
    pub(super) seal_at_rest: bool,
    /// The manifest's content digests, each chunk checked against them as
    /// it becomes whole (checks.rs); None: at the publish only (a streamed
    /// pull, whose restore checks what it reads as it reads it).
    pub(super) check_landing: Option<Contents>,
}

pub(super) struct Partial {
    name: String,
    at: Folder,
    places: BTreeMap<String, Vec<Place>>,
    journal: Mutex<File>,
    /// The record of arrivals (stream.rs).
    arrived: Mutex<File>,
    /// Each file of the tree as the artifact names it, in the config's order.
    names: Vec<String>,
    sealer: Option<Sealer>,
    /// Where the tree is sealed at rest: its pages files' ciphers.
    at_rest: Option<Sealing>,
    /// The chunks checked as they landed (checks.rs).
    checks: Option<Checks>,
    /// The pull lock of `name`, held while this lives.
    _lock: File,
    /// Another pull held that lock when this one asked for it.
    waited: bool,
}

/// The partial folder of one name: its tree and the tree's files.
struct Folder {
    dir: PathBuf,
    tree: PathBuf,
    /// Each file of the tree and its mode, in the config's order.
    files: Vec<(PathBuf, u32)>,
}

impl Partial {
    /// The partial pull of `spec.name` at `spec.digest`, taken over when an
    /// earlier pull left one (waiting while another pull of that name runs),
    /// else made afresh; with the chunks already landed and still holding.
    pub(super) fn open(spec: &Spec) -> Result<(Self, BTreeSet<String>)> {
        let pulls = spec.root.join(".pull");
        for d in [pulls.clone(), pulls.join("locks"), pulls.join("partial")] {
            mkdir(&d)?;
        }
        // The download cache of an earlier vsnap: nothing reads it now.
        let _ = std::fs::remove_dir_all(pulls.join("blobs"));
        let (lock, waited) = take_lock(&pulls.join("locks").join(format!("{}.lock", spec.name)))?;
        let dir = pulls.join("partial").join(&spec.name);
        let tree = dir.join("tree");
        let files = spec
            .config
            .files
            .iter()
            .map(|f| (tree.join(&f.path), f.mode))
            .collect();
        let at = Folder { dir, tree, files };
        let overhead = match spec.sealer {
            Some(_) => crate::crypt::OVERHEAD,
            None => 0,
        };
        let places = places(&spec.config, &spec.layers, overhead);
        // Whatever an earlier pull left that cannot be taken over is
        // started again.
        let recorded = match at.take_over(spec, &places) {
            Ok(recorded) => recorded,
            Err(_) => at.start(spec)?,
        };
        let rels: Vec<&str> = spec.config.files.iter().map(|f| f.path.as_str()).collect();
        let at_rest = match spec.seal_at_rest {
            true => Some(Sealing::of(&at.dir, &spec.root, &rels)?),
            false => None,
        };
        let names: Vec<String> = spec.config.files.iter().map(|f| f.path.clone()).collect();
        let checks = spec
            .check_landing
            .clone()
            .map(|c| Checks::new(c, names.clone()));
        let partial = Partial {
            at_rest,
            checks,
            name: spec.name.to_string(),
            journal: Mutex::new(open_journal(&at.dir.join("landed"))?),
            arrived: Mutex::new(open_record(&at.dir)?),
            names,
            at,
            places,
            sealer: spec.sealer.clone(),
            _lock: lock,
            waited,
        };
        let landed = partial.recheck(recorded, spec.threads);
        partial.check_room(&spec.root, &landed)?;
        for digest in &landed {
            partial.record_arrival(digest)?;
            // What an earlier pull landed is checked at the publish.
            if let Some(c) = &partial.checks {
                c.landed(digest, spans(&partial.places[digest]));
            }
        }
        Ok((partial, landed))
    }

    /// The layers not landed yet, in the order of their first place in the
    /// tree (files in order, each from its start): the tree is written
    /// front to back as far as the fetches' order allows.
    pub(super) fn to_fetch<'l>(
        &self,
        layers: &'l [OciDescriptor],
        landed: &BTreeSet<String>,
    ) -> Vec<&'l OciDescriptor> {
        let mut todo: Vec<(Place, &OciDescriptor)> = layers
            .iter()
            .filter(|l| !landed.contains(&l.digest))
            .filter_map(|l| Some((*self.places.get(&l.digest)?.first()?, l)))
            .collect();
        todo.sort_by_key(|(p, _)| *p);
        todo.into_iter().map(|(_, l)| l).collect()
    }

    /// The layer `digest` (its bytes checked against the digest already),
    /// opened when sealed, written at each of its places and recorded as
    /// landed. `files` names them in errors.
    pub(super) fn land(&self, digest: &str, layer: Vec<u8>, files: &str) -> Result<()> {
        let plain = match &self.sealer {
            Some(s) => s.open(layer).map_err(|e| {
                RegistryError::Damaged(format!(
                    "pull: blob {digest} ({files}) {e} (fleet key {})",
                    s.key_id()
                ))
            })?,
            None => layer,
        };
        let places = self.places.get(digest).map(Vec::as_slice).unwrap_or(&[]);
        let mut sealed = Vec::new();
        for p in places {
            let path = &self.at.files[p.file].0;
            if plain.len() as u64 != p.len {
                return Err(RegistryError::Damaged(format!(
                    "pull: blob {digest} ({files}) holds {} bytes, its place in {} {}",
                    plain.len(),
                    path.display(),
                    p.len
                )));
            }
            let file = File::options()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| io(format!("pull: open {}", path.display()), e))?;
            // Sealed at rest: sealed at its place as it is written.
            let bytes = match &self.at_rest {
                Some(s) if s.seals(p.file) => {
                    sealed.clear();
                    sealed.extend_from_slice(&plain);
                    s.apply(p.file, p.offset, &mut sealed);
                    &sealed
                }
                _ => &plain,
            };
            file.write_all_at(bytes, p.offset)
                .map_err(|e| io(format!("pull: write {}", path.display()), e))?;
            start_writeback(&file, p.offset, p.len);
        }
        let mut journal = self.journal.lock().expect("not poisoned");
        journal
            .write_all(format!("{digest}\n").as_bytes())
            .map_err(|e| {
                let record = self.at.dir.join("landed");
                io(format!("pull: write {}", record.display()), e)
            })?;
        drop(journal);
        self.record_arrival(digest)?;
        self.check_whole(digest, places)
    }

    /// The content chunks layer `digest`, landed at `places`, made whole,
    /// checked against their digests (checks.rs).
    fn check_whole(&self, digest: &str, places: &[Place]) -> Result<()> {
        let Some(checks) = &self.checks else {
            return Ok(());
        };
        for chunk in checks.landed(digest, spans(places)) {
            let cipher = self.at_rest.as_ref().and_then(|s| s.cipher(chunk.0));
            checks.check(&self.at.tree, chunk, cipher)?;
        }
        Ok(())
    }

    /// Of the chunks an earlier pull recorded, those whose bytes still
    /// hold at every place, checked on `threads` threads.
    fn recheck(&self, recorded: Vec<String>, threads: usize) -> BTreeSet<String> {
        let recorded: Vec<String> = recorded
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let next = AtomicUsize::new(0);
        let holding = Mutex::new(BTreeSet::new());
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, recorded.len().max(1)) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(digest) = recorded.get(i) else {
                        return;
                    };
                    if self.holds(digest) {
                        holding.lock().expect("not poisoned").insert(digest.clone());
                    }
                });
            }
        });
        holding.into_inner().expect("not poisoned")
    }

    /// Whether chunk `digest` is at each of its places.
    fn holds(&self, digest: &str) -> bool {
        let places = &self.places[digest];
        let Some(plain) = self.read_place(places[0]) else {
            return false;
        };
        let sealed;
        let layer = match &self.sealer {
            Some(s) => {
                sealed = s.seal(&plain);
                &sealed
            }
            None => &plain,
        };
        sha256_digest(layer) == digest
            && places[1..]
                .iter()
                .all(|p| self.read_place(*p).is_some_and(|b| b == plain))
    }

    fn read_place(&self, p: Place) -> Option<Vec<u8>> {
        let file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.at.files[p.file].0)
            .ok()?;
        let mut buf = vec![0u8; p.len as usize];
        file.read_exact_at(&mut buf, p.offset).ok()?;
        if let Some(s) = &self.at_rest {
            s.apply(p.file, p.offset, &mut buf);
        }
        Some(buf)
    }

    /// Refuses to start fetching when the artifact root's file system lacks
    /// the room for the bytes still to land.
    fn check_room(&self, root: &Path, landed: &BTreeSet<String>) -> Result<()> {
        let total: u64 = self.places.values().flatten().map(|p| p.len).sum();
        let here: u64 = landed
            .iter()
            .flat_map(|d| &self.places[d])
            .map(|p| p.len)
            .sum();
        let free =
            free_bytes(root).map_err(|e| io(format!("pull: statvfs {}", root.display()), e))?;
        room(root, free, total, here)
    }

    /// Under the artifact's exclusive lock: the tree checked against the
    /// manifest's content digests (the chunks not checked as they landed),
    /// the manifest sealed with this host's key
    /// and the tree published as `<root>/<name>`; the partial folder is
    /// then removed (with the previous artifact of that name, exchanged
    /// into it). A name in use (`locked`) keeps the partial folder for the
    /// next try; a tree that does not verify is removed. Returns the
    /// milliseconds of (verify, publish).
    pub(super) fn publish(
        self,
        root: &Path,
        mut manifest: Manifest,
        threads: usize,
    ) -> Result<(u64, u64)> {
        for (path, mode) in &self.at.files {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o755))
                .map_err(|e| io(format!("pull: chmod {}", path.display()), e))?;
        }
        let _lock = ArtifactLock::exclusive(root, &self.name)?;
        let phase = std::time::Instant::now();
        let opener = self.at_rest.as_ref().map(|s| &s.opener);
        let tree = &self.at.tree;
        let checked =
            |rel: &str, chunk: usize| self.checks.as_ref().is_some_and(|c| c.checked(rel, chunk));
        let contents = &manifest.contents;
        if let Err(e) = content::verify_opened_except(tree, contents, threads, opener, &checked) {
            self.remove();
            return Err(e.into());
        }
        let verify = super::report::ms(phase);
        let phase = std::time::Instant::now();
        // A streamed pull put the same manifest in the tree at its head:
        // the publish writes it anew, last.
        let _ = std::fs::remove_file(self.at.tree.join(vsnap_artifact::layout::MANIFEST));
        // This host's sealing, never the pushing host's.
        manifest.sealed = self.at_rest.as_ref().map(|s| s.sealed.clone());
        let published = HostKey::load_or_create(root).and_then(|key| {
            manifest.seal(&key);
            Staging::adopt(self.at.tree.clone(), &self.name).publish(root, &manifest.to_bytes())
        });
        self.remove();
        published?;
        Ok((verify, super::report::ms(phase)))
    }

    /// Removes the partial folder: nothing of it is needed any more.
    pub(super) fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.at.dir);
    }

    /// Whether another pull of the name held the pull lock first.
    pub(super) fn waited(&self) -> bool {
        self.waited
    }
}

impl Folder {
    /// The chunks `landed` records, when the partial folder is of this
    /// digest and its tree can be made whole again.
    fn take_over(&self, spec: &Spec, places: &BTreeMap<String, Vec<Place>>) -> Result<Vec<String>> {
        let digest = read(&self.dir.join("digest"))?;
        if digest.trim() != spec.digest {
            return Err(RegistryError::Invalid("another digest".into()));
        }
        let landed = read(&self.dir.join("landed"))?;
        self.make_tree(&spec.config)?;
        Ok(landed
            .lines()
            .filter(|l| places.contains_key(*l))
            .map(str::to_string)
            .collect())
    }

    /// An empty partial folder for `spec.digest`, anything there before
    /// removed.
    fn start(&self, spec: &Spec) -> Result<Vec<String>> {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("pull: remove {}", self.dir.display()), e)),
        }
        mkdir(&self.dir)?;
        let digest_file = self.dir.join("digest");
        std::fs::write(&digest_file, format!("{}\n", spec.digest))
            .map_err(|e| io(format!("pull: write {}", digest_file.display()), e))?;
        self.make_tree(&spec.config)?;
        Ok(Vec::new())
    }

    /// The tree's folders and every file at its size: made when missing,
    /// cut or grown when not of its size (a hole reads as zeros, which the
    /// chunks' check then refuses), never through a symlink.
    fn make_tree(&self, config: &ArtifactConfig) -> Result<()> {
        mkdir(&self.tree)?;
        for sub in ["images", "work", "control"] {
            mkdir(&self.tree.join(sub))?;
        }
        for ((path, _), f) in self.files.iter().zip(&config.files) {
            let parent = path.parent().expect("a checked path has a folder");
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| io(format!("pull: create {}", parent.display()), e))?;
            let file = File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| io(format!("pull: create {}", path.display()), e))?;
            let md = file
                .metadata()
                .map_err(|e| io(format!("pull: stat {}", path.display()), e))?;
            if !md.is_file() {
                return Err(RegistryError::Invalid(format!(
                    "pull: {} is not a regular file",
                    path.display()
                )));
            }
            if md.len() != f.size {
                file.set_len(f.size)
                    .map_err(|e| io(format!("pull: truncate {}", path.display()), e))?;
            }
        }
        Ok(())
    }
}

/// Every place of every layer: the chunks of each file in order, each
/// `overhead` bytes smaller than its layer.
fn places(
    config: &ArtifactConfig,
    layers: &BTreeMap<String, u64>,
    overhead: u64,
) -> BTreeMap<String, Vec<Place>> {
    let mut places: BTreeMap<String, Vec<Place>> = BTreeMap::new();
    for (file, f) in config.files.iter().enumerate() {
        let mut offset = 0;
        for c in &f.chunks {
            // Checked: every chunk is a layer at least `overhead` large.
            let len = layers[c] - overhead;
            places
                .entry(c.clone())
                .or_default()
                .push(Place { file, offset, len });
            offset += len;
        }
    }
    places
}

/// Each of `places` as (file, offset, length).
fn spans(places: &[Place]) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
    places.iter().map(|p| (p.file, p.offset, p.len))
}

/// Whether `free` bytes hold what is still to land of `total` with `here`
/// landed; else the error saying so.
fn room(root: &Path, free: u64, total: u64, here: u64) -> Result<()> {
    let need = total.saturating_sub(here);
    if need <= free {
        return Ok(());
    }
    Err(io(
        format!("pull: {}", root.display()),
        std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!("{free} bytes free, the artifact needs {need} more ({here} of its {total} bytes are here)"),
        ),
    ))
}

fn io(context: String, e: std::io::Error) -> RegistryError {
    RegistryError::io(context, e)
}

fn mkdir(dir: &Path) -> Result<()> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(io(format!("pull: create {}", dir.display()), e)),
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| io(format!("pull: read {}", path.display()), e))
}

/// The pull lock at `path`, waited for while another pull holds it; and
/// whether it was.
fn take_lock(path: &Path) -> Result<(File, bool)> {
    let file = vsnap_artifact::lock::open_lock_file(path)?;
    let waited = match file.try_lock() {
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock) => {
            file.lock()
                .map_err(|e| io(format!("pull: lock {}", path.display()), e))?;
            true
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(io(format!("pull: lock {}", path.display()), e))
        }
    };
    Ok((file, waited))
}

/// Starts writing `len` bytes at `offset` of `file` back to the disk, not
/// waiting for it: the fsync before the publish then finds most of the
/// artifact written already, the disk having worked while chunks arrived.
/// Only a head start: that fsync still decides, and reports any error.
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only schedules write-back
    // of its pages and touches no memory of ours.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

/// Bytes an unprivileged writer may still use on the file system of `path`.
fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a NUL in the path"))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is written by statvfs
    // before it is read (only when it returns 0).
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // Both are 64 bits wide here, not on every target.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

mod checks;
mod records;
mod sealing;
mod stream;
#[cfg(test)]
mod tests;
