//! What a captured tree held in memory, as the manifest records it: the
//! memory a restore of it charges to the new container's memory cgroup.
//!
//! Counted (docs/annotations.md, "Memory at restore"):
//! - `pages_bytes`: the bytes of CRIU's page images (`images/pages-*.img`),
//!   every page of the tree's anonymous memory, private and shared (heap,
//!   weights, memfd). A restore puts each of them back into the tree's
//!   address space (CRIU itself, or vsnap's page server with
//!   `UFFDIO_COPY`), and the kernel charges each to the restored task's
//!   memory cgroup.
//! - `dev_shm_bytes`: what the tmpfs at the container's `/dev/shm` held
//!   (named files, and unlinked ones still open), as tmpfs pages are
//!   charged like anonymous ones. For a `/dev/shm` the container mounts
//!   from a host tmpfs: the bytes of the files carried in `dev-shm/`; for
//!   the container's own tmpfs: what the file system says is used. Zero
//!   where `/dev/shm` is no tmpfs (a host folder on disk).
//!
//! Zero pages elided at capture (`ZeroPages`, the manifest's `zero_pages`)
//! are not in the page images, so not in `pages_bytes` either: a restore
//! leaves them unmapped (they read as zeros) and charges nothing for them
//! until the restored process writes to them, as for pages it never
//! touched before the capture.
//!
//! Not counted: the tree's file-backed pages (binaries, libraries, files it
//! maps: page cache, charged once to whoever read them first), the kernel's
//! own memory for the tree (page tables, sockets), and what CRIU itself
//! allocates while it restores; a limit needs some headroom above the
//! need for those. The tree's RSS is not used: it counts a page shared by
//! two processes twice and includes file-backed pages.

use std::path::Path;

use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;

/// What the captured tree held in memory (see the module's comment).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    /// Bytes of CRIU's page images (`images/pages-*.img`).
    pub pages_bytes: u64,
    /// Bytes the tmpfs at the container's `/dev/shm` held.
    pub dev_shm_bytes: u64,
}

impl Memory {
    /// What a restore charges to the container's memory cgroup at least.
    pub fn need(&self) -> u64 {
        self.pages_bytes.saturating_add(self.dev_shm_bytes)
    }

    /// The page images' bytes under `images` (a CRIU image folder).
    pub fn pages_under(images: &Path) -> u64 {
        let Ok(entries) = std::fs::read_dir(images) else {
            return 0;
        };
        entries
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("pages-") && name.ends_with(".img")
            })
            .filter_map(|e| e.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    }
}

/// The all-zero pages of private anonymous memory a capture left out of
/// its page images (holes in the pagemap: a restore maps nothing there and
/// the pages read as zeros), as the manifest records them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ZeroPages {
    /// 4 KiB pages left out.
    pub elided_pages: u64,
    /// Their bytes (`elided_pages` x 4096): what the page images would
    /// have held more.
    pub elided_bytes: u64,
}

impl ZeroPages {
    /// `pages` 4 KiB pages.
    pub fn of_pages(pages: u64) -> Self {
        ZeroPages {
            elided_pages: pages,
            elided_bytes: pages * 4096,
        }
    }
}

/// `1031 MiB (pages 1024 MiB, /dev/shm 7 MiB)`: each rounded up to whole MiB.
impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} MiB (pages {} MiB, /dev/shm {} MiB)",
            mib_up(self.need()),
            mib_up(self.pages_bytes),
            mib_up(self.dev_shm_bytes)
        )
    }
}

/// Bytes in whole MiB, rounded up: a need is never shown smaller.
pub fn mib_up(bytes: u64) -> u64 {
    bytes.div_ceil(MIB)
}

/// Bytes in whole MiB, rounded down: a limit is never shown larger, so a
/// limit below a need never reads as equal to it.
pub fn mib_down(bytes: u64) -> u64 {
    bytes / MIB
}

/// The bytes a tmpfs at `path` holds (`statfs`: blocks used times the block
/// size); `None` when `path` is not on a tmpfs or cannot be read.
pub fn tmpfs_used(path: &Path) -> Option<u64> {
    let fs = nix::sys::statfs::statfs(path).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return None;
    }
    let used = fs.blocks().saturating_sub(fs.blocks_free());
    Some(used.saturating_mul(fs.block_size() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_is_pages_and_dev_shm_shown_rounded_up() {
        let m = Memory {
            pages_bytes: 1024 * MIB,
            dev_shm_bytes: 7 * MIB - 100,
        };
        assert_eq!(m.need(), 1031 * MIB - 100);
        assert_eq!(m.to_string(), "1031 MiB (pages 1024 MiB, /dev/shm 7 MiB)");
        assert_eq!(mib_up(1), 1);
        assert_eq!(mib_down(MIB - 1), 0);
        assert_eq!(mib_up(0), 0);
    }

    #[test]
    fn only_page_images_count() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pages-1.img"), vec![0u8; 8192]).unwrap();
        std::fs::write(dir.path().join("pages-2.img"), vec![0u8; 4096]).unwrap();
        std::fs::write(dir.path().join("pagemap-1.img"), vec![0u8; 100]).unwrap();
        std::fs::write(dir.path().join("core-1.img"), vec![0u8; 100]).unwrap();
        std::fs::create_dir(dir.path().join("pages-3.img")).unwrap();
        assert_eq!(Memory::pages_under(dir.path()), 12288);
        assert_eq!(Memory::pages_under(&dir.path().join("missing")), 0);
    }

    #[test]
    fn a_manifest_record_is_strict() {
        let m: Memory = serde_json::from_str(r#"{"pages_bytes":5,"dev_shm_bytes":2}"#).unwrap();
        assert_eq!(m.need(), 7);
        assert!(serde_json::from_str::<Memory>(r#"{"pages_bytes":5}"#).is_err());
        assert!(
            serde_json::from_str::<Memory>(r#"{"pages_bytes":5,"dev_shm_bytes":2,"x":1}"#).is_err()
        );
    }

    #[test]
    fn a_folder_on_disk_is_no_tmpfs() {
        // The crate's own folder is on a disk file system here; /dev/shm is
        // a tmpfs on any Linux host that runs containers.
        assert_eq!(tmpfs_used(Path::new(env!("CARGO_MANIFEST_DIR"))), None);
        if Path::new("/dev/shm").is_dir() {
            assert!(tmpfs_used(Path::new("/dev/shm")).is_some());
        }
    }
}
