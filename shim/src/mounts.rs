//! Mount points from /proc/self/mountinfo (read by vsnap-host's one
//! mountinfo parser): what lies under a folder, what is mounted at a
//! point, and taking it off, deepest first.

use std::path::{Path, PathBuf};

use log::warn;
use nix::mount::{umount2, MntFlags};
use vsnap_host::mountinfo::{self, MountRow};

/// This process's mount table (none when it cannot be read).
fn own_rows() -> Vec<MountRow> {
    mountinfo::own().unwrap_or_default()
}

/// The mount points at or below `dir` in `rows`, deepest first.
fn points_under(dir: &Path, rows: Vec<MountRow>) -> Vec<PathBuf> {
    let mut points: Vec<PathBuf> = rows
        .into_iter()
        .map(|r| r.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points
}

/// The topmost mount at `point` in this process's mount table.
pub fn top_at(point: &Path) -> Option<MountRow> {
    own_rows().into_iter().rfind(|r| r.mount_point == point)
}

pub fn has_mounts_under(dir: &Path) -> bool {
    !points_under(dir, own_rows()).is_empty()
}

/// Binds `source` (not what is mounted below it) at `target` and makes the
/// bind private: what is mounted on either side later stays there. Where
/// the second step fails, the bind is taken off again.
pub fn bind_private(source: &Path, target: &Path) -> nix::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    let private = mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    );
    if private.is_err() {
        let _ = umount2(target, MntFlags::MNT_DETACH);
    }
    private
}

/// Unmounts whatever is mounted at or below `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    for p in points_under(dir, own_rows()) {
        if let Err(e) = umount2(&p, MntFlags::MNT_DETACH) {
            warn!("unmount {}: {e}", p.display());
        }
    }
}

/// Unmounts whatever is mounted strictly below `dir` (not `dir` itself),
/// deepest first.
pub fn unmount_below(dir: &Path) {
    for p in points_under(dir, own_rows()) {
        if p == dir {
            continue;
        }
        if let Err(e) = umount2(&p, MntFlags::MNT_DETACH) {
            warn!("unmount {}: {e}", p.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as the kernel writes them, escaped spaces, tab, newline and
    /// backslash among them (the parser's own tests are vsnap-host's).
    const MOUNTINFO: &str = "\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
25 22 0:23 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
36 22 98:0 /mnt1 /run/vsnap/a\\040b rw,noatime master:1 - ext3 /dev/root rw,errors=continue
37 36 0:40 / /run/vsnap/a\\040b/c\\011d rw shared:7 master:3 propagate_from:2 unbindable - tmpfs tmpfs rw
38 36 0:41 / /run/vsnap/a\\040b/e\\012f\\134g rw - tmpfs none rw
39 22 0:42 / /run/vsnap/ab rw - tmpfs tmpfs rw
40 39 0:43 / /run/vsnap/ab rw shared:9 - overlay overlay rw
";

    #[test]
    fn the_topmost_mount_at_a_point_is_the_one_seen_there() {
        use nix::mount::{mount, MsFlags};
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path();
        assert_eq!(top_at(at), None, "nothing mounted yet");
        mount(
            Some("vsnap-a"),
            at,
            Some("tmpfs"),
            MsFlags::empty(),
            Some("size=4k"),
        )
        .unwrap();
        mount(
            Some("vsnap-b"),
            at,
            Some("tmpfs"),
            MsFlags::MS_RDONLY,
            Some("size=4k"),
        )
        .unwrap();
        let top = top_at(at).expect("two mounts there");
        unmount_under(at);
        assert_eq!(top.fs_type, "tmpfs");
        assert!(top.options.split(',').any(|o| o == "ro"), "{top:?}");
        assert_eq!(top_at(at), None, "both taken off");
    }

    #[test]
    fn the_points_under_a_folder_come_deepest_first() {
        assert_eq!(
            points_under(Path::new("/run/vsnap/a b"), mountinfo::parse(MOUNTINFO)),
            [
                PathBuf::from("/run/vsnap/a b/e\nf\\g"),
                PathBuf::from("/run/vsnap/a b/c\td"),
                PathBuf::from("/run/vsnap/a b"),
            ]
        );
        // Whole components: /run/vsnap/a is no folder of /run/vsnap/ab's.
        assert!(points_under(Path::new("/run/vsnap/a"), mountinfo::parse(MOUNTINFO)).is_empty());
        assert_eq!(
            points_under(Path::new("/run/vsnap"), mountinfo::parse(MOUNTINFO)).len(),
            5
        );
    }

    #[test]
    fn this_process_reads_its_own_mounts() {
        assert!(own_rows()
            .iter()
            .any(|r| r.mount_point == Path::new("/proc")));
        assert!(has_mounts_under(Path::new("/proc")));
    }

    #[test]
    fn a_failed_restores_binds_on_the_rootfs_go_and_the_rootfs_stays() {
        crate::cgroup_stats::test_support::require_root();
        use nix::mount::{mount, MsFlags};
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "host's file").unwrap();
        std::fs::write(rootfs.join("etc/hosts"), "").unwrap();
        let none: Option<&str> = None;
        // The rootfs is a mount of its own (as the shim's overlay), runc's
        // bind of the host's /etc/hosts lies on it.
        mount(
            Some("tmpfs"),
            &rootfs,
            Some("tmpfs"),
            MsFlags::empty(),
            none,
        )
        .unwrap();
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::write(rootfs.join("etc/hosts"), "").unwrap();
        mount(
            Some(&hosts),
            &rootfs.join("etc/hosts"),
            none,
            MsFlags::MS_BIND,
            none,
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(rootfs.join("etc/hosts")).unwrap(),
            "host's file"
        );
        unmount_below(&rootfs);
        let left = points_under(&rootfs, own_rows());
        assert_eq!(
            left,
            std::slice::from_ref(&rootfs),
            "the rootfs stays mounted, nothing below it"
        );
        assert_eq!(
            std::fs::read_to_string(rootfs.join("etc/hosts")).unwrap(),
            ""
        );
        unmount_under(&rootfs);
        assert!(!has_mounts_under(dir.path()));
    }
}
