//! The writable layer as a tar of the overlay upper dir: packed at a
//! capture, unpacked into a restore's fresh upper dir.

use std::collections::hash_map::{self, HashMap};
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use filetime::FileTime;
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

/// A capture's refusal of the layer.
fn capture_refused(m: String) -> Error {
    Error::FailedPrecondition(format!("capture: rootfs: {m}"))
}

/// A capture's failure to read the layer or write the tar.
fn capture_io(what: String, e: std::io::Error) -> Error {
    Error::io(format!("capture: rootfs: {what}"), e)
}

/// A restore's refusal of the carried layer.
fn restore_refused(m: String) -> Error {
    Error::FailedPrecondition(format!("restore: rootfs: {m}"))
}

/// A restore's failure to read the tar or write the upper dir.
fn restore_io(what: String, e: std::io::Error) -> Error {
    Error::io(format!("restore: rootfs: {what}"), e)
}

struct Entry {
    rel: PathBuf,
    md: fs::Metadata,
}

fn walk(upper: &Path) -> Result<Vec<Entry>> {
    let phase = |p: &Path, e| capture_io(format!("read {}", p.display()), e);
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
    let entries = walk(upper)?;
    if let Some(m) = too_large(&entries, limit) {
        return Err(capture_refused(m));
    }
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| capture_io(format!("create {}", out.display()), e))?;
    let mut packer = Packer::new(BufWriter::with_capacity(1 << 20, file));
    for e in &entries {
        packer.append(upper, e)?;
    }
    let bytes = packer.finish()?;
    Ok(RootfsLayer::OverlayUpper {
        bytes,
        entries: entries.len() as u64,
    })
}

/// The xattrs of the entry `e` (at `path`) the layer carries, as PAX
/// records: none for a symlink, overlayfs's caches left out. An entry using
/// an overlayfs pointer is refused.
fn carried_xattrs(e: &Entry, path: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let mut xattrs = Vec::new();
    if e.md.file_type().is_symlink() {
        return Ok(xattrs);
    }
    for name in
        xattr::list(path).map_err(|err| capture_io(format!("xattrs of {}", path.display()), err))?
    {
        let n = name.to_string_lossy().to_string();
        if OVERLAY_POINTERS.contains(&n.as_str()) {
            return Err(capture_refused(format!(
                "/{} uses overlayfs {n} (redirect_dir or metacopy): such a layer cannot be moved onto another snapshot; mount the overlay without them",
                e.rel.display()
            )));
        }
        if OVERLAY_CACHES.contains(&n.as_str()) {
            continue;
        }
        if let Some(v) = xattr::get(path, &name)
            .map_err(|err| capture_io(format!("xattr {n} of {}", path.display()), err))?
        {
            xattrs.push((format!("SCHILY.xattr.{n}"), v));
        }
    }
    Ok(xattrs)
}

/// The tar being written, the first path each hard-linked file was packed
/// under, and the regular-file bytes packed so far.
struct Packer<W: Write> {
    tar: tar::Builder<W>,
    linked: HashMap<(u64, u64), PathBuf>,
    bytes: u64,
}

impl<W: Write> Packer<W> {
    fn new(w: W) -> Self {
        let mut tar = tar::Builder::new(w);
        tar.mode(tar::HeaderMode::Complete);
        Packer {
            tar,
            linked: HashMap::new(),
            bytes: 0,
        }
    }

    /// Appends the entry `e` of `upper`: its xattrs, then the entry itself
    /// (a hard link to its first path when that was packed already).
    fn append(&mut self, upper: &Path, e: &Entry) -> Result<()> {
        let path = upper.join(&e.rel);
        // xattrs first: a PAX header describes the entry after it.
        let xattrs = carried_xattrs(e, &path)?;
        if !xattrs.is_empty() {
            self.tar
                .append_pax_extensions(xattrs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
                .map_err(|err| capture_io("write".into(), err))?;
        }
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(&e.md, tar::HeaderMode::Complete);
        if let Some(first) = self.packed_before(e) {
            h.set_entry_type(tar::EntryType::Link);
            h.set_size(0);
            return self.append_link(&mut h, e, &first);
        }
        let ft = e.md.file_type();
        if ft.is_file() {
            self.append_file(&mut h, e, &path)
        } else if ft.is_dir() || ft.is_fifo() {
            self.append_data(&mut h, e, &mut std::io::empty())
        } else if ft.is_symlink() {
            let target = fs::read_link(&path)
                .map_err(|err| capture_io(format!("readlink {}", path.display()), err))?;
            self.append_link(&mut h, e, &target)
        } else if ft.is_char_device() && e.md.rdev() == 0 {
            // A whiteout: the file is deleted from the image.
            self.append_data(&mut h, e, &mut std::io::empty())
        } else {
            Err(capture_refused(format!(
                "/{} is a device or socket the writable layer cannot carry (only files, folders, links, FIFOs and whiteouts)",
                e.rel.display()
            )))
        }
    }

    /// The path a hard-linked file `e` was first packed under, if it was;
    /// else `None`, `e`'s path recorded as the first for a hard-linked file.
    fn packed_before(&mut self, e: &Entry) -> Option<PathBuf> {
        if !(e.md.file_type().is_file() && e.md.nlink() > 1) {
            return None;
        }
        match self.linked.entry((e.md.dev(), e.md.ino())) {
            hash_map::Entry::Occupied(first) => Some(first.get().clone()),
            hash_map::Entry::Vacant(v) => {
                v.insert(e.rel.clone());
                None
            }
        }
    }

    /// A regular file's entry, its bytes read from `path`.
    fn append_file(&mut self, h: &mut tar::Header, e: &Entry, path: &Path) -> Result<()> {
        let f = fs::File::open(path)
            .map_err(|err| capture_io(format!("open {}", path.display()), err))?;
        let mut f = std::io::BufReader::with_capacity(1 << 20, f);
        self.bytes += e.md.len();
        self.append_data(h, e, &mut f)
    }

    fn append_data(&mut self, h: &mut tar::Header, e: &Entry, data: &mut dyn Read) -> Result<()> {
        self.tar
            .append_data(h, &e.rel, data)
            .map_err(|err| capture_io(format!("pack /{}", e.rel.display()), err))
    }

    /// A symlink's or a hard link's entry (as `h` says), pointing at `target`.
    fn append_link(&mut self, h: &mut tar::Header, e: &Entry, target: &Path) -> Result<()> {
        self.tar
            .append_link(h, &e.rel, target)
            .map_err(|err| capture_io(format!("pack /{}", e.rel.display()), err))
    }

    /// Ends the tar; the regular-file bytes it holds. Synced with the rest
    /// of the staging folder when it is published.
    fn finish(self) -> Result<u64> {
        let mut w = self
            .tar
            .into_inner()
            .map_err(|e| capture_io("finish the tar".into(), e))?;
        w.flush().map_err(|e| capture_io("write".into(), e))?;
        Ok(self.bytes)
    }
}

/// Unpacks a carried layer, read from `source` (the tar `tar_path` names),
/// into `upper`, the new container's upper dir (empty, not mounted yet),
/// and returns the reader, which may hold the tar's trailing padding.
/// Every entry's path must stay inside `upper` through real folders: `..`,
/// absolute paths and entries under a symlink are refused, naming the path.
pub fn unpack<R: Read>(source: R, tar_path: &Path, upper: &Path) -> Result<R> {
    check_fresh(upper)?;
    let read = |e| restore_io(format!("read {}", tar_path.display()), e);
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(1 << 20, source));
    let mut unpacker = Unpacker {
        upper,
        copy_buf: vec![0u8; 1 << 20],
        dirs: Vec::new(),
    };
    for entry in archive.entries().map_err(read)? {
        unpacker.unpack_entry(&mut entry.map_err(read)?)?;
    }
    unpacker.date_dirs();
    Ok(archive.into_inner().into_inner())
}

/// The carried layer goes only into an empty upper dir.
fn check_fresh(upper: &Path) -> Result<()> {
    let non_empty = fs::read_dir(upper)
        .map_err(|e| restore_io(format!("read {}", upper.display()), e))?
        .next()
        .is_some();
    if non_empty {
        return Err(restore_refused(format!(
            "the container's upper dir {} is not empty: the carried layer goes only onto a fresh snapshot",
            upper.display()
        )));
    }
    Ok(())
}

/// An entry's path, refused when it is empty or leaves the rootfs (`..`,
/// absolute).
fn entry_path<R: Read>(entry: &tar::Entry<'_, R>) -> Result<PathBuf> {
    let rel = entry
        .path()
        .map_err(|e| restore_io("an entry's path".into(), e))?
        .into_owned();
    if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(restore_refused(format!(
            "/{}: a path that leaves the rootfs",
            rel.display()
        )));
    }
    Ok(rel)
}

/// Every folder above the entry `rel` is one the layer made, not a link.
fn check_real_folders_above(upper: &Path, rel: &Path, shown: &str) -> Result<()> {
    let mut at = upper.to_path_buf();
    for c in rel.parent().into_iter().flat_map(Path::components) {
        at.push(c);
        let real_dir = fs::symlink_metadata(&at)
            .map(|m| m.is_dir())
            .unwrap_or(false);
        if !real_dir {
            return Err(restore_refused(format!(
                "{shown}: {} is not a folder of the layer",
                at.display()
            )));
        }
    }
    Ok(())
}

/// What an entry carries besides its data and type.
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: FileTime,
    xattrs: Vec<(String, Vec<u8>)>,
}

impl Attrs {
    fn of<R: Read>(entry: &mut tar::Entry<'_, R>, shown: &str) -> Result<Attrs> {
        let h = entry.header();
        let mode = h
            .mode()
            .map_err(|e| restore_io(format!("{shown}: mode"), e))?;
        let (uid, gid) = (
            h.uid()
                .map_err(|e| restore_io(format!("{shown}: uid"), e))? as u32,
            h.gid()
                .map_err(|e| restore_io(format!("{shown}: gid"), e))? as u32,
        );
        let mtime = FileTime::from_unix_time(h.mtime().unwrap_or(0) as i64, 0);
        let xattrs = entry
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
        Ok(Attrs {
            mode,
            uid,
            gid,
            mtime,
            xattrs,
        })
    }

    /// Owner, mode and xattrs given to `dst` (its mtime is the caller's).
    fn apply(&self, dst: &Path, shown: &str) -> Result<()> {
        std::os::unix::fs::chown(dst, Some(self.uid), Some(self.gid))
            .map_err(|e| restore_io(format!("chown {shown}"), e))?;
        fs::set_permissions(dst, fs::Permissions::from_mode(self.mode & 0o7777))
            .map_err(|e| restore_io(format!("chmod {shown}"), e))?;
        for (k, v) in &self.xattrs {
            xattr::set(dst, k, v).map_err(|e| restore_io(format!("xattr {k} of {shown}"), e))?;
        }
        Ok(())
    }
}

fn create_failed(shown: &str, e: std::io::Error) -> Error {
    restore_io(format!("create {shown}"), e)
}

/// A layer being unpacked into `upper`: the buffer file data is copied
/// through, and the folders made, dated once their contents are in.
struct Unpacker<'a> {
    upper: &'a Path,
    copy_buf: Vec<u8>,
    dirs: Vec<(PathBuf, FileTime)>,
}

impl Unpacker<'_> {
    /// Makes one entry of the tar under `upper`, with the owner, mode,
    /// xattrs and mtime it carries (a link: its own owner at most).
    fn unpack_entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let rel = entry_path(entry)?;
        let shown = format!("/{}", rel.display());
        check_real_folders_above(self.upper, &rel, &shown)?;
        let dst = self.upper.join(&rel);
        let h = entry.header().clone();
        let attrs = Attrs::of(entry, &shown)?;
        use tar::EntryType as T;
        match h.entry_type() {
            T::Directory => fs::create_dir(&dst).map_err(|e| create_failed(&shown, e))?,
            T::Regular | T::GNUSparse | T::Continuous => self.write_file(entry, &dst, &shown)?,
            T::Symlink => return make_symlink(&h, &dst, &attrs, &shown),
            T::Link => return make_hard_link(&h, self.upper, &dst, &shown),
            T::Char => make_whiteout(&h, &dst, &shown)?,
            T::Fifo => nix::unistd::mkfifo(&dst, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|e| restore_io(format!("fifo {shown}"), e.into()))?,
            other => {
                return Err(restore_refused(format!(
                    "{shown}: an entry of type {other:?}"
                )))
            }
        }
        attrs.apply(&dst, &shown)?;
        if h.entry_type() == T::Directory {
            // Its mtime once its contents are in.
            self.dirs.push((dst, attrs.mtime));
            return Ok(());
        }
        filetime::set_symlink_file_times(&dst, attrs.mtime, attrs.mtime)
            .map_err(|e| restore_io(format!("mtime {shown}"), e))
    }

    /// A regular file's entry: `dst` created (0600 until its mode is set)
    /// and its data copied in.
    fn write_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        dst: &Path,
        shown: &str,
    ) -> Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dst)
            .map_err(|e| create_failed(shown, e))?;
        loop {
            let n = entry
                .read(&mut self.copy_buf)
                .map_err(|e| create_failed(shown, e))?;
            if n == 0 {
                return Ok(());
            }
            f.write_all(&self.copy_buf[..n])
                .map_err(|e| create_failed(shown, e))?;
        }
    }

    /// The folders' mtimes, the deepest first (best effort).
    fn date_dirs(&self) {
        for (dir, mtime) in self.dirs.iter().rev() {
            let _ = filetime::set_symlink_file_times(dir, *mtime, *mtime);
        }
    }
}

/// A symlink's entry: the link, owned as carried (no mode, xattrs or mtime).
fn make_symlink(h: &tar::Header, dst: &Path, attrs: &Attrs, shown: &str) -> Result<()> {
    let target = h
        .link_name()
        .map_err(|e| restore_io(format!("{shown}: link"), e))?
        .ok_or_else(|| restore_refused(format!("{shown}: a symlink without a target")))?;
    std::os::unix::fs::symlink(&target, dst).map_err(|e| create_failed(shown, e))?;
    std::os::unix::fs::lchown(dst, Some(attrs.uid), Some(attrs.gid))
        .map_err(|e| restore_io(format!("chown {shown}"), e))
}

/// A hard link's entry: a link to a regular file unpacked before, inside
/// the rootfs.
fn make_hard_link(h: &tar::Header, upper: &Path, dst: &Path, shown: &str) -> Result<()> {
    let target = h
        .link_name()
        .map_err(|e| restore_io(format!("{shown}: link"), e))?
        .ok_or_else(|| restore_refused(format!("{shown}: a hard link without a target")))?;
    if !target
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(restore_refused(format!(
            "{shown}: a hard link that leaves the rootfs"
        )));
    }
    let src = upper.join(&target);
    let md = fs::symlink_metadata(&src)
        .map_err(|e| restore_io(format!("{shown}: link target /{}", target.display()), e))?;
    if !md.is_file() {
        return Err(restore_refused(format!(
            "{shown}: a hard link to a non-file"
        )));
    }
    fs::hard_link(&src, dst).map_err(|e| create_failed(shown, e))
}

/// A character device's entry, which must be a whiteout (device 0/0).
fn make_whiteout(h: &tar::Header, dst: &Path, shown: &str) -> Result<()> {
    let dev = (
        h.device_major().ok().flatten().unwrap_or(0),
        h.device_minor().ok().flatten().unwrap_or(0),
    );
    if dev != (0, 0) {
        return Err(restore_refused(format!(
            "{shown}: a device node, not a whiteout"
        )));
    }
    nix::sys::stat::mknod(
        dst,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0),
        0,
    )
    .map_err(|e| restore_io(format!("whiteout {shown}"), e.into()))
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
