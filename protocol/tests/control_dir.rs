//! Directory rules for the control dir and its ancestors.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use common::TempDir;
use vsnap_protocol::{ControlDir, Expect, ProtocolError};

fn chmod(path: &std::path::Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn create_makes_a_fresh_empty_0700_dir() {
    let tmp = TempDir::new("create");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    let meta = fs::symlink_metadata(dir.path()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o700);
    assert!(dir.entries().unwrap().is_empty());
    ControlDir::open(dir.path(), Expect::Empty).unwrap();
}

#[test]
fn create_makes_missing_ancestors() {
    let tmp = TempDir::new("ancestors");
    let dir = ControlDir::create(tmp.join("a/b/control")).unwrap();
    assert!(dir.path().is_dir());
}

#[test]
fn create_refuses_an_existing_dir() {
    let tmp = TempDir::new("exists");
    ControlDir::create(tmp.join("control")).unwrap();
    let err = ControlDir::create(tmp.join("control")).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[test]
fn relative_and_dotdot_paths_are_refused() {
    let err = ControlDir::open("relative/control", Expect::AnyContents).unwrap_err();
    assert!(err.to_string().contains("must be absolute"), "{err}");
    let err = ControlDir::open("/tmp/../tmp/control", Expect::AnyContents).unwrap_err();
    assert!(err.to_string().contains("`..`"), "{err}");
}

#[test]
fn non_empty_dir_is_refused_when_empty_is_expected() {
    let tmp = TempDir::new("nonempty");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    fs::write(dir.file("leftover.json"), b"{}").unwrap();
    let err = ControlDir::open(dir.path(), Expect::Empty).unwrap_err();
    assert!(matches!(err, ProtocolError::NotEmpty { .. }), "{err:?}");
    assert!(err.to_string().contains("leftover.json"), "{err}");
    ControlDir::open(dir.path(), Expect::AnyContents).unwrap();
}

#[test]
fn group_writable_control_dir_is_refused() {
    let tmp = TempDir::new("groupw");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    chmod(dir.path(), 0o770);
    let err = ControlDir::open(dir.path(), Expect::AnyContents).unwrap_err();
    assert!(err.to_string().contains("mode 0770"), "{err}");
    assert!(err.to_string().starts_with("control dir "), "{err}");
}

#[test]
fn group_readable_control_dir_is_refused() {
    let tmp = TempDir::new("groupr");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    chmod(dir.path(), 0o750);
    assert!(dir.validate().is_err());
}

#[test]
fn control_dir_owned_by_another_uid_is_refused() {
    let tmp = TempDir::new("owner");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    let err = ControlDir::open_owned_by(dir.path(), 54321, Expect::AnyContents).unwrap_err();
    assert!(err.to_string().contains("expected uid 54321"), "{err}");
}

#[test]
fn symlinked_control_dir_is_refused() {
    let tmp = TempDir::new("dirlink");
    let real = ControlDir::create(tmp.join("real")).unwrap();
    symlink(real.path(), tmp.join("link")).unwrap();
    let err = ControlDir::open(tmp.join("link"), Expect::AnyContents).unwrap_err();
    assert!(err.to_string().ends_with("is a symlink"), "{err}");
}

#[test]
fn symlinked_ancestor_is_refused() {
    let tmp = TempDir::new("anclink");
    fs::create_dir(tmp.join("real")).unwrap();
    symlink(tmp.join("real"), tmp.join("link")).unwrap();
    let err = ControlDir::create(tmp.join("link/control")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("ancestor") && text.contains("is a symlink"),
        "{text}"
    );
    assert!(
        !tmp.join("real/control").exists(),
        "nothing created through the symlink"
    );
}

#[test]
fn group_writable_ancestor_is_refused() {
    let tmp = TempDir::new("ancgw");
    fs::create_dir(tmp.join("parent")).unwrap();
    let dir = ControlDir::create(tmp.join("parent/control")).unwrap();
    chmod(&tmp.join("parent"), 0o775);
    let err = dir.validate().unwrap_err();
    assert!(
        err.to_string().contains("group-writable (mode 0775)"),
        "{err}"
    );
}

#[test]
fn world_writable_ancestor_is_refused_unless_sticky_and_root_owned() {
    let tmp = TempDir::new("ancww");
    fs::create_dir(tmp.join("parent")).unwrap();
    let dir = ControlDir::create(tmp.join("parent/control")).unwrap();
    chmod(&tmp.join("parent"), 0o757);
    let err = dir.validate().unwrap_err();
    assert!(err.to_string().contains("world-writable"), "{err}");

    // Like /tmp: world-writable but sticky. Only accepted when root owns it.
    chmod(&tmp.join("parent"), 0o1777);
    let owner = fs::metadata(tmp.join("parent")).unwrap().uid();
    assert_eq!(dir.validate().is_ok(), owner == 0);
}

#[test]
fn ancestor_owned_by_a_stranger_is_refused() {
    let tmp = TempDir::new("ancowner");
    fs::create_dir(tmp.join("parent")).unwrap();
    let dir = ControlDir::create(tmp.join("parent/control")).unwrap();
    if std::os::unix::fs::chown(tmp.join("parent"), Some(54321), None).is_err() {
        eprintln!("skipping: cannot chown without privilege");
        return;
    }
    let err = dir.validate().unwrap_err();
    assert!(err.to_string().contains("owned by uid 54321"), "{err}");
}

#[test]
fn vanished_control_dir_is_reported() {
    let tmp = TempDir::new("vanish");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    fs::remove_dir(dir.path()).unwrap();
    let err = dir.validate().unwrap_err();
    assert!(err.to_string().ends_with("does not exist"), "{err}");
}

#[test]
fn stale_files_are_listed_by_name() {
    let tmp = TempDir::new("stale");
    let dir = ControlDir::create(tmp.join("control")).unwrap();
    fs::write(dir.file("capture-ready.json"), b"{}").unwrap();
    assert!(dir.stale_files().unwrap().is_empty());
    fs::write(dir.file("status.json"), b"{}").unwrap();
    symlink("/nonexistent", dir.file("error.json")).unwrap();
    assert_eq!(
        dir.stale_files().unwrap(),
        vec!["status.json", "error.json"]
    );
    let err = dir.ensure_no_stale_files().unwrap_err();
    assert!(
        err.to_string()
            .ends_with("stale files from an earlier activation: status.json, error.json"),
        "{err}"
    );
}
