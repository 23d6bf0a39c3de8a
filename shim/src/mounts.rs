//! Mount points from /proc/self/mountinfo: one reading of its rows, what
//! lies under a folder, what is mounted at a point, and taking it off,
//! deepest first.
//!
//! metrics.rs still reads the cgroup mounts with a parser of its own
//! (`parse_mountinfo_line`): it needs the root and the super options too.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use log::warn;
use nix::mount::{umount2, MntFlags};

/// What vsnap reads of one mountinfo row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountRow {
    /// The path of the filesystem mounted there (unescaped; `/` unless a
    /// bind mount or a namespace shows only a subtree).
    pub root: PathBuf,
    /// Unescaped: the path as the filesystem names it.
    pub mount_point: PathBuf,
    /// The mount's own options (`ro,nosuid,...`: a read-only bind of a
    /// writable filesystem says `ro` here only).
    pub options: String,
    /// As the kernel writes it (`overlay`, `fuse.sshfs`, ...).
    pub fs_type: String,
    /// The super options (`rw,memory` for a cgroup v1 hierarchy).
    pub super_options: String,
}

/// The rows of a mountinfo text, in mount order; a row that does not parse
/// is skipped.
pub fn parse(mountinfo: &str) -> Vec<MountRow> {
    mountinfo.lines().filter_map(parse_row).collect()
}

/// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw`
/// (proc(5)): mount id, parent id, major:minor, root, mount point, mount
/// options, zero or more optional fields (`shared:N`, `master:N`,
/// `propagate_from:N`, `unbindable`), a lone `-`, then the filesystem
/// type, the source and the super options. Fields are separated by one
/// space; the kernel escapes a space, tab, newline or backslash inside a
/// field as `\ooo`, so none of them holds a lone `-` but the separator.
fn parse_row(line: &str) -> Option<MountRow> {
    let mut fields = line.split(' ');
    let root = fields.nth(3)?;
    let mount_point = fields.next()?;
    // The mount options, then the optional fields up to the separator.
    let options = fields.next()?;
    fields.find(|f| *f == "-")?;
    let fs_type = fields.next().filter(|t| !t.is_empty())?;
    let super_options = fields.nth(1).unwrap_or_default();
    Some(MountRow {
        root: unescape_path(root),
        mount_point: unescape_path(mount_point),
        options: options.to_string(),
        fs_type: fs_type.to_string(),
        super_options: super_options.to_string(),
    })
}

/// This process's mount table (none when it cannot be read).
fn own_rows() -> Vec<MountRow> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| parse(&info))
        .unwrap_or_default()
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

/// The filesystem types mounted at `point`, per a mountinfo text, in mount
/// order.
#[cfg(test)]
pub fn fs_types_at(point: &Path, mountinfo: &str) -> Vec<String> {
    parse(mountinfo)
        .into_iter()
        .filter(|r| r.mount_point == point)
        .map(|r| r.fs_type)
        .collect()
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

/// Undoes the kernel's `\ooo` escapes (three octal digits, one byte each);
/// a backslash not followed by three octal digits stays as it is.
fn unescape_path(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let digits = match bytes[i] {
            b'\\' => bytes.get(i + 1..i + 4),
            _ => None,
        };
        let octal = digits
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .map(|d| d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0')))
            .and_then(|n| u8::try_from(n).ok());
        match octal {
            Some(b) => {
                out.push(b);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows as the kernel writes them: no optional field, one, several
    /// (unbindable has no value), escaped spaces, tab, newline and
    /// backslash, and an overlay stacked on a point already mounted.
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
    fn rows_parse_with_and_without_optional_fields() {
        let rows = parse(MOUNTINFO);
        assert_eq!(rows.len(), 7);
        assert_eq!(
            rows[0],
            MountRow {
                root: PathBuf::from("/"),
                mount_point: PathBuf::from("/"),
                options: "rw,relatime".into(),
                fs_type: "overlay".into(),
                super_options: rows[0].super_options.clone(),
            }
        );
        assert_eq!(rows[1].fs_type, "proc");
        assert_eq!(rows[2].fs_type, "ext3");
        assert_eq!(
            rows[3],
            MountRow {
                root: rows[3].root.clone(),
                mount_point: PathBuf::from("/run/vsnap/a b/c\td"),
                options: "rw".into(),
                fs_type: "tmpfs".into(),
                super_options: rows[3].super_options.clone(),
            }
        );
    }

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
    fn mount_points_are_unescaped() {
        let rows = parse(MOUNTINFO);
        assert_eq!(rows[2].mount_point, Path::new("/run/vsnap/a b"));
        assert_eq!(rows[4].mount_point, Path::new("/run/vsnap/a b/e\nf\\g"));
        assert_eq!(unescape_path("/a\\040b/c\\134d"), Path::new("/a b/c\\d"));
        // Not three octal digits: the backslash stays.
        assert_eq!(unescape_path("/x\\y\\0"), Path::new("/x\\y\\0"));
        assert_eq!(unescape_path("/x\\+12\\08a"), Path::new("/x\\+12\\08a"));
        assert_eq!(unescape_path("/x\\400"), Path::new("/x\\400"));
        // A byte beyond ASCII is that byte, not a char.
        assert_eq!(
            unescape_path("/x\\377").into_os_string().into_vec(),
            b"/x\xff"
        );
    }

    #[test]
    fn rows_that_do_not_parse_are_skipped() {
        let text = "\
41 22 0:44 / /no/separator rw shared:1 tmpfs tmpfs rw
42 22 0:45 / /no/type rw -
43 22 0:46 /
44 22 0:47 / /fine rw - tmpfs tmpfs rw
";
        assert_eq!(
            parse(text),
            [MountRow {
                root: PathBuf::from("/"),
                mount_point: PathBuf::from("/fine"),
                options: "rw".into(),
                fs_type: "tmpfs".into(),
                super_options: "rw".into(),
            }]
        );
    }

    #[test]
    fn the_types_at_a_point_are_in_mount_order() {
        assert_eq!(
            fs_types_at(Path::new("/run/vsnap/ab"), MOUNTINFO),
            ["tmpfs", "overlay"]
        );
        assert_eq!(
            fs_types_at(Path::new("/run/vsnap/a b"), MOUNTINFO),
            ["ext3"]
        );
        assert_eq!(fs_types_at(Path::new("/"), MOUNTINFO), ["overlay"]);
        assert!(fs_types_at(Path::new("/run/vsnap/a\\040b"), MOUNTINFO).is_empty());
        assert!(fs_types_at(Path::new("/run"), MOUNTINFO).is_empty());
    }

    #[test]
    fn the_points_under_a_folder_come_deepest_first() {
        assert_eq!(
            points_under(Path::new("/run/vsnap/a b"), parse(MOUNTINFO)),
            [
                PathBuf::from("/run/vsnap/a b/e\nf\\g"),
                PathBuf::from("/run/vsnap/a b/c\td"),
                PathBuf::from("/run/vsnap/a b"),
            ]
        );
        // Whole components: /run/vsnap/a is no folder of /run/vsnap/ab's.
        assert!(points_under(Path::new("/run/vsnap/a"), parse(MOUNTINFO)).is_empty());
        assert_eq!(
            points_under(Path::new("/run/vsnap"), parse(MOUNTINFO)).len(),
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
