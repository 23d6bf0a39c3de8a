//! The writable layer packed at a capture: the overlay upper dir as a tar,
//! its size bounded, the overlay's own pointers refused and its caches and
//! socket files left out (CRIU binds a live socket again at restore; a
//! stale one is garbage nothing reopens).

use std::collections::hash_map::{self, HashMap};
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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
/// the layer's record, which names the socket files left out. Fails naming
/// the path it cannot carry.
pub fn pack(upper: &Path, out: &Path, limit: u64) -> Result<RootfsLayer> {
    let (entries, sockets): (Vec<Entry>, Vec<Entry>) = walk(upper)?
        .into_iter()
        .partition(|e| !e.md.file_type().is_socket());
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
        sockets: sockets
            .iter()
            .map(|e| format!("/{}", e.rel.display()))
            .collect(),
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
                "/{} is a device node the writable layer cannot carry (only files, folders, links, FIFOs, whiteouts; sockets are left out)",
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
