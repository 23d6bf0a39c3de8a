//! Tests of the carried layer: packed at a capture, unpacked at a restore.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use vsnap_artifact::rootfs::RootfsLayer;

use super::pack::*;
use super::unpack::*;

#[test]
fn a_layer_too_large_names_its_largest_files() {
    let dir = tempfile::tempdir().unwrap();
    let up = dir.path().join("up");
    fs::create_dir_all(up.join("root/.cache")).unwrap();
    fs::write(up.join("root/.cache/big"), vec![0u8; 3 << 20]).unwrap();
    fs::write(up.join("small"), b"x").unwrap();
    let err = pack(&up, &dir.path().join("t.tar"), 1 << 20)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("capture: rootfs: "), "{err}");
    assert!(err.contains("/root/.cache/big (3 MiB)"), "{err}");
    assert!(!dir.path().join("t.tar").exists());
}

#[test]
fn a_layer_moves_onto_a_fresh_upper_dir_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (up, out, tar) = (
        dir.path().join("up"),
        dir.path().join("new"),
        dir.path().join("t.tar"),
    );
    fs::create_dir_all(up.join("root/.triton/cache/ab")).unwrap();
    fs::write(
        up.join("root/.triton/cache/ab/cuda_utils.so"),
        b"\x7fELF...",
    )
    .unwrap();
    fs::set_permissions(
        up.join("root/.triton/cache/ab/cuda_utils.so"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("ab", up.join("root/.triton/cache/latest")).unwrap();
    fs::hard_link(
        up.join("root/.triton/cache/ab/cuda_utils.so"),
        up.join("root/linked.so"),
    )
    .unwrap();
    std::os::unix::fs::chown(up.join("root/linked.so"), Some(1000), Some(1000)).unwrap();
    fs::create_dir(up.join("opaque")).unwrap();
    xattr::set(up.join("opaque"), "trusted.overlay.opaque", b"y").unwrap();
    xattr::set(up.join("opaque"), "trusted.overlay.origin", b"\x00fh").unwrap();
    nix::sys::stat::mknod(
        &up.join("deleted"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::empty(),
        0,
    )
    .unwrap();
    let layer = pack(&up, &tar, 1 << 30).unwrap();
    assert!(
        matches!(layer, RootfsLayer::OverlayUpper { bytes: 7, .. }),
        "{layer:?}"
    );
    fs::create_dir(&out).unwrap();
    unpack_file(&tar, &out).unwrap();
    let so = out.join("root/.triton/cache/ab/cuda_utils.so");
    assert_eq!(fs::read(&so).unwrap(), b"\x7fELF...");
    assert_eq!(fs::metadata(&so).unwrap().mode() & 0o7777, 0o755);
    assert_eq!(
        fs::read_link(out.join("root/.triton/cache/latest")).unwrap(),
        Path::new("ab")
    );
    let linked = fs::metadata(out.join("root/linked.so")).unwrap();
    assert_eq!(
        (linked.ino(), linked.uid()),
        (fs::metadata(&so).unwrap().ino(), 1000)
    );
    assert_eq!(
        xattr::get(out.join("opaque"), "trusted.overlay.opaque")
            .unwrap()
            .as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(
        xattr::get(out.join("opaque"), "trusted.overlay.origin").unwrap(),
        None
    );
    let wh = fs::symlink_metadata(out.join("deleted")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
    // Only onto an empty upper dir.
    let err = unpack_file(&tar, &out).unwrap_err().to_string();
    assert!(err.contains("is not empty"), "{err}");
}

#[test]
fn an_entry_under_a_symlink_or_outside_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tar_path = dir.path().join("evil.tar");
    {
        let mut b = tar::Builder::new(fs::File::create(&tar_path).unwrap());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        b.append_link(&mut h, "etc", "/etc").unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        b.append_data(&mut h, "etc/evil", &b"x"[..]).unwrap();
        b.finish().unwrap();
    }
    let out = dir.path().join("new");
    fs::create_dir(&out).unwrap();
    let err = unpack_file(&tar_path, &out).unwrap_err().to_string();
    assert!(
        err.contains("/etc/evil") && err.contains("is not a folder of the layer"),
        "{err}"
    );
    assert!(!Path::new("/etc/evil").exists());
}

#[test]
fn what_a_layer_cannot_carry_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let up = dir.path().join("up");
    fs::create_dir_all(up.join("moved")).unwrap();
    xattr::set(up.join("moved"), "trusted.overlay.redirect", b"/old").unwrap();
    let err = pack(&up, &dir.path().join("a.tar"), 1 << 30)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("capture: rootfs: /moved uses overlayfs trusted.overlay.redirect"),
        "{err}"
    );

    let up = dir.path().join("up2");
    fs::create_dir(&up).unwrap();
    nix::sys::stat::mknod(
        &up.join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let err = pack(&up, &dir.path().join("b.tar"), 1 << 30)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("capture: rootfs: /null is a device node"),
        "{err}"
    );
}

#[test]
fn socket_files_are_left_out_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let (up, out, tar) = (
        dir.path().join("up"),
        dir.path().join("new"),
        dir.path().join("t.tar"),
    );
    fs::create_dir_all(up.join("tmp")).unwrap();
    // A live one (held by a listener) and a stale one (its socket closed:
    // the file stays, as libzmq leaves a closed ipc:// endpoint's).
    let _live = std::os::unix::net::UnixListener::bind(up.join("tmp/live")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(up.join("tmp/stale")).unwrap());
    fs::write(up.join("tmp/data"), b"kept").unwrap();
    let layer = pack(&up, &tar, 1 << 30).unwrap();
    let RootfsLayer::OverlayUpper {
        entries, sockets, ..
    } = layer
    else {
        panic!("{layer:?}")
    };
    assert_eq!(sockets, ["/tmp/live", "/tmp/stale"]);
    assert_eq!(entries, 2, "tmp and tmp/data");
    fs::create_dir(&out).unwrap();
    unpack_file(&tar, &out).unwrap();
    assert_eq!(fs::read(out.join("tmp/data")).unwrap(), b"kept");
    assert!(!out.join("tmp/live").exists() && !out.join("tmp/stale").exists());
}

#[test]
fn a_hard_link_out_or_a_device_node_is_refused_on_unpack() {
    let dir = tempfile::tempdir().unwrap();
    let header = |t: tar::EntryType| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(t);
        h.set_size(0);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1);
        h
    };
    let refusal = |name: &str, build: &dyn Fn(&mut tar::Builder<fs::File>)| {
        let tar_path = dir.path().join(format!("{name}.tar"));
        let mut b = tar::Builder::new(fs::File::create(&tar_path).unwrap());
        build(&mut b);
        b.finish().unwrap();
        let out = dir.path().join(name);
        fs::create_dir(&out).unwrap();
        unpack_file(&tar_path, &out).unwrap_err().to_string()
    };
    let err = refusal("link", &|b| {
        b.append_link(&mut header(tar::EntryType::Link), "x", "../outside")
            .unwrap()
    });
    assert_eq!(
        err,
        "restore: rootfs: /x: a hard link that leaves the rootfs"
    );
    let err = refusal("dev", &|b| {
        let mut h = header(tar::EntryType::Char);
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
        b.append_data(&mut h, "null", std::io::empty()).unwrap()
    });
    assert_eq!(err, "restore: rootfs: /null: a device node, not a whiteout");
}
