//! A root folder that is an overlay the caller mounted before Create
//! (dockerd's overlay2 graph driver: no rootfs mounts in the request, the
//! spec's root path is `<data-root>/overlay2/<id>/merged`, already mounted).
//!
//! - Its writable layer is the overlay's upper dir: a capture packs it like
//!   a containerd snapshot's.
//! - A restore cannot write into the upper dir of a mounted overlay (the
//!   kernel leaves changes underneath a live overlay undefined), so it takes
//!   the overlay off, unpacks into the upper dir and mounts it again with
//!   the same options, before runc sees the folder.
//! - The per-container merged path says nothing about the image: the
//!   workload's rootfs identity is the image's layers instead, by dockerd's
//!   content-addressed chain id where its layer store names the top layer.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use vsnap_host::mountinfo;

/// An overlay mounted at the spec's root folder by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerOverlay {
    pub merged: PathBuf,
    pub upper: PathBuf,
    pub lower: Vec<PathBuf>,
    /// The super options as mountinfo shows them (the mount data again).
    pub options: String,
}

impl CallerOverlay {
    /// The overlay mounted at `root` per `mountinfo` (the last one there),
    /// None when `root` is not an overlay's mount point.
    pub fn at(root: &Path, mountinfo: &str) -> Option<Self> {
        let row = mountinfo::parse(mountinfo)
            .into_iter()
            .rfind(|r| r.mount_point == root && r.fs_type == "overlay")?;
        let option = |key: &str| {
            row.super_options
                .split(',')
                .find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        };
        let upper = PathBuf::from(option("upperdir")?);
        // dockerd mounts many layers with paths relative to its overlay2
        // folder (`l/<short id>`), from inside it: made absolute here.
        let base = upper
            .parent()
            .and_then(Path::parent)
            .unwrap_or(Path::new("/"));
        let lower = option("lowerdir")
            .map(|l| l.split(':').map(|p| base.join(p)).collect())
            .unwrap_or_default();
        Some(CallerOverlay {
            merged: root.to_path_buf(),
            upper,
            lower,
            options: row.super_options.clone(),
        })
    }

    /// The mount data to mount the overlay again: its options, with the
    /// lower dirs absolute.
    fn mount_data(&self) -> Result<String> {
        let lower: Vec<String> = self.lower.iter().map(|l| l.display().to_string()).collect();
        let data = self
            .options
            .split(',')
            .filter(|o| *o != "rw" && *o != "ro")
            .map(|o| match o.strip_prefix("lowerdir=") {
                Some(_) => format!("lowerdir={}", lower.join(":")),
                None => o.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",");
        // The kernel takes one page of mount data.
        if data.len() >= 4096 {
            return Err(Error::FailedPrecondition(format!(
                "restore: rootfs: the overlay at {} has {} layers, too many to mount again with absolute paths ({} bytes of options): restore it from an image with fewer layers",
                self.merged.display(),
                self.lower.len(),
                data.len()
            )));
        }
        Ok(data)
    }

    /// The image under the container, in words that are the same for every
    /// container of that image on this host (and, with dockerd's layer
    /// store, on every host): the lower layers without the container's own
    /// `-init` layer.
    pub fn image_identity(&self) -> String {
        let layers: Vec<PathBuf> = self
            .lower
            .iter()
            .map(|l| std::fs::canonicalize(l).unwrap_or_else(|_| l.clone()))
            .filter(|l| !layer_id(l).ends_with("-init"))
            .collect();
        if let Some(chain) = layers.first().and_then(|top| self.chain_id(top)) {
            return format!("overlay2 layers {chain}");
        }
        let shown: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
        format!("overlay lowerdir {}", shown.join(":"))
    }

    /// dockerd's chain id of the layer in folder `layer`
    /// (`<data-root>/overlay2/<cache id>/diff`): the entry of
    /// `<data-root>/image/overlay2/layerdb/sha256/` whose `cache-id` names it.
    fn chain_id(&self, layer: &Path) -> Option<String> {
        let cache_id = layer_id(layer);
        let data_root = layer.parent()?.parent()?.parent()?;
        let db = data_root.join("image/overlay2/layerdb/sha256");
        std::fs::read_dir(db).ok()?.flatten().find_map(|e| {
            let named = std::fs::read_to_string(e.path().join("cache-id")).ok()?;
            (named.trim() == cache_id)
                .then(|| format!("sha256:{}", e.file_name().to_string_lossy()))
        })
    }

    /// Takes the overlay off `merged`, runs `fill` on its upper dir, and
    /// mounts it again with the same options (also when `fill` failed, so
    /// the caller's mount is as it found it). An upper dir that is not empty
    /// (`docker restart` of the same container: the layer its last run
    /// wrote) is set aside first as `<upper>.vsnap-previous`, replacing an
    /// older one: the restore puts the layer back as captured, as it puts
    /// the memory back, and the files stay until the container is removed.
    pub fn refill(&self, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        use nix::mount::{mount, umount2, MntFlags, MsFlags};
        let shown = self.merged.display();
        let data = self.mount_data()?;
        umount2(&self.merged, MntFlags::empty()).map_err(|e| {
            Error::FailedPrecondition(format!(
                "restore: rootfs: unmount the caller's overlay at {shown} to put the carried layer into it: {e}"
            ))
        })?;
        let filled = self.set_aside_used_layer().and_then(|()| fill(&self.upper));
        mount(
            Some("overlay"),
            &self.merged,
            Some("overlay"),
            MsFlags::empty(),
            Some(data.as_str()),
        )
        .map_err(|e| {
            Error::Other(format!(
                "restore: rootfs: mount the caller's overlay at {shown} again ({data}): {e}"
            ))
        })?;
        filled
    }
}

impl CallerOverlay {
    fn set_aside_used_layer(&self) -> Result<()> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let io = |what: &str, e| {
            Error::io(
                format!("restore: rootfs: {what} {}", self.upper.display()),
                e,
            )
        };
        let used = std::fs::read_dir(&self.upper)
            .map_err(|e| io("read", e))?
            .next()
            .is_some();
        if !used {
            return Ok(());
        }
        let meta = std::fs::metadata(&self.upper).map_err(|e| io("stat", e))?;
        let mut aside = self.upper.clone().into_os_string();
        aside.push(".vsnap-previous");
        let aside = PathBuf::from(aside);
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(|e| io("remove the older copy of", e))?;
        }
        std::fs::rename(&self.upper, &aside).map_err(|e| io("set aside", e))?;
        std::fs::create_dir(&self.upper).map_err(|e| io("create", e))?;
        std::fs::set_permissions(&self.upper, std::fs::Permissions::from_mode(meta.mode()))
            .map_err(|e| io("chmod", e))?;
        std::os::unix::fs::chown(&self.upper, Some(meta.uid()), Some(meta.gid()))
            .map_err(|e| io("chown", e))?;
        log::info!(
            "restore: rootfs: the container's used layer {} set aside as {}",
            self.upper.display(),
            aside.display()
        );
        Ok(())
    }
}

/// The cache id of a layer folder `<...>/overlay2/<cache id>/diff`.
fn layer_id(layer: &Path) -> String {
    layer
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlay_at_the_root_folder_is_read_from_mountinfo() {
        let info = "36 25 0:31 / /d/overlay2/abc/merged rw,relatime shared:1 - overlay overlay rw,lowerdir=/d/overlay2/l/A:/d/overlay2/l/B,upperdir=/d/overlay2/abc/diff,workdir=/d/overlay2/abc/work\n\
                    37 25 8:1 / /srv/rootfs rw,relatime shared:2 - ext4 /dev/vda rw\n";
        let o = CallerOverlay::at(Path::new("/d/overlay2/abc/merged"), info).unwrap();
        assert_eq!(o.upper, PathBuf::from("/d/overlay2/abc/diff"));
        assert_eq!(
            o.lower,
            [PathBuf::from("/d/overlay2/l/A"), "/d/overlay2/l/B".into()]
        );
        assert!(CallerOverlay::at(Path::new("/srv/rootfs"), info).is_none());
        assert_eq!(
            o.mount_data().unwrap(),
            "lowerdir=/d/overlay2/l/A:/d/overlay2/l/B,upperdir=/d/overlay2/abc/diff,workdir=/d/overlay2/abc/work"
        );
        // Many layers: dockerd's paths relative to its overlay2 folder.
        let relative = info.replace(
            "lowerdir=/d/overlay2/l/A:/d/overlay2/l/B",
            "lowerdir=l/A:l/B",
        );
        let r = CallerOverlay::at(Path::new("/d/overlay2/abc/merged"), &relative).unwrap();
        assert_eq!(r.lower, o.lower);
        assert_eq!(r.mount_data().unwrap(), o.mount_data().unwrap());
    }

    #[test]
    fn the_image_identity_leaves_the_containers_init_layer_out_and_names_the_chain() {
        let d = tempfile::tempdir().unwrap();
        let o2 = d.path().join("overlay2");
        for id in ["c1-init", "c2-init", "img"] {
            std::fs::create_dir_all(o2.join(id).join("diff")).unwrap();
        }
        std::fs::create_dir_all(o2.join("l")).unwrap();
        for (short, id) in [("I1", "c1-init"), ("I2", "c2-init"), ("IM", "img")] {
            std::os::unix::fs::symlink(format!("../{id}/diff"), o2.join("l").join(short)).unwrap();
        }
        let of = |init: &str| CallerOverlay {
            merged: "/m".into(),
            upper: "/u".into(),
            lower: vec![o2.join("l").join(init), o2.join("l/IM")],
            options: String::new(),
        };
        let (a, b) = (of("I1").image_identity(), of("I2").image_identity());
        assert_eq!(a, b);
        assert!(
            a.starts_with("overlay lowerdir ") && a.ends_with("img/diff"),
            "{a}"
        );
        let db = d.path().join("image/overlay2/layerdb/sha256/c0ffee");
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(db.join("cache-id"), "img").unwrap();
        assert_eq!(of("I1").image_identity(), "overlay2 layers sha256:c0ffee");
    }
}
