//! Mount points from /proc/self/mountinfo: what lies under a folder, and
//! taking it off, deepest first.

use std::path::{Path, PathBuf};

use log::warn;
use nix::mount::{umount2, MntFlags};

/// The mount points at or below `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points
}

/// The filesystem types mounted at `point`, per a mountinfo text (the
/// field after the ` - ` separator), in mount order.
pub fn fs_types_at(point: &Path, mountinfo: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            (Path::new(&unescape_mount_path(mount_point)) == point)
                .then(|| right.split(' ').next().map(str::to_string))
                .flatten()
        })
        .collect()
}

pub fn has_mounts_under(dir: &Path) -> bool {
    !mounts_under(dir).is_empty()
}

/// Unmounts whatever is mounted at or below `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    let points = mounts_under(dir);
    for p in points {
        if let Err(e) = umount2(&p, MntFlags::MNT_DETACH) {
            warn!("unmount {}: {e}", p.display());
        }
    }
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` (octal).
fn unescape_mount_path(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    let mut rest = p;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/a\\040b/c\\134d"), "/a b/c\\d");
        assert_eq!(unescape_mount_path("/x\\y\\0"), "/x\\y\\0");
    }
}
