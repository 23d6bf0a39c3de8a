//! runc's masked folders, which CRIU need not store nor unpack.
//!
//! runc masks a folder of `linux.maskedPaths` (`/proc/acpi`,
//! `/sys/firmware`, ...) with an empty read-only tmpfs of its own. CRIU
//! dumps every tmpfs with `tar --create --gzip` and restores it with
//! `tar --extract --gzip`, one tar and one gzip process per mount: a few
//! milliseconds each on every restore, for folders that hold nothing.
//!
//! A capture tells CRIU that the mounts at those folders are external
//! (`external mnt[/proc/acpi]:vsnap-empty`): their contents are not
//! dumped. A restore maps that key to one empty read-only tmpfs of the
//! host, `<runtime_dir>/empty` (`external mnt[vsnap-empty]:PATH`), which
//! CRIU binds at each of them: still a tmpfs, still empty, and read-only
//! in its superblock, so no container can write into it, not even by
//! remounting its bind. CRIU ignores a mapping an artifact does not use,
//! so every restore gets it (an artifact captured before keeps its masks
//! in its images and CRIU unpacks them as before).
//!
//! Only folders under `/proc` and `/sys` are named: there a folder of the
//! container is the host's (a fresh procfs, the host's sysfs), so a masked
//! path that is a folder on the host is masked with a tmpfs in the
//! container too. A mask elsewhere (inside the rootfs) is left to CRIU.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use serde_json::Value;

/// The key CRIU records for each masked folder, mapped at restore.
pub const EMPTY_KEY: &str = "vsnap-empty";
/// The host's empty read-only tmpfs, under the runtime folder.
const EMPTY_FOLDER: &str = "empty";

/// The spec's masked paths a capture names external: folders of the host
/// (not links to one) under `/proc` and `/sys`, each once.
pub fn masked_folders(spec: &Value) -> Vec<String> {
    let mut folders: Vec<String> = spec["linux"]["maskedPaths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|p| p.starts_with("/proc/") || p.starts_with("/sys/"))
        .filter(|p| !p.contains("..") && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .map(str::to_string)
        .collect();
    folders.sort();
    folders.dedup();
    folders
}

/// A capture's CRIU config lines for `folders`.
pub fn dump_lines(folders: &[String]) -> String {
    folders
        .iter()
        .map(|f| format!("external mnt[{f}]:{EMPTY_KEY}\n"))
        .collect()
}

/// A restore's CRIU config line: the key bound from `empty`.
pub fn restore_line(empty: &Path) -> String {
    format!("external mnt[{EMPTY_KEY}]:{}\n", empty.display())
}

/// The host's empty read-only tmpfs under `runtime_dir`, mounted by the
/// first shim that needs it (under a lock, so two never stack two) and
/// kept for every later restore of the host.
pub fn ensure_empty(runtime_dir: &Path) -> std::io::Result<PathBuf> {
    let dir = runtime_dir.join(EMPTY_FOLDER);
    std::fs::create_dir_all(&dir)?;
    let lock = std::fs::File::create(runtime_dir.join("empty.lock"))?;
    // SAFETY: flock on a descriptor this function owns; released with it.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if is_read_only_tmpfs(&dir) {
        return Ok(dir);
    }
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some(EMPTY_KEY),
        &dir,
        Some("tmpfs"),
        flags,
        Some("mode=0555,size=4k,nr_inodes=1"),
    )?;
    Ok(dir)
}

/// Whether the topmost mount at `dir` is a read-only tmpfs.
fn is_read_only_tmpfs(dir: &Path) -> bool {
    crate::mounts::top_at(dir)
        .is_some_and(|m| m.fs_type == "tmpfs" && m.options.split(',').any(|o| o == "ro"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_host_folders_under_proc_and_sys_are_named_once() {
        let spec = json!({"linux": {"maskedPaths": [
            "/proc/keys", "/sys/firmware", "/proc/no-such-folder", "/etc", "/sys/firmware",
            "/proc/../etc", "/proc/self", "/proc/sys"
        ]}});
        // /proc/keys is a file (runc binds /dev/null over it), /proc/self a
        // link, /etc not the host's in a container.
        assert_eq!(masked_folders(&spec), ["/proc/sys", "/sys/firmware"]);
        assert_eq!(masked_folders(&json!({})), Vec::<String>::new());
    }

    #[test]
    fn the_lines_name_the_key_on_both_sides() {
        assert_eq!(
            dump_lines(&["/proc/acpi".into(), "/sys/firmware".into()]),
            "external mnt[/proc/acpi]:vsnap-empty\nexternal mnt[/sys/firmware]:vsnap-empty\n"
        );
        assert_eq!(
            restore_line(Path::new("/run/vsnap/empty")),
            "external mnt[vsnap-empty]:/run/vsnap/empty\n"
        );
    }

    #[test]
    fn the_empty_tmpfs_is_mounted_once_read_only() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = ensure_empty(dir.path()).unwrap();
        assert!(is_read_only_tmpfs(&empty));
        assert_eq!(ensure_empty(dir.path()).unwrap(), empty);
        let at = vsnap_host::mountinfo::own()
            .unwrap()
            .iter()
            .filter(|r| r.mount_point == empty)
            .count();
        assert_eq!(at, 1, "a second call mounts nothing");
        let e = std::fs::write(empty.join("x"), "x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        nix::mount::umount2(&empty, nix::mount::MntFlags::MNT_DETACH).unwrap();
    }
}
