//! The container's root filesystem across a capture: its writable layer
//! travels with the artifact, and files the tree held open on volumes are
//! held to what they were.
//!
//! - A containerd snapshotter gives the container an overlay whose upper
//!   dir is its writable layer (files the engine wrote: Triton's compiled
//!   launchers, Inductor's and vLLM's compile caches). The capture packs
//!   that dir as it is (whiteouts as 0:0 character devices, opaque dirs by
//!   their `trusted.overlay.opaque` xattr, modes, owners, xattrs, symlinks,
//!   hard links) into `rootfs/upper.tar`; a restore unpacks it into the new
//!   container's upper dir, still empty and not yet mounted, so the merged
//!   view over the same image is the one CRIU dumped.
//! - Files on volumes (bind mounts) are not vsnap's to carry: their
//!   fingerprints are recorded, and a restore whose file vanished or changed
//!   fails before CRIU runs, naming the file.

use std::collections::HashMap;
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;
use vsnap_artifact::rootfs::{self as record, OpenFile, RootfsLayer};

use crate::error::{Error, Result};

/// One mount of the container's rootfs, as the Create request gives it.
#[derive(Debug, Clone)]
pub struct RootMount {
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

/// Where the container's writable layer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritableLayer {
    /// An overlay's upper dir (containerd's overlayfs snapshotter).
    Upper(PathBuf),
    /// No rootfs mounts: the spec's root folder is shared with restores.
    Shared,
    ReadOnly,
    /// A layer that cannot be told from the image: why.
    Unknown(String),
}

impl WritableLayer {
    pub fn of(mounts: &[RootMount]) -> Self {
        let [m] = mounts else {
            return match mounts.len() {
                0 => WritableLayer::Shared,
                n => WritableLayer::Unknown(format!("a rootfs of {n} mounts")),
            };
        };
        let option = |key: &str| {
            m.options
                .iter()
                .find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        };
        let read_only = m.options.iter().any(|o| o == "ro");
        match m.kind.as_str() {
            "overlay" => match option("upperdir") {
                Some(upper) if !read_only => WritableLayer::Upper(PathBuf::from(upper)),
                _ => WritableLayer::ReadOnly,
            },
            _ if read_only => WritableLayer::ReadOnly,
            kind => WritableLayer::Unknown(format!(
                "a {} rootfs from {} (not an overlay: its changes cannot be told from the image's)",
                if kind.is_empty() { "bind" } else { kind },
                m.source
            )),
        }
    }

    /// A rootfs without mounts of the shim's own: the spec's root folder.
    /// A folder that is itself an overlay mount point was prepared by the
    /// caller (dockerd's overlay2 driver): its changes are the caller's
    /// snapshot's, not a folder the restores share, so it is not carried
    /// and the manifest says why. Else: shared.
    pub fn of_root_folder(root: &Path, mountinfo: &str) -> Self {
        let overlay = mountinfo.lines().find(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let Some(sep) = f.iter().position(|x| *x == "-") else {
                return false;
            };
            f.get(4).is_some_and(|p| Path::new(p) == root)
                && f.get(sep + 1).is_some_and(|t| *t == "overlay")
        });
        match overlay {
            Some(_) => WritableLayer::Unknown(format!(
                "{} is an overlay the caller mounted (e.g. dockerd's overlay2): its writable layer is not the shim's to carry",
                root.display()
            )),
            None => WritableLayer::Shared,
        }
    }

    /// The record of a layer with nothing to carry.
    pub fn record_without_carry(&self) -> Option<RootfsLayer> {
        match self {
            WritableLayer::Upper(_) => None,
            WritableLayer::Shared => Some(RootfsLayer::SharedFolder),
            WritableLayer::ReadOnly => Some(RootfsLayer::ReadOnly),
            WritableLayer::Unknown(reason) => Some(RootfsLayer::NotCarried {
                reason: reason.clone(),
            }),
        }
    }
}

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
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = upper.join(&rel);
        let mut names: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| phase(&dir, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| phase(&dir, e))?;
        names.sort();
        // Depth first in name order: a folder's entry precedes its contents.
        let mut dirs = Vec::new();
        for name in names {
            let rel = rel.join(&name);
            let path = upper.join(&rel);
            let md = fs::symlink_metadata(&path).map_err(|e| phase(&path, e))?;
            if md.is_dir() {
                dirs.push(rel.clone());
            }
            out.push(Entry { rel, md });
        }
        stack.extend(dirs.into_iter().rev());
    }
    // read_dir order was per folder; sort so parents precede children.
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
        .mode_0600()
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

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}
impl Mode0600 for fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
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
    let mut dirs: Vec<(PathBuf, u32, filetime::FileTime)> = Vec::new();
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
                    .mode_0600()
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
            dirs.push((dst, mode, mtime));
        } else {
            filetime::set_symlink_file_times(&dst, mtime, mtime)
                .map_err(|e| io(format!("mtime {shown}"), e))?;
        }
    }
    for (dir, _, mtime) in dirs.iter().rev() {
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

/// The bind mounts of a spec: (destination inside, source on the host).
fn volumes(spec: &Value) -> Vec<(String, String)> {
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["type"].as_str() == Some("bind")
                || m["options"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
        })
        .filter_map(|m| {
            Some((
                m["destination"].as_str()?.trim_end_matches('/').to_string(),
                m["source"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The volume (destination, source) of `path`: the innermost bind mount.
fn volume_of<'a>(path: &str, volumes: &'a [(String, String)]) -> Option<&'a (String, String)> {
    volumes
        .iter()
        .filter(|(dest, _)| {
            path.strip_prefix(dest.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .max_by_key(|(dest, _)| dest.len())
}

/// Mounts whose files vsnap carries another way (or that CRIU handles).
fn carried_elsewhere(volume: &str, control_mount: &str) -> bool {
    volume == control_mount
        || volume == "/dev/shm"
        || volume.starts_with("/dev/")
        || volume == "/dev"
}

/// The regular files the tree `pids` holds open or mapped on volumes of
/// `spec`, fingerprinted through `/proc/<pid>/root`.
pub fn open_volume_files(pids: &[i32], spec: &Value, control_mount: &str) -> Result<Vec<OpenFile>> {
    let volumes = volumes(spec);
    let mut seen: HashMap<String, i32> = HashMap::new();
    for pid in pids {
        let mut paths = Vec::new();
        if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                if let Ok(t) = fs::read_link(fd.path()) {
                    paths.push(t.to_string_lossy().to_string());
                }
            }
        }
        if let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) {
            for line in maps.lines() {
                // address perms offset dev inode pathname
                if let Some(p) = line.split_whitespace().nth(5) {
                    if p.starts_with('/') {
                        paths.push(line[line.find(p).unwrap_or(0)..].to_string());
                    }
                }
            }
        }
        for p in paths {
            if !p.starts_with('/') || p.ends_with(" (deleted)") {
                continue;
            }
            seen.entry(p).or_insert(*pid);
        }
    }
    let mut out = Vec::new();
    for (path, pid) in seen {
        let Some((volume, _)) = volume_of(&path, &volumes) else {
            continue; // the image or the writable layer
        };
        if carried_elsewhere(volume, control_mount) {
            continue;
        }
        let inside = format!("/proc/{pid}/root{path}");
        let Ok(md) = fs::symlink_metadata(&inside) else {
            continue; // gone meanwhile, or not a path of its root
        };
        if !md.is_file() {
            continue;
        }
        let digest = fs::File::open(&inside)
            .and_then(|mut f| record::file_digest(&mut f, md.len()))
            .map_err(|e| Error::io(format!("capture: volume files: read {path}"), e))?;
        out.push(OpenFile {
            path,
            volume: volume.clone(),
            size: md.len(),
            digest,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Before CRIU: each file the capture's tree held open on a volume is at
/// the same path of a volume of the restore's `spec`, with the same bytes.
pub fn check_volume_files(files: &[OpenFile], spec: &Value) -> Result<()> {
    let volumes = volumes(spec);
    let fail =
        |m: String| Error::FailedPrecondition(format!("restore: preflight: volume file {m}"));
    for f in files {
        let Some((dest, source)) = volume_of(&f.path, &volumes) else {
            return Err(fail(format!(
                "{}: no volume of this container holds it (the capture's tree had it open on the volume at {}): mount the same volume",
                f.path, f.volume
            )));
        };
        let rest = f.path[dest.len()..].trim_start_matches('/');
        let host = Path::new(source).join(rest);
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags_nofollow()
            .open(&host);
        let mut file = match opened {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(fail(format!(
                    "{} ({}) vanished since the capture, which had it open",
                    f.path,
                    host.display()
                )))
            }
            Err(e) => {
                return Err(Error::io(
                    format!("restore: preflight: volume file {}", host.display()),
                    e,
                ))
            }
        };
        let size = file
            .metadata()
            .map_err(|e| {
                Error::io(
                    format!("restore: preflight: volume file {}", host.display()),
                    e,
                )
            })?
            .len();
        let digest = record::file_digest(&mut file, size).map_err(|e| {
            Error::io(
                format!("restore: preflight: volume file {}", host.display()),
                e,
            )
        })?;
        if size != f.size || digest != f.digest {
            return Err(fail(format!(
                "{} ({}) changed since the capture, which had it open ({} bytes then, {size} now); the restored engine would read other bytes than it did: re-create the artifact",
                f.path,
                host.display(),
                f.size
            )));
        }
    }
    Ok(())
}

trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}
impl NoFollow for fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(options: &[&str]) -> RootMount {
        RootMount {
            kind: "overlay".into(),
            source: "overlay".into(),
            options: options.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_writable_layer_is_read_from_the_rootfs_mounts() {
        assert_eq!(WritableLayer::of(&[]), WritableLayer::Shared);
        assert_eq!(
            WritableLayer::of(&[overlay(&[
                "index=off",
                "workdir=/s/2/work",
                "upperdir=/s/2/fs",
                "lowerdir=/s/1/fs"
            ])]),
            WritableLayer::Upper(PathBuf::from("/s/2/fs"))
        );
        assert_eq!(
            WritableLayer::of(&[overlay(&["lowerdir=/s/1/fs:/s/0/fs"])]),
            WritableLayer::ReadOnly
        );
        let bind = RootMount {
            kind: "bind".into(),
            source: "/var/lib/native/snapshots/3".into(),
            options: vec!["rbind".into(), "rw".into()],
        };
        assert!(
            matches!(WritableLayer::of(&[bind]), WritableLayer::Unknown(r) if r.contains("/var/lib/native/snapshots/3"))
        );
    }

    #[test]
    fn a_root_folder_that_is_an_overlay_mount_is_not_taken_for_a_shared_one() {
        let info = "36 25 0:31 / /var/lib/docker/overlay2/abc/merged rw,relatime shared:1 - overlay overlay rw,lowerdir=/l,upperdir=/var/lib/docker/overlay2/abc/diff,workdir=/w\n\
                    37 25 8:1 / /srv/rootfs rw,relatime shared:2 - ext4 /dev/vda rw\n";
        assert!(matches!(
            WritableLayer::of_root_folder(Path::new("/var/lib/docker/overlay2/abc/merged"), info),
            WritableLayer::Unknown(r) if r.contains("overlay2")
        ));
        assert_eq!(
            WritableLayer::of_root_folder(Path::new("/srv/rootfs"), info),
            WritableLayer::Shared
        );
    }

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
    fn volume_files_are_held_to_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("w.bin"), b"weights").unwrap();
        let spec = serde_json::json!({"mounts": [
            {"destination": "/model", "type": "bind", "source": model, "options": ["rbind", "ro"]},
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ]});
        let mut f = fs::File::open(model.join("w.bin")).unwrap();
        let files = vec![OpenFile {
            path: "/model/w.bin".into(),
            volume: "/model".into(),
            size: 7,
            digest: record::file_digest(&mut f, 7).unwrap(),
        }];
        check_volume_files(&files, &spec).unwrap();
        fs::write(model.join("w.bin"), b"weightz").unwrap();
        let err = check_volume_files(&files, &spec).unwrap_err().to_string();
        assert!(
            err.starts_with("restore: preflight: volume file /model/w.bin")
                && err.contains("changed"),
            "{err}"
        );
        fs::remove_file(model.join("w.bin")).unwrap();
        let err = check_volume_files(&files, &spec).unwrap_err().to_string();
        assert!(err.contains("vanished"), "{err}");
        let err = check_volume_files(&files, &serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no volume of this container holds it"),
            "{err}"
        );
    }

    #[test]
    fn the_innermost_volume_holds_a_path() {
        let v = vec![
            ("/data".to_string(), "/a".to_string()),
            ("/data/cache".to_string(), "/b".to_string()),
        ];
        assert_eq!(volume_of("/data/cache/x", &v).unwrap().1, "/b");
        assert_eq!(volume_of("/data/x", &v).unwrap().1, "/a");
        assert!(volume_of("/database/x", &v).is_none());
    }
}
