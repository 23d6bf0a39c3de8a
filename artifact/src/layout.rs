//! Paths, safety checks, staging and atomic publish.

use std::fs::{self, DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use crate::durable::write_synced;
use crate::error::{ArtifactError, Result};

/// The manifest's file name in an artifact folder.
pub const MANIFEST: &str = "manifest.json";

static STAGING: AtomicU64 = AtomicU64::new(0);

/// `<root>/<name>`.
pub fn path(root: &Path, name: &str) -> PathBuf {
    root.join(name)
}

/// The artifact name rule ([`crate::ArtifactName`]), as a check.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    crate::ArtifactName::new(name)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Creates the artifact root (0700) if missing and checks every component.
pub fn ensure_root(root: &Path) -> Result<()> {
    if !root.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| ArtifactError::io(root, "create artifact root", e))?;
    }
    check_path_safe(root)
}

/// Every component of `path`: no symlink, owned by root, not group/world
/// writable unless root-owned and sticky.
pub fn check_path_safe(path: &Path) -> Result<()> {
    let mut current = PathBuf::from("/");
    for part in path.components().skip(1) {
        current.push(part);
        let md =
            fs::symlink_metadata(&current).map_err(|e| ArtifactError::io(&current, "stat", e))?;
        if md.file_type().is_symlink() {
            return Err(ArtifactError::Unsafe(format!(
                "{} is a symlink",
                current.display()
            )));
        }
        let mode = md.mode() & 0o7777;
        if md.uid() != 0 {
            return Err(ArtifactError::Unsafe(format!(
                "{} is owned by uid {}, not root",
                current.display(),
                md.uid()
            )));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(ArtifactError::Unsafe(format!(
                "{} is group/world-writable (mode {mode:04o})",
                current.display()
            )));
        }
    }
    Ok(())
}

/// Checks a published artifact's folder and manifest file before anything
/// reads it: safe path, 0700 folder, 0600 root-owned regular manifest,
/// `images/` and `control/` present.
pub fn check_layout(root: &Path, name: &str) -> Result<PathBuf> {
    let dir = path(root, name);
    if fs::symlink_metadata(&dir).is_err() {
        return Err(ArtifactError::NotFound(dir.display().to_string()));
    }
    check_path_safe(&dir)?;
    let md = fs::symlink_metadata(&dir).map_err(|e| ArtifactError::io(&dir, "stat", e))?;
    if md.mode() & 0o777 != 0o700 {
        return Err(ArtifactError::Unsafe(format!(
            "{} has mode {:04o}, expected 0700",
            dir.display(),
            md.mode() & 0o7777
        )));
    }
    let manifest = dir.join(MANIFEST);
    let mmd =
        fs::symlink_metadata(&manifest).map_err(|e| ArtifactError::io(&manifest, "stat", e))?;
    if !mmd.file_type().is_file() {
        return Err(ArtifactError::Unsafe(format!(
            "{} is not a regular file",
            manifest.display()
        )));
    }
    if mmd.mode() & 0o777 != 0o600 || mmd.uid() != 0 {
        return Err(ArtifactError::Unsafe(format!(
            "{} has mode {:04o} and owner {}, expected 0600 and root",
            manifest.display(),
            mmd.mode() & 0o7777,
            mmd.uid()
        )));
    }
    for sub in ["images", "control"] {
        let p = dir.join(sub);
        if !fs::symlink_metadata(&p)
            .map(|m| m.is_dir())
            .unwrap_or(false)
        {
            return Err(ArtifactError::Invalid(format!(
                "{} is missing",
                p.display()
            )));
        }
    }
    Ok(dir)
}

/// A staging folder beside the final artifact, removed unless published.
pub struct Staging {
    pub dir: PathBuf,
    /// The artifact it becomes.
    name: String,
    published: bool,
}

impl Staging {
    /// A fresh staging folder for `name`. The caller holds `name`'s
    /// exclusive lock, so any other staging folder of `name` belongs to a
    /// writer that died: it is removed first.
    pub fn new(root: &Path, name: &str) -> Result<Self> {
        remove_dead_staging(root, name);
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!(".staging-{name}-{}-{n}", std::process::id()));
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| ArtifactError::io(&dir, "create staging", e))?;
        for sub in ["images", "work", "control"] {
            DirBuilder::new()
                .mode(0o700)
                .create(dir.join(sub))
                .map_err(|e| ArtifactError::io(&dir, "create staging", e))?;
        }
        Ok(Self {
            dir,
            name: name.to_string(),
            published: false,
        })
    }

    /// A folder the caller made and filled (with `images/`, `work/` and
    /// `control/` in it; a pull's tree) to be published as `name` by
    /// [`Staging::publish`], which may rename it across folders of the
    /// root's file system; removed on drop unless published, as one of
    /// [`Staging::new`].
    pub fn adopt(dir: PathBuf, name: &str) -> Self {
        Self {
            dir,
            name: name.to_string(),
            published: false,
        }
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

    /// Writes `manifest` (the sealed manifest's bytes; 0600, fsync) and
    /// renames the staging folder to `<root>/<name>`, exchanging it atomically with an older artifact of the
    /// same name (whose files are then removed with the staging folder).
    pub fn publish(self, root: &Path, manifest: &[u8]) -> Result<PathBuf> {
        self.publish_if(root, manifest, || true)
    }

    /// As [`Staging::publish`], with `go` asked right before the rename,
    /// once every byte is durable: `false` (the writer was stopped) leaves
    /// nothing published, the staging folder removed, and is `Stopped`.
    pub fn publish_if(
        mut self,
        root: &Path,
        manifest: &[u8],
        go: impl FnOnce() -> bool,
    ) -> Result<PathBuf> {
        // CRIU leaves its images in the page cache: make them durable before
        // the manifest says the artifact is whole.
        sync_tree(&self.dir)?;
        write_synced(&self.dir.join(MANIFEST), manifest)?;
        sync_dir(&self.dir)?;
        let target = path(root, &self.name);
        if !go() {
            return Err(ArtifactError::Stopped(format!(
                "{} not published: its writer was stopped",
                target.display()
            )));
        }
        let exchanged = if target.exists() {
            nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                &self.dir,
                nix::fcntl::AT_FDCWD,
                &target,
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(|e| ArtifactError::io(&target, "publish", e.into()))?;
            true
        } else {
            fs::rename(&self.dir, &target).map_err(|e| ArtifactError::io(&target, "publish", e))?;
            false
        };
        sync_dir(root)?;
        self.published = !exchanged;
        Ok(target)
    }
}

/// The artifact name in `.staging-<name>-<pid>-<n>`.
fn staging_name(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix(".staging-")?;
    let mut parts = rest.rsplitn(3, '-');
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let (n, pid, name) = (parts.next()?, parts.next()?, parts.next()?);
    (digits(n) && digits(pid)).then_some(name)
}

/// Removes the staging folders of `name` left by dead writers (the caller
/// holds `name`'s exclusive lock).
fn remove_dead_staging(root: &Path, name: &str) {
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && staging_name(&file_name) == Some(name) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// fsyncs every regular file and folder under `dir` (not following links).
pub fn sync_tree(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir).map_err(|e| ArtifactError::io(dir, "read", e))? {
        let e = e.map_err(|e| ArtifactError::io(dir, "read", e))?;
        let path = e.path();
        let md =
            fs::symlink_metadata(&path).map_err(|err| ArtifactError::io(&path, "stat", err))?;
        if md.is_dir() {
            sync_tree(&path)?;
        } else if md.is_file() {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|err| ArtifactError::io(&path, "fsync", err))?;
        }
    }
    sync_dir(dir)
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ArtifactError::io(dir, "fsync", e))
}

/// Total size of the regular files under `dir`.
pub fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            match fs::symlink_metadata(e.path()) {
                Ok(m) if m.is_dir() => total += bytes_under(&e.path()),
                Ok(m) if m.is_file() => total += m.len(),
                _ => {}
            }
        }
    }
    total
}

/// Most bytes one control file may hold (the protocol's files are at most
/// 64 KiB; anything larger is not the engine's).
pub const CONTROL_FILE_LIMIT: u64 = 1 << 20;

/// Copies the regular files directly in `from` (a control dir, which the
/// container can write) into `to`, each at most [`CONTROL_FILE_LIMIT`]
/// bytes, skipping `*.tmp`: see [`copy_regular_nofollow`].
pub fn copy_files(from: &Path, to: &Path) -> Result<()> {
    copy_files_owned_by(from, to, None)
}

/// [`copy_files`] into the control dir of an engine that runs as another
/// user: each copy is given to `owner` (uid, gid) before it is written, so
/// the engine can read it. Needs root (CAP_CHOWN).
pub fn copy_files_owned_by(from: &Path, to: &Path, owner: Option<(u32, u32)>) -> Result<()> {
    for e in fs::read_dir(from).map_err(|e| ArtifactError::io(from, "read", e))? {
        let e = e.map_err(|e| ArtifactError::io(from, "read", e))?;
        if e.file_name().to_string_lossy().ends_with(".tmp") {
            continue;
        }
        copy_regular(
            &e.path(),
            &to.join(e.file_name()),
            CONTROL_FILE_LIMIT,
            owner,
        )?;
    }
    sync_dir(to)
}

/// Copies `src` to a new file `dest` (0600, fsynced) when `src` is a
/// regular file; returns the bytes copied, or None when it is not (a
/// symlink, a fifo, a folder: skipped). Safe against a writer of `src`'s
/// folder: `src` is opened without following a symlink (no check-then-open
/// race), checked on the open descriptor, and read no further than the size
/// it had then; a file over `limit` bytes is an error. `dest` is created
/// exclusively without following a symlink, so nothing outside is written.
pub fn copy_regular_nofollow(src: &Path, dest: &Path, limit: u64) -> Result<Option<u64>> {
    copy_regular(src, dest, limit, None)
}

/// [`copy_regular_nofollow`], the copy given to `owner` (uid, gid) first.
fn copy_regular(
    src: &Path,
    dest: &Path,
    limit: u64,
    owner: Option<(u32, u32)>,
) -> Result<Option<u64>> {
    let file = match File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)
    {
        Ok(f) => f,
        // A symlink (ELOOP) is never followed: skipped, like anything else
        // that is not a regular file.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
        // A Unix socket (ENXIO) is no data either: vLLM's ZMQ endpoints
        // where VLLM_RPC_BASE_PATH is /dev/shm; CRIU binds live ones again.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(None),
        Err(e) => return Err(ArtifactError::io(src, "open", e)),
    };
    let md = file
        .metadata()
        .map_err(|e| ArtifactError::io(src, "stat", e))?;
    if !md.is_file() {
        return Ok(None);
    }
    if md.len() > limit {
        return Err(ArtifactError::Unsafe(format!(
            "{} holds {} bytes, more than the {limit} allowed",
            src.display(),
            md.len()
        )));
    }
    let mut out = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dest)
        .map_err(|e| ArtifactError::io(dest, "create", e))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&out, Some(uid), Some(gid))
            .map_err(|e| ArtifactError::io(dest, "chown", e))?;
    }
    let copied = std::io::copy(&mut std::io::Read::take(&file, md.len()), &mut out)
        .map_err(|e| ArtifactError::io(src, "copy", e))?;
    out.sync_all()
        .map_err(|e| ArtifactError::io(dest, "write", e))?;
    Ok(Some(copied))
}

#[cfg(test)]
mod tests {
    /// A restore's control files copied into the control dir of an engine
    /// that runs as uid/gid 54321: they are its own, still 0600.
    #[test]
    fn control_files_copied_for_another_user_are_that_users() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to hand files to another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("control"), dir.path().join("copy"));
        std::fs::create_dir(&from).unwrap();
        std::fs::create_dir(&to).unwrap();
        std::fs::write(from.join("capture-ready.json"), b"{}").unwrap();
        std::fs::write(from.join("half.tmp"), b"{").unwrap();
        super::copy_files_owned_by(&from, &to, Some((54321, 54321))).unwrap();
        let md = std::fs::metadata(to.join("capture-ready.json")).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (54321, 54321, 0o600)
        );
        assert!(!to.join("half.tmp").exists());
    }

    /// A writer swapping a control file for a symlink to a host secret,
    /// over and over, while it is copied: the copy never holds the secret
    /// and never writes through a link.
    #[test]
    fn a_symlink_swapped_in_during_copies_is_never_followed() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let (from, secret) = (dir.path().join("control"), dir.path().join("secret"));
        std::fs::create_dir(&from).unwrap();
        std::fs::write(&secret, b"SECRET").unwrap();
        std::fs::write(from.join("ready.json"), b"data").unwrap();
        let stop = AtomicBool::new(false);
        /// Stops the swapper even when an assertion fails (else the scope
        /// would wait for it for ever).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let (file, link) = (from.join("f.new"), from.join("l.new"));
                while !stop.load(Ordering::Relaxed) {
                    std::fs::write(&file, b"data").unwrap();
                    std::fs::rename(&file, from.join("ready.json")).unwrap();
                    let _ = std::fs::remove_file(&link);
                    std::os::unix::fs::symlink(&secret, &link).unwrap();
                    std::fs::rename(&link, from.join("ready.json")).unwrap();
                }
            });
            let _stop = Stop(&stop);
            let mut saw = [0usize; 2];
            for i in 0..300 {
                let to = dir.path().join(format!("to{i}"));
                std::fs::create_dir(&to).unwrap();
                let copied = super::copy_regular_nofollow(
                    &from.join("ready.json"),
                    &to.join("ready.json"),
                    64,
                );
                match copied {
                    Ok(Some(_)) => {
                        assert_eq!(std::fs::read(to.join("ready.json")).unwrap(), b"data");
                        saw[0] += 1;
                    }
                    Ok(None) => saw[1] += 1,
                    Err(e) => panic!("{e}"),
                }
                // A symlink at the destination is never written through.
                std::os::unix::fs::symlink(&secret, to.join("x")).unwrap();
                assert!(super::copy_regular_nofollow(&secret, &to.join("x"), 64).is_err());
            }
            assert!(saw[0] + saw[1] == 300, "{saw:?}");
        });
        assert_eq!(std::fs::read(&secret).unwrap(), b"SECRET");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![0u8; 100]).unwrap();
        let e = super::copy_regular_nofollow(&big, &dir.path().join("b2"), 64).unwrap_err();
        assert!(e.to_string().contains("more than the 64 allowed"), "{e}");
        // A socket is skipped, not an error.
        let sock = dir.path().join("sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let to = dir.path().join("sock2");
        assert_eq!(super::copy_regular_nofollow(&sock, &to, 64).unwrap(), None);
        assert!(!to.exists());
    }

    #[test]
    fn a_new_staging_removes_dead_writers_staging_of_its_name_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in [
            ".staging-model-999999-0",
            ".staging-model-v2-999999-1",
            ".staging-other-999999-0",
            ".staging-model-odd",
        ] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        assert_eq!(
            super::staging_name(".staging-model-v2-12-3"),
            Some("model-v2")
        );
        assert_eq!(super::staging_name(".staging-model-odd"), None);
        let s = super::Staging::new(root, "model").unwrap();
        let mut left: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| *n != s.dir.file_name().unwrap().to_string_lossy())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".staging-model-odd",
                ".staging-model-v2-999999-1",
                ".staging-other-999999-0"
            ]
        );
    }

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn group_writable_and_symlinked_components_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        ensure_root(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o770)).unwrap();
        let err = check_path_safe(&root).unwrap_err().to_string();
        assert!(err.contains("group/world-writable (mode 0770)"), "{err}");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        let err = check_path_safe(&link).unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
    }

    #[test]
    fn a_missing_artifact_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            check_layout(dir.path(), "nope"),
            Err(ArtifactError::NotFound(_))
        ));
    }

    /// A writer stopped before the rename: nothing published, no staging
    /// folder left, the older artifact of the name untouched.
    #[test]
    fn a_publish_refused_before_its_rename_leaves_the_older_artifact_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("a")).unwrap();
        std::fs::write(root.join("a").join("old"), b"old").unwrap();
        let staging = Staging::new(root, "a").unwrap();
        std::fs::write(staging.images().join("pages-1.img"), b"new").unwrap();
        let e = staging.publish_if(root, b"{}", || false).unwrap_err();
        assert!(matches!(e, ArtifactError::Stopped(_)), "{e:?}");
        let left: Vec<_> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["a"]);
        assert_eq!(std::fs::read(root.join("a").join("old")).unwrap(), b"old");
    }
}
