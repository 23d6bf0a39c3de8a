//! The mount table, `/proc/<pid>/mountinfo`: one reading of its rows
//! (the shim's mounts and cgroups, the OCI hook's root folder, the CLI's
//! CRIU cache, the tests).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// What vsnap reads of one mountinfo row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountRow {
    /// The filesystem's device, `(major, minor)` (`st_dev` of what lies
    /// there).
    pub device: (u64, u64),
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
    /// What was mounted (`/dev/vda1`, `overlay`, a tmpfs's name), as the
    /// kernel writes it.
    pub source: String,
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
    let (major, minor) = fields.nth(2)?.split_once(':')?;
    let device = (major.parse().ok()?, minor.parse().ok()?);
    let root = fields.next()?;
    let mount_point = fields.next()?;
    // The mount options, then the optional fields up to the separator.
    let options = fields.next()?;
    fields.find(|f| *f == "-")?;
    let fs_type = fields.next().filter(|t| !t.is_empty())?;
    let source = fields.next().unwrap_or_default();
    let super_options = fields.next().unwrap_or_default();
    Some(MountRow {
        device,
        root: unescape(root),
        mount_point: unescape(mount_point),
        options: options.to_string(),
        fs_type: fs_type.to_string(),
        source: source.to_string(),
        super_options: super_options.to_string(),
    })
}

/// This process's mount table.
pub fn own() -> std::io::Result<Vec<MountRow>> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|info| parse(&info))
}

/// The mount table of process `pid` (its mount namespace's, as it sees
/// it).
pub fn of_pid(pid: i32) -> std::io::Result<Vec<MountRow>> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).map(|info| parse(&info))
}

/// Undoes the kernel's `\ooo` escapes (three octal digits, one byte each);
/// a backslash not followed by three octal digits stays as it is.
pub fn unescape(field: &str) -> PathBuf {
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
    use std::path::Path;

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

    /// The filesystem types mounted at `point`, per a mountinfo text, in
    /// mount order.
    fn fs_types_at(point: &Path, mountinfo: &str) -> Vec<String> {
        parse(mountinfo)
            .into_iter()
            .filter(|r| r.mount_point == point)
            .map(|r| r.fs_type)
            .collect()
    }

    #[test]
    fn rows_parse_with_and_without_optional_fields() {
        let rows = parse(MOUNTINFO);
        assert_eq!(rows.len(), 7);
        assert_eq!(
            rows[0],
            MountRow {
                device: (0, 21),
                root: PathBuf::from("/"),
                mount_point: PathBuf::from("/"),
                options: "rw,relatime".into(),
                fs_type: "overlay".into(),
                source: "overlay".into(),
                super_options: "rw,lowerdir=/l,upperdir=/u,workdir=/w".into(),
            }
        );
        assert_eq!(rows[1].fs_type, "proc");
        assert_eq!(rows[2].fs_type, "ext3");
        assert_eq!(
            (
                rows[2].device,
                rows[2].root.as_path(),
                rows[2].source.as_str()
            ),
            ((98, 0), Path::new("/mnt1"), "/dev/root")
        );
        assert_eq!(rows[2].super_options, "rw,errors=continue");
        assert_eq!(
            rows[3],
            MountRow {
                device: (0, 40),
                root: rows[3].root.clone(),
                mount_point: PathBuf::from("/run/vsnap/a b/c\td"),
                options: "rw".into(),
                fs_type: "tmpfs".into(),
                source: "tmpfs".into(),
                super_options: rows[3].super_options.clone(),
            }
        );
    }

    #[test]
    fn mount_points_are_unescaped() {
        let rows = parse(MOUNTINFO);
        assert_eq!(rows[2].mount_point, Path::new("/run/vsnap/a b"));
        assert_eq!(rows[4].mount_point, Path::new("/run/vsnap/a b/e\nf\\g"));
        assert_eq!(unescape("/a\\040b/c\\134d"), Path::new("/a b/c\\d"));
        // Not three octal digits: the backslash stays.
        assert_eq!(unescape("/x\\y\\0"), Path::new("/x\\y\\0"));
        assert_eq!(unescape("/x\\+12\\08a"), Path::new("/x\\+12\\08a"));
        assert_eq!(unescape("/x\\400"), Path::new("/x\\400"));
        // A byte beyond ASCII is that byte, not a char.
        assert_eq!(unescape("/x\\377").into_os_string().into_vec(), b"/x\xff");
    }

    #[test]
    fn rows_that_do_not_parse_are_skipped() {
        let text = "\
41 22 0:44 / /no/separator rw shared:1 tmpfs tmpfs rw
42 22 0:45 / /no/type rw -
43 22 0:46 /
45 22 x / /no/device rw - tmpfs tmpfs rw
44 22 0:47 / /fine rw - tmpfs tmpfs rw
";
        assert_eq!(
            parse(text),
            [MountRow {
                device: (0, 47),
                root: PathBuf::from("/"),
                mount_point: PathBuf::from("/fine"),
                options: "rw".into(),
                fs_type: "tmpfs".into(),
                source: "tmpfs".into(),
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
    fn this_process_reads_its_own_mounts() {
        let own = own().unwrap();
        assert!(own.iter().any(|r| r.mount_point == Path::new("/proc")));
        let me = of_pid(std::process::id() as i32).unwrap();
        assert_eq!(me, own, "the same namespace, the same table");
        assert!(of_pid(i32::MAX).is_err(), "no such process");
    }
}
