//! runc's masked folders (`/proc/acpi`, `/sys/firmware`, ...: an empty
//! read-only tmpfs each) are external mounts to CRIU: a capture stores
//! none of them, and a restore binds the host's one empty read-only tmpfs
//! at each instead of running `tar --extract --gzip` per mount. The copy
//! sees what a cold start sees: empty folders it cannot write to.

use std::collections::HashSet;
use std::path::Path;

use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{setup, Env};
use vsnap_host::mountinfo::MountRow;

fn rows(pid: i32) -> Vec<MountRow> {
    vsnap_host::mountinfo::of_pid(pid).unwrap()
}

/// The spec's masked folders that are folders on this host (runc masks
/// them with a tmpfs).
fn masked_folders() -> Vec<&'static str> {
    ["/proc/acpi", "/proc/asound", "/proc/scsi", "/sys/firmware"]
        .into_iter()
        .filter(|p| Path::new(p).is_dir())
        .collect()
}

fn tmpfs_images(e: &Env, name: &str) -> usize {
    vsnap_e2e::containerd::list(&e.artifact(name).join("images"))
        .iter()
        .filter(|n| n.starts_with("tmpfs-dev-"))
        .count()
}

#[test]
fn masked_folders_come_back_empty_and_read_only_without_criu_storing_them() {
    let e = setup("masks");
    let folders = masked_folders();
    assert!(!folders.is_empty(), "this host has a folder runc masks");
    e.create_good("mk-donor", "masked", &[]);
    let out = e.run("mk-1", "restore", "masked", free_port(), &[]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    let pid = e.c.task_pid("default", "mk-1");
    let all = rows(pid);
    let mut mask_devs = HashSet::new();
    for folder in &folders {
        let row = all
            .iter()
            .rev()
            .find(|r| r.mount_point == Path::new(folder))
            .unwrap_or_else(|| panic!("{folder} is masked in the copy"));
        assert_eq!(
            (row.fs_type.as_str(), row.source.as_str()),
            ("tmpfs", "vsnap-empty"),
            "{folder}: the host's empty tmpfs"
        );
        assert!(
            row.options.split(',').any(|o| o == "ro"),
            "{folder}: {}",
            row.options
        );
        let inside = Path::new(&format!("/proc/{pid}/root")).join(&folder[1..]);
        assert_eq!(
            std::fs::read_dir(&inside).unwrap().count(),
            0,
            "{folder} is empty"
        );
        let e = std::fs::write(inside.join("x"), "x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{folder}: {e}");
        mask_devs.insert(row.device);
    }
    // CRIU stored one tmpfs image per other tmpfs of the copy (`/dev`,
    // `/dev/shm`, ...), none for a mask.
    let others: HashSet<(u64, u64)> = all
        .iter()
        .filter(|r| r.fs_type == "tmpfs" && !mask_devs.contains(&r.device))
        .map(|r| r.device)
        .collect();
    assert!(!others.is_empty(), "the copy has tmpfs mounts of its own");
    assert_eq!(
        tmpfs_images(&e, "masked"),
        others.len(),
        "stored: {others:?}"
    );
    e.remove("mk-1");
    e.assert_nothing_left();
}
