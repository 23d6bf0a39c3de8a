//! The writable layer unpacked at a restore into the fresh upper dir: every
//! entry's path kept inside it, no link followed on the way, each kind of
//! entry made as captured with its attributes.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use filetime::FileTime;

use crate::error::{Error, Result};

/// A restore's refusal of the carried layer.
fn restore_refused(m: String) -> Error {
    Error::FailedPrecondition(format!("restore: rootfs: {m}"))
}

/// A restore's failure to read the tar or write the upper dir.
fn restore_io(what: String, e: std::io::Error) -> Error {
    Error::io(format!("restore: rootfs: {what}"), e)
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

#[cfg(test)]
/// [`unpack`] of the file `tar_path`, unchecked (the tests').
pub(super) fn unpack_file(tar_path: &Path, upper: &Path) -> Result<()> {
    let f = fs::File::open(tar_path)
        .map_err(|e| Error::io(format!("restore: rootfs: open {}", tar_path.display()), e))?;
    unpack(f, tar_path, upper).map(drop)
}
