//! `vsnap host criu-cache` on this host, with the real CRIU: afterwards a
//! CRIU run loads its kernel-probe cache instead of probing, from a file on
//! a tmpfs, and running it again replaces the cache without stacking mounts.
//! Needs root (mounts) and CRIU on PATH, as CI has them.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn criu_cache() -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vsnap"))
        .args(["host", "criu-cache", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vsnap host criu-cache: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn statfs_type(path: &Path) -> i64 {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: statfs into a zeroed struct of the right type.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut s) }, 0, "{path:?}");
    s.f_type as i64
}

fn mounts_at(path: &Path) -> usize {
    let rows = vsnap_host::mountinfo::own().unwrap();
    rows.iter().filter(|r| r.mount_point == path).count()
}

/// The log of a `criu check` at level 4.
fn check_log() -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("check.log");
    let st = Command::new("criu")
        .args(["check", "-v4", "-o"])
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("criu on PATH (scripts/setup.sh installs it)");
    assert!(st.success(), "criu check: {st}");
    std::fs::read_to_string(&log).unwrap()
}

fn umount(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: umount2(2) with a valid C string.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    assert_eq!(
        rc,
        0,
        "umount {path:?}: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn criu_loads_the_cache_from_a_tmpfs_and_a_second_run_replaces_it() {
    assert_eq!(
        std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap(),
        0,
        "this test needs root: it mounts"
    );
    let found = criu_cache();
    let cache = Path::new(found["cache"].as_str().unwrap()).to_path_buf();
    if found["state"] == "mounted" {
        // Take the cache away, as a reboot does: CRIU then probes.
        while mounts_at(&cache) > 0 {
            umount(&cache);
        }
        assert!(
            !check_log().contains("Loaded kdat cache"),
            "CRIU still loads a cache"
        );
    }
    let first = criu_cache();
    assert_eq!(first["cache"], found["cache"]);
    assert_eq!(first["loaded"], true, "{first}");
    // What CRIU reads lives on a tmpfs, whichever way it got there.
    assert_eq!(
        statfs_type(&cache),
        0x0102_1994,
        "{cache:?} is not on a tmpfs"
    );
    let second = criu_cache();
    assert_eq!(second["cache"], first["cache"]);
    assert_eq!(second["state"], first["state"]);
    if first["state"] == "mounted" {
        assert_eq!(
            mounts_at(&cache),
            1,
            "one bind mount at {cache:?}, not a stack"
        );
    }
    // And CRIU itself, run apart from the command, skips its probes.
    let text = check_log();
    assert!(
        text.contains(&format!("Loaded kdat cache from {}", cache.display())),
        "criu check did not load {cache:?}:\n{}",
        text.lines().take(12).collect::<Vec<_>>().join("\n")
    );
    assert!(
        !text.contains("Probing sock diag modules"),
        "criu check probed the kernel anyway"
    );
}
