//! `ownership`: whoever can write the artifact or the control dir, or any
//! folder above them, can make a restore run their code. Every component of
//! the artifact root, the artifact and the control dir must be owned by root
//! (or by the uid running the hook), must not be a symlink, and must not be
//! group/world-writable (root-owned sticky folders such as /tmp excepted).
//! The artifact itself: folder 0700, `manifest.json` 0600 and root-owned,
//! `images/` and `control/` present, and nothing inside it a symlink, owned
//! by someone else or group/world-writable. The control dir: a folder no one
//! else can enter (mode 0700), owned by root or, with `--control-owner UID`,
//! by the user the engine runs as (the folders above it as above).
//!
//! Run as root this is exactly [`vsnap_artifact::check_path_safe`] and
//! [`vsnap_artifact::layout::check_layout`], the checks the shim makes, plus
//! the walk inside the artifact.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use vsnap_artifact::check_path_safe;
use vsnap_artifact::layout::check_layout;

use crate::{artifact_name, check_artifact_name, euid, Failure, Flags, StateSource};

pub const VALUE_FLAGS: &[&str] = &[
    "--artifact-root",
    "--artifact",
    "--control-dir",
    "--control-owner",
    "--state",
];
pub const BOOL_FLAGS: &[&str] = &["--artifact-from-state", "--streamed"];

/// Who may own what the checks look at: root and the invoking uid.
#[derive(Debug, Clone, Copy)]
pub struct Owners {
    pub invoker: u32,
}

impl Owners {
    pub fn current() -> Self {
        Owners { invoker: euid() }
    }

    fn allows(self, uid: u32) -> bool {
        uid == 0 || uid == self.invoker
    }

    fn describe(self) -> String {
        if self.invoker == 0 {
            "root".into()
        } else {
            format!("root or uid {}", self.invoker)
        }
    }

    /// One file's owner, type and mode (`what` prefixes nothing: messages
    /// name the path).
    fn check_entry(self, path: &Path, md: &fs::Metadata) -> Result<(), String> {
        if md.file_type().is_symlink() {
            return Err(format!("{} is a symlink", path.display()));
        }
        if !self.allows(md.uid()) {
            return Err(format!(
                "{} is owned by uid {}, not {}",
                path.display(),
                md.uid(),
                self.describe()
            ));
        }
        let mode = md.mode() & 0o7777;
        let sticky_root_dir = md.is_dir() && mode & 0o1000 != 0 && md.uid() == 0;
        if mode & 0o022 != 0 && !sticky_root_dir {
            return Err(format!(
                "{} is group/world-writable (mode {mode:04o})",
                path.display()
            ));
        }
        Ok(())
    }

    /// Every component of an absolute `path`.
    pub fn check_path(self, path: &Path) -> Result<(), String> {
        if self.invoker == 0 {
            return check_path_safe(path).map_err(|e| e.to_string());
        }
        let mut current = PathBuf::from("/");
        for part in path.components().skip(1) {
            current.push(part);
            let md = fs::symlink_metadata(&current)
                .map_err(|e| format!("stat {}: {e}", current.display()))?;
            self.check_entry(&current, &md)?;
        }
        Ok(())
    }

    /// The artifact's folder and manifest, then everything inside it.
    pub fn check_artifact(self, root: &Path, name: &str) -> Result<PathBuf, String> {
        let dir = if self.invoker == 0 {
            check_layout(root, name).map_err(|e| e.to_string())?
        } else {
            self.check_layout_as_invoker(root, name)?
        };
        self.check_tree(&dir)?;
        Ok(dir)
    }

    /// The tree of the pull of `name` under way that a streamed restore
    /// reads ([`crate::streamed_tree`]), checked as an artifact is.
    pub fn check_streamed(self, root: &Path, name: &str) -> Result<PathBuf, String> {
        let dir = self.check_dir_layout(&crate::streamed_tree(root, name))?;
        self.check_tree(&dir)?;
        Ok(dir)
    }

    /// [`check_layout`] with the invoking uid allowed as owner.
    fn check_layout_as_invoker(self, root: &Path, name: &str) -> Result<PathBuf, String> {
        self.check_dir_layout(&root.join(name))
    }

    /// An artifact's folder `dir`: its path, mode, manifest and folders.
    fn check_dir_layout(self, dir: &Path) -> Result<PathBuf, String> {
        let dir = dir.to_path_buf();
        if fs::symlink_metadata(&dir).is_err() {
            return Err(format!("artifact {} does not exist", dir.display()));
        }
        self.check_path(&dir)?;
        let mode = |p: &Path| {
            fs::symlink_metadata(p)
                .map(|m| (m.mode() & 0o7777, m.is_file()))
                .map_err(|e| format!("stat {}: {e}", p.display()))
        };
        let (m, _) = mode(&dir)?;
        if m & 0o777 != 0o700 {
            return Err(format!("{} has mode {m:04o}, expected 0700", dir.display()));
        }
        let manifest = dir.join("manifest.json");
        let (m, is_file) = mode(&manifest)?;
        if !is_file || m & 0o777 != 0o600 {
            return Err(format!(
                "{} must be a regular file of mode 0600 (mode {m:04o})",
                manifest.display()
            ));
        }
        for sub in ["images", "control"] {
            if !fs::symlink_metadata(dir.join(sub)).is_ok_and(|m| m.is_dir()) {
                return Err(format!("{} is missing", dir.join(sub).display()));
            }
        }
        Ok(dir)
    }

    /// Everything under `dir` (not following symlinks).
    pub fn check_tree(self, dir: &Path) -> Result<(), String> {
        let entries = fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
        for e in entries {
            let e = e.map_err(|e| format!("read {}: {e}", dir.display()))?;
            let path = e.path();
            let md = fs::symlink_metadata(&path)
                .map_err(|err| format!("stat {}: {err}", path.display()))?;
            self.check_entry(&path, &md)?;
            if md.is_dir() {
                self.check_tree(&path)?;
            }
        }
        Ok(())
    }

    /// The control dir: a safe path to a folder only its owner can enter,
    /// that owner root (or the invoker) or `engine`, the uid the engine runs
    /// as, whose folder it is.
    pub fn check_control_dir(self, dir: &Path, engine: Option<u32>) -> Result<(), String> {
        if let Some(parent) = dir.parent() {
            self.check_path(parent)?;
        }
        let md = fs::symlink_metadata(dir).map_err(|e| format!("stat {}: {e}", dir.display()))?;
        if md.file_type().is_symlink() {
            return Err(format!("{} is a symlink", dir.display()));
        }
        if !md.is_dir() {
            return Err(format!("{} is not a folder", dir.display()));
        }
        if !self.allows(md.uid()) && Some(md.uid()) != engine {
            let also = engine.map(|u| format!(" or uid {u}")).unwrap_or_default();
            return Err(format!(
                "{} is owned by uid {}, not {}{also}",
                dir.display(),
                md.uid(),
                self.describe()
            ));
        }
        let mode = md.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{} has mode {mode:04o}, expected 0700",
                dir.display()
            ));
        }
        Ok(())
    }
}

pub fn run(flags: &Flags, state: &mut StateSource) -> Result<(), Failure> {
    let control_owner = match flags.value("--control-owner") {
        None => None,
        Some(v) => Some(
            v.parse::<u32>()
                .map_err(|_| Failure::Usage(format!("--control-owner {v:?}: not a uid")))?,
        ),
    };
    let root = flags.abs_path("--artifact-root")?;
    let name = artifact_name(flags, state)?;
    let control = flags.abs_path("--control-dir")?;
    let control = control.as_deref().map(|d| (d, control_owner));
    if !flags.has("--streamed") {
        return check(root.as_deref(), name.as_deref(), control, Owners::current());
    }
    // The artifact is still arriving: its pull's tree is checked instead.
    let (Some(root), Some(name)) = (root.as_deref(), name.as_deref()) else {
        return Err(Failure::Usage(
            "--streamed needs --artifact-root and an artifact".into(),
        ));
    };
    check_artifact_name(name)?;
    Owners::current()
        .check_streamed(root, name)
        .map_err(Failure::Check)?;
    check(Some(root), None, control, Owners::current())
}

/// `control_dir`: the folder and the uid of the engine that may own it.
pub fn check(
    root: Option<&Path>,
    artifact: Option<&str>,
    control_dir: Option<(&Path, Option<u32>)>,
    owners: Owners,
) -> Result<(), Failure> {
    if root.is_none() && control_dir.is_none() {
        return Err(Failure::Usage(
            "give --artifact-root (with --artifact) and/or --control-dir".into(),
        ));
    }
    if let Some(name) = artifact {
        check_artifact_name(name)?;
    }
    match (root, artifact) {
        (None, Some(_)) => return Err(Failure::Usage("--artifact needs --artifact-root".into())),
        (Some(root), None) => owners.check_path(root).map_err(Failure::Check)?,
        (Some(root), Some(name)) => {
            owners.check_artifact(root, name).map_err(Failure::Check)?;
        }
        (None, None) => {}
    }
    if let Some((dir, engine)) = control_dir {
        owners
            .check_control_dir(dir, engine)
            .map_err(Failure::Check)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const ROOT: Owners = Owners { invoker: 0 };

    /// `<tmp>/root/a` laid out as the shim publishes it, and a control dir.
    fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let art = root.join("a");
        for d in ["images", "control", "work"] {
            fs::create_dir_all(art.join(d)).unwrap();
        }
        fs::create_dir_all(root.join(".control/default-c1")).unwrap();
        fs::write(art.join("images/pages-1.img"), b"x").unwrap();
        fs::write(art.join("manifest.json"), b"{}").unwrap();
        for (p, m) in [
            (root.clone(), 0o700),
            (art.clone(), 0o700),
            (art.join("manifest.json"), 0o600),
            (root.join(".control"), 0o700),
            (root.join(".control/default-c1"), 0o700),
        ] {
            fs::set_permissions(&p, fs::Permissions::from_mode(m)).unwrap();
        }
        let control = root.join(".control/default-c1");
        (tmp, root, control)
    }

    fn fails(root: &Path, control: &Path) -> String {
        check(Some(root), Some("a"), Some((control, None)), ROOT)
            .unwrap_err()
            .message()
            .to_string()
    }

    #[test]
    fn a_good_layout_passes() {
        let (_t, root, control) = layout();
        check(Some(&root), Some("a"), Some((&control, None)), ROOT).unwrap();
        check(Some(&root), None, None, ROOT).unwrap();
        check(None, None, Some((&control, None)), ROOT).unwrap();
    }

    #[test]
    fn a_group_writable_folder_anywhere_fails_naming_it() {
        let (_t, root, control) = layout();
        for (dir, mode) in [
            (root.clone(), 0o770),
            (root.join("a/images"), 0o777),
            (root.join(".control"), 0o775),
        ] {
            let old = fs::symlink_metadata(&dir).unwrap().mode();
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                fails(&root, &control),
                format!(
                    "{} is group/world-writable (mode {mode:04o})",
                    dir.display()
                )
            );
            fs::set_permissions(&dir, fs::Permissions::from_mode(old)).unwrap();
        }
        check(Some(&root), Some("a"), Some((&control, None)), ROOT).unwrap();
    }

    #[test]
    fn a_symlink_on_the_path_or_inside_fails() {
        let (t, root, control) = layout();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        let e = check(Some(&link), Some("a"), None, ROOT).unwrap_err();
        assert_eq!(e.message(), format!("{} is a symlink", link.display()));
        let inner = root.join("a/images/evil");
        std::os::unix::fs::symlink("/etc/shadow", &inner).unwrap();
        assert_eq!(
            fails(&root, &control),
            format!("{} is a symlink", inner.display())
        );
    }

    #[test]
    fn a_foreign_owner_fails() {
        let (_t, root, control) = layout();
        let dir = root.join("a/control");
        std::os::unix::fs::chown(&dir, Some(1000), Some(1000)).unwrap();
        assert_eq!(
            fails(&root, &control),
            format!("{} is owned by uid 1000, not root", dir.display())
        );
        std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
        std::os::unix::fs::chown(&control, Some(1000), Some(1000)).unwrap();
        assert_eq!(
            fails(&root, &control),
            format!("{} is owned by uid 1000, not root", control.display())
        );
        // Run by uid 1000 (a rootless runtime), its own folders are fine.
        let rootless = Owners { invoker: 1000 };
        check(None, None, Some((&control, None)), rootless).unwrap();
    }

    #[test]
    fn a_control_dir_may_belong_to_the_engines_user() {
        let (_t, _root, control) = layout();
        std::os::unix::fs::chown(&control, Some(1000), Some(1000)).unwrap();
        check(None, None, Some((&control, Some(1000))), ROOT).unwrap();
        let e = check(None, None, Some((&control, Some(1001))), ROOT).unwrap_err();
        assert_eq!(
            e.message(),
            format!(
                "{} is owned by uid 1000, not root or uid 1001",
                control.display()
            )
        );
        // The folders above it are root's all the same.
        let parent = control.parent().unwrap();
        std::os::unix::fs::chown(parent, Some(1000), Some(1000)).unwrap();
        let e = check(None, None, Some((&control, Some(1000))), ROOT).unwrap_err();
        assert!(e.message().contains("owned by uid 1000, not root"), "{e:?}");
    }

    #[test]
    fn modes_of_the_artifact_manifest_and_control_dir_are_enforced() {
        let (_t, root, control) = layout();
        let manifest = root.join("a/manifest.json");
        fs::set_permissions(&manifest, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(fails(&root, &control).contains("expected 0600 and root"));
        fs::set_permissions(&manifest, fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(root.join("a"), fs::Permissions::from_mode(0o750)).unwrap();
        assert!(fails(&root, &control).contains("has mode 0750, expected 0700"));
        fs::set_permissions(root.join("a"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(&control, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            fails(&root, &control),
            format!("{} has mode 0755, expected 0700", control.display())
        );
    }

    #[test]
    fn arguments_are_checked_first() {
        let (_t, root, _) = layout();
        assert_eq!(check(None, None, None, ROOT).unwrap_err().code(), 2);
        assert_eq!(
            check(None, Some("a"), Some((&root, None)), ROOT)
                .unwrap_err()
                .code(),
            2
        );
        assert_eq!(
            check(Some(&root), Some("../a"), None, ROOT)
                .unwrap_err()
                .code(),
            2
        );
        let e = check(Some(&root), Some("missing"), None, ROOT).unwrap_err();
        assert!(e.message().contains("does not exist"), "{e:?}");
    }
}
