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
//! - dockerd's overlay2 driver mounts the overlay itself, before Create:
//!   the same upper dir is packed, and a restore unpacks into it with the
//!   overlay taken off for the time (`caller_overlay.rs`).
//! - Files on volumes (bind mounts) are not vsnap's to carry: their
//!   fingerprints are recorded, and a restore whose file vanished or changed
//!   fails before CRIU runs, naming the file.

mod caller_overlay;
#[cfg(test)]
mod layer_tests;
mod pack;
pub(crate) mod shm;
mod unpack;
mod volumes;

pub use caller_overlay::CallerOverlay;
pub use pack::pack;
pub use unpack::unpack;
pub use volumes::{check_volume_files, open_volume_files};

use std::path::{Path, PathBuf};

use vsnap_artifact::rootfs::RootfsLayer;

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
    /// An overlay the caller mounted at the root folder (dockerd's overlay2).
    Mounted(CallerOverlay),
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
    /// caller (dockerd's overlay2 driver): its upper dir is the writable
    /// layer ([`CallerOverlay`]). Any other folder is shared with restores.
    pub fn of_root_folder(root: &Path, mountinfo: &str) -> Self {
        match CallerOverlay::at(root, mountinfo) {
            Some(o) => WritableLayer::Mounted(o),
            None => WritableLayer::Shared,
        }
    }

    /// What the container's rootfs is, in words.
    pub fn describe(&self) -> String {
        match self {
            WritableLayer::Upper(upper) => {
                format!("an overlay snapshot (upper dir {})", upper.display())
            }
            WritableLayer::Mounted(o) => format!(
                "an overlay mounted by the caller at {} (upper dir {})",
                o.merged.display(),
                o.upper.display()
            ),
            WritableLayer::Shared => "a rootfs folder of its own (--rootfs)".to_string(),
            WritableLayer::ReadOnly => "a read-only rootfs".to_string(),
            WritableLayer::Unknown(why) => why.clone(),
        }
    }

    /// The upper dir a capture packs, or the record of a layer with
    /// nothing to carry.
    pub fn to_carry(&self) -> std::result::Result<&Path, RootfsLayer> {
        match self {
            WritableLayer::Upper(upper) => Ok(upper),
            WritableLayer::Mounted(o) => Ok(&o.upper),
            WritableLayer::Shared => Err(RootfsLayer::SharedFolder),
            WritableLayer::ReadOnly => Err(RootfsLayer::ReadOnly),
            WritableLayer::Unknown(reason) => Err(RootfsLayer::NotCarried {
                reason: reason.clone(),
            }),
        }
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
        let layer =
            WritableLayer::of_root_folder(Path::new("/var/lib/docker/overlay2/abc/merged"), info);
        assert_eq!(
            layer.to_carry().ok(),
            Some(Path::new("/var/lib/docker/overlay2/abc/diff"))
        );
        assert_eq!(
            WritableLayer::of_root_folder(Path::new("/srv/rootfs"), info),
            WritableLayer::Shared
        );
    }
}
