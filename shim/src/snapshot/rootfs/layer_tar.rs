//! The writable layer as a tar of the overlay upper dir: packed at a
//! capture, unpacked into a restore's fresh upper dir.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use vsnap_artifact::rootfs::RootfsLayer;

use crate::error::{Error, Result};

/// overlayfs xattrs that are caches of the lower layers' identity (file
/// handles, inode numbers): meaningless on another snapshot, left out.
const OVERLAY_CACHES: [&str; 4] = [
    "trusted.overlay.origin",
    "trusted.overlay.impure",
    "trusted.overlay.nlink",
    "trusted.overlay.upper",
];
/// overlayfs features that point into the lower layers by path or data:
/// a layer using them cannot be moved, and the capture says so.
const OVERLAY_POINTERS: [&str; 2] = ["trusted.overlay.redirect", "trusted.overlay.metacopy"];

struct Entry {
    rel: PathBuf,
    md: fs::Metadata,
}

fn walk(upper: &Path) -> Result<Vec<Entry>> {
    let phase = |p: &Path, e| Error::io(format!("capture: rootfs: read {}", p.display()), e);
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let dir = upper.join(&rel);
        for e in fs::read_dir(&dir).map_err(|e| phase(&dir, e))? {
            let rel = rel.join(e.map_err(|e| phase(&dir, e))?.file_name());
            let path = upper.join(&rel);
            let md = fs::symlink_metadata(&path).map_err(|e| phase(&path, e))?;
            if md.is_dir() {
                dirs.push(rel.clone());
            }
            out.push(Entry { rel, md });
        }
    }
    // Component order: a folder precedes its contents, in name order.
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// The layer's regular-file bytes and its largest files, for the bound.
fn too_large(entries: &[Entry], limit: u64) -> Option<String> {
    let total: u64 = entries
        .iter()
        .filter(|e| e.md.is_file())
        .map(|e| e.md.len())
        .sum();
    if total <= limit {
        return None;
    }
    let mut files: Vec<&Entry> = entries.iter().filter(|e| e.md.is_file()).collect();
    files.sort_by_key(|e| std::cmp::Reverse(e.md.len()));
    let largest: Vec<String> = files
        .iter()
        .take(5)
        .map(|e| format!("/{} ({} MiB)", e.rel.display(), e.md.len() >> 20))
        .collect();
    Some(format!(
        "the container's writable layer holds {} MiB, more than rootfs_diff_limit_bytes ({} MiB); largest: {}; mount such paths as volumes, or raise the limit",
        total >> 20,
        limit >> 20,
        largest.join(", ")
    ))
}

/// Packs the upper dir `upper` into the tar `out` (created, 0600). Returns
/// the layer's record. Fails naming the path it cannot carry.
pub fn pack(upper: &Path, out: &Path, limit: u64) -> Result<RootfsLayer> {
    let fail = |m: String| Error::FailedPrecondition(format!("capture: rootfs: {m}"));
    let io = |what: String, e: std::io::Error| Error::io(format!("capture: rootfs: {what}"), e);
    let entries = walk(upper)?;
    if let Some(m) = too_large(&entries, limit) {
        return Err(fail(m));
    }
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| io(format!("create {}", out.display()), e))?;
    let mut tar = tar::Builder::new(BufWriter::with_capacity(1 << 20, file));
    tar.mode(tar::HeaderMode::Complete);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut bytes = 0u64;
    for e in &entries {
        let path = upper.join(&e.rel);
        let ft = e.md.file_type();
        // xattrs first: a PAX header describes the entry after it.
        let mut xattrs = Vec::new();
        if !ft.is_symlink() {
            for name in xattr::list(&path)
                .map_err(|err| io(format!("xattrs of {}", path.display()), err))?
            {
                let n = name.to_string_lossy().to_string();
                if OVERLAY_POINTERS.contains(&n.as_str()) {
                    return Err(fail(format!(
                        "/{} uses overlayfs {n} (redirect_dir or metacopy): such a layer cannot be moved onto another snapshot; mount the overlay without them",
                        e.rel.display()
                    )));
                }
                if OVERLAY_CACHES.contains(&n.as_str()) {
                    continue;
                }
                if let Some(v) = xattr::get(&path, &name)
                    .map_err(|err| io(format!("xattr {n} of {}", path.display()), err))?
                {
                    xattrs.push((format!("SCHILY.xattr.{n}"), v));
                }
            }
        }
        if !xattrs.is_empty() {
            tar.append_pax_extensions(xattrs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
                .map_err(|err| io("write".into(), err))?;
        }
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(&e.md, tar::HeaderMode::Complete);
        let add = |tar: &mut tar::Builder<_>, h: &mut tar::Header, data: &mut dyn Read| {
            tar.append_data(h, &e.rel, data)
                .map_err(|err| io(format!("pack /{}", e.rel.display()), err))
        };
        if ft.is_file() && e.md.nlink() > 1 {
            let key = (e.md.dev(), e.md.ino());
            if let Some(first) = links.get(&key) {
                h.set_entry_type(tar::EntryType::Link);
                h.set_size(0);
                tar.append_link(&mut h, &e.rel, first)
                    .map_err(|err| io(format!("pack /{}", e.rel.display()), err))?;
                continue;
            }
            links.insert(key, e.rel.clone());
        }
        if ft.is_file() {
            let f =
                fs::File::open(&path).map_err(|err| io(format!("open {}", path.display()), err))?;
            let mut f = std::io::BufReader::with_capacity(1 << 20, f);
            bytes += e.md.len();
            add(&mut tar, &mut h, &mut f)?;
        } else if ft.is_dir() || ft.is_fifo() {
            add(&mut tar, &mut h, &mut std::io::empty())?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&path)
                .map_err(|err| io(format!("readlink {}", path.display()), err))?;
            tar.append_link(&mut h, &e.rel, &target)
                .map_err(|err| io(format!("pack /{}", e.rel.display()), err))?;
        } else if ft.is_char_device() && e.md.rdev() == 0 {
            // A whiteout: the file is deleted from the image.
            add(&mut tar, &mut h, &mut std::io::empty())?;
        } else {
            return Err(fail(format!(
                "/{} is a device or socket the writable layer cannot carry (only files, folders, links, FIFOs and whiteouts)",
                e.rel.display()
            )));
        }
    }
    // Synced with the rest of the staging folder when it is published.
    let mut w = tar
        .into_inner()
        .map_err(|e| io("finish the tar".into(), e))?;
    w.flush().map_err(|e| io("write".into(), e))?;
    Ok(RootfsLayer::OverlayUpper {
        bytes,
        entries: entries.len() as u64,
    })
}

/// Unpacks a carried layer, read from `source` (the tar `tar_path` names),
/// into `upper`, the new container's upper dir (empty, not mounted yet),
/// and returns the reader, which may hold the tar's trailing padding.
/// Every entry's path must stay inside `upper` through real folders: `..`,
/// absolute paths and entries under a symlink are refused, naming the path.
pub fn unpack<R: Read>(source: R, tar_path: &Path, upper: &Path) -> Result<R> {
    let fail = |m: String| Error::FailedPrecondition(format!("restore: rootfs: {m}"));
    let io = |what: String, e: std::io::Error| Error::io(format!("restore: rootfs: {what}"), e);
    let non_empty = fs::read_dir(upper)
        .map_err(|e| io(format!("read {}", upper.display()), e))?
        .next()
        .is_some();
    if non_empty {
        return Err(fail(format!(
            "the container's upper dir {} is not empty: the carried layer goes only onto a fresh snapshot",
            upper.display()
        )));
    }
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(1 << 20, source));
    let mut copy_buf = vec![0u8; 1 << 20];
    let mut dirs: Vec<(PathBuf, filetime::FileTime)> = Vec::new();
    for entry in archive
        .entries()
        .map_err(|e| io(format!("read {}", tar_path.display()), e))?
    {
        let mut entry = entry.map_err(|e| io(format!("read {}", tar_path.display()), e))?;
        let rel = entry
            .path()
            .map_err(|e| io("an entry's path".into(), e))?
            .into_owned();
        let shown = format!("/{}", rel.display());
        if rel.as_os_str().is_empty()
            || !rel.components().all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(fail(format!("{shown}: a path that leaves the rootfs")));
        }
        let dst = upper.join(&rel);
        // Every folder above the entry is one the layer made, not a link.
        let mut at = upper.to_path_buf();
        for c in rel.parent().into_iter().flat_map(Path::components) {
            at.push(c);
            let real_dir = fs::symlink_metadata(&at)
                .map(|m| m.is_dir())
                .unwrap_or(false);
            if !real_dir {
                return Err(fail(format!(
                    "{shown}: {} is not a folder of the layer",
                    at.display()
                )));
            }
        }
        let h = entry.header().clone();
        let mode = h.mode().map_err(|e| io(format!("{shown}: mode"), e))?;
        let (uid, gid) = (
            h.uid().map_err(|e| io(format!("{shown}: uid"), e))? as u32,
            h.gid().map_err(|e| io(format!("{shown}: gid"), e))? as u32,
        );
        let mtime = filetime::FileTime::from_unix_time(h.mtime().unwrap_or(0) as i64, 0);
        let xattrs: Vec<(String, Vec<u8>)> = entry
            .pax_extensions()
            .ok()
            .flatten()
            .into_iter()
            .flatten()
            .filter_map(|x| x.ok())
            .filter_map(|x| {
                let key = x.key().ok()?.strip_prefix("SCHILY.xattr.")?.to_string();
                Some((key, x.value_bytes().to_vec()))
            })
            .collect();
        let made = |e| io(format!("create {shown}"), e);
        use tar::EntryType as T;
        match h.entry_type() {
            T::Directory => fs::create_dir(&dst).map_err(made)?,
            T::Regular | T::GNUSparse | T::Continuous => {
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&dst)
                    .map_err(made)?;
                loop {
                    let n = entry.read(&mut copy_buf).map_err(made)?;
                    if n == 0 {
                        break;
                    }
                    f.write_all(&copy_buf[..n]).map_err(made)?;
                }
            }
            T::Symlink => {
                let target = h
                    .link_name()
                    .map_err(|e| io(format!("{shown}: link"), e))?
                    .ok_or_else(|| fail(format!("{shown}: a symlink without a target")))?;
                std::os::unix::fs::symlink(&target, &dst).map_err(made)?;
                std::os::unix::fs::lchown(&dst, Some(uid), Some(gid))
                    .map_err(|e| io(format!("chown {shown}"), e))?;
                continue;
            }
            T::Link => {
                let target = h
                    .link_name()
                    .map_err(|e| io(format!("{shown}: link"), e))?
                    .ok_or_else(|| fail(format!("{shown}: a hard link without a target")))?;
                if !target
                    .components()
                    .all(|c| matches!(c, Component::Normal(_)))
                {
                    return Err(fail(format!("{shown}: a hard link that leaves the rootfs")));
                }
                let src = upper.join(&target);
                let md = fs::symlink_metadata(&src)
                    .map_err(|e| io(format!("{shown}: link target /{}", target.display()), e))?;
                if !md.is_file() {
                    return Err(fail(format!("{shown}: a hard link to a non-file")));
                }
                fs::hard_link(&src, &dst).map_err(made)?;
                continue;
            }
            T::Char => {
                let dev = (
                    h.device_major().ok().flatten().unwrap_or(0),
                    h.device_minor().ok().flatten().unwrap_or(0),
                );
                if dev != (0, 0) {
                    return Err(fail(format!("{shown}: a device node, not a whiteout")));
                }
                nix::sys::stat::mknod(
                    &dst,
                    nix::sys::stat::SFlag::S_IFCHR,
                    nix::sys::stat::Mode::from_bits_truncate(0),
                    0,
                )
                .map_err(|e| io(format!("whiteout {shown}"), e.into()))?;
            }
            T::Fifo => nix::unistd::mkfifo(&dst, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|e| io(format!("fifo {shown}"), e.into()))?,
            other => return Err(fail(format!("{shown}: an entry of type {other:?}"))),
        }
        std::os::unix::fs::chown(&dst, Some(uid), Some(gid))
            .map_err(|e| io(format!("chown {shown}"), e))?;
        fs::set_permissions(&dst, fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| io(format!("chmod {shown}"), e))?;
        for (k, v) in &xattrs {
            xattr::set(&dst, k, v).map_err(|e| io(format!("xattr {k} of {shown}"), e))?;
        }
        if h.entry_type() == T::Directory {
            // Its mtime once its contents are in.
            dirs.push((dst, mtime));
        } else {
            filetime::set_symlink_file_times(&dst, mtime, mtime)
                .map_err(|e| io(format!("mtime {shown}"), e))?;
        }
    }
    for (dir, mtime) in dirs.iter().rev() {
        let _ = filetime::set_symlink_file_times(dir, *mtime, *mtime);
    }
    Ok(archive.into_inner().into_inner())
}

/// [`unpack`] of the file `tar_path`, unchecked (the tests').
#[cfg(test)]
fn unpack_file(tar_path: &Path, upper: &Path) -> Result<()> {
    let f = fs::File::open(tar_path)
        .map_err(|e| Error::io(format!("restore: rootfs: open {}", tar_path.display()), e))?;
    unpack(f, tar_path, upper).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let _sock = std::os::unix::net::UnixListener::bind(up.join("sock")).unwrap();
        let err = pack(&up, &dir.path().join("b.tar"), 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("capture: rootfs: /sock is a device or socket"),
            "{err}"
        );
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
}
