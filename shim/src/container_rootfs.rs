//! The container's root filesystem: the Create request's rootfs mounts at
//! the bundle's `rootfs`, or, for an artifact's restore of a root folder
//! other containers may share, a private bind of that folder there; and
//! taking them off again.

use containerd_shim::mount::mount_rootfs;
use nix::mount::{umount2, MntFlags};

use super::Container;
use crate::error::{Error, Result};
use crate::snapshot::plan::RestorePlan;

impl Container {
    pub(super) fn mount_rootfs(&mut self) -> Result<()> {
        if self.rootfs.is_empty() {
            return self.bind_shared_root();
        }
        let rootfs = self.bundle.join("rootfs");
        std::fs::create_dir_all(&rootfs)
            .map_err(|e| Error::io(format!("create: mkdir {}", rootfs.display()), e))?;
        for m in &self.rootfs {
            let fs_type = (!m.kind.is_empty()).then_some(m.kind.as_str());
            let source = (!m.source.is_empty()).then_some(m.source.as_str());
            mount_rootfs(fs_type, source, &m.options, &rootfs).map_err(|e| {
                Error::InvalidArgument(format!(
                    "create: mount rootfs {} ({}): {e}",
                    m.source, m.kind
                ))
            })?;
            // Each mount made is one to take off, should a later one fail.
            self.rootfs_mounted = true;
        }
        Ok(())
    }

    /// A restore's private bind of a shared root folder at the bundle's
    /// `rootfs` (`RestorePlan::shared_root`), which the restore's spec names.
    fn bind_shared_root(&mut self) -> Result<()> {
        let Some(folder) = self.start.shared_root() else {
            return Ok(());
        };
        let rootfs = self.bundle.join(RestorePlan::SHARED_ROOT_MOUNT);
        std::fs::create_dir_all(&rootfs)
            .map_err(|e| Error::io(format!("create: mkdir {}", rootfs.display()), e))?;
        crate::mounts::bind_private(folder, &rootfs).map_err(|e| {
            Error::FailedPrecondition(format!(
                "create: bind the shared root folder {} at {}: {e}",
                folder.display(),
                rootfs.display()
            ))
        })?;
        self.rootfs_mounted = true;
        Ok(())
    }

    pub(super) fn unmount_rootfs(&mut self) {
        if !self.rootfs_mounted {
            return;
        }
        let rootfs = self.bundle.join("rootfs");
        // Layered mounts (overlay on bind, ...) come off one at a time.
        while umount2(&rootfs, MntFlags::empty()).is_ok() {}
        self.rootfs_mounted = false;
    }
}
