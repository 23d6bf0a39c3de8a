//! `vsnap host criu-cache`: gives CRIU its kernel-probe cache on a host
//! whose run folder is not a tmpfs.
//!
//! Each CRIU run first probes the kernel (netlink diag modules, pagemap, a
//! network namespace with a veth pair to learn whether link ids cross
//! namespaces, iptables, vDSO, ...): 30-60 ms on the machines this project
//! is measured on, in every restore and every capture. CRIU keeps what it
//! learned in `criu.kdat` in its run folder (`/run` unless built otherwise)
//! and reads it back on later runs, but it only writes that file on a tmpfs,
//! so that a reboot (a new kernel, new device numbers, a new zero page)
//! forgets it. On a host where `/run` is a plain folder of the root file
//! system CRIU never keeps it and probes on every run.
//!
//! This command gives such a host what a systemd host has: it runs CRIU's own
//! `criu check` once with its run folder replaced by a small private tmpfs
//! (in a mount namespace of its own), and bind-mounts the cache CRIU wrote
//! there over `criu.kdat` in the real run folder. The file so lives on a
//! tmpfs and goes with the next reboot, as CRIU wants; CRIU reads it like
//! its own. Run it once per boot, and again after CRIU was upgraded.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::{Outcome, OK};

/// The private tmpfs the cache is written into and bind-mounted from.
pub const CACHE_MOUNT: &str = "/run/vsnap-criu-kdat";
/// The name CRIU gives its cache in its run folder.
const KDAT_NAME: &str = "criu.kdat";
const TMPFS_MAGIC: i64 = 0x0102_1994;

#[derive(Serialize)]
struct Report {
    /// Where this CRIU reads its cache.
    cache: PathBuf,
    /// "own": the run folder is a tmpfs and CRIU keeps the cache itself;
    /// "mounted": the cache was written and bind-mounted now.
    state: &'static str,
    /// Whether a `criu check` run afterwards loaded it.
    loaded: bool,
}

pub fn criu_cache(criu: &Path, json: bool) -> Outcome {
    let cache = cache_path(criu)?;
    let dir = cache
        .parent()
        .ok_or_else(|| format!("criu-cache: {}: no folder", cache.display()))?;
    let state = if is_tmpfs(dir)? {
        "own"
    } else {
        write_and_mount(criu, &cache, dir)?;
        "mounted"
    };
    let loaded = loads(criu, &cache)?;
    if !loaded && state == "mounted" {
        return Err(format!(
            "criu-cache: {}: CRIU did not load the cache it was given",
            cache.display()
        ));
    }
    let report = Report {
        cache,
        state,
        loaded,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    } else if state == "own" {
        println!(
            "{}: on a tmpfs; CRIU keeps its kernel-probe cache there itself",
            report.cache.display()
        );
    } else {
        println!(
            "{}: CRIU's kernel-probe cache, written by `criu check` and bind-mounted from {CACHE_MOUNT} (a tmpfs: gone with the next reboot)",
            report.cache.display()
        );
    }
    Ok(OK)
}

/// Where `criu` keeps its cache, as its own log of a `criu check` says.
fn cache_path(criu: &Path) -> Result<PathBuf, String> {
    let log = check_log(criu, None)?;
    kdat_path_in_log(&log).ok_or_else(|| {
        format!(
            "criu-cache: {}'s log does not name its kernel-probe cache (criu.kdat)",
            criu.display()
        )
    })
}

/// The cache's path in a CRIU log at level 4: "Loaded kdat cache from P",
/// "File P does not exist", "Stale P file" or "Can't load P".
pub fn kdat_path_in_log(log: &str) -> Option<PathBuf> {
    log.lines().find_map(|line| {
        line.split_whitespace()
            .find(|w| w.starts_with('/') && Path::new(w).file_name() == Some(KDAT_NAME.as_ref()))
            .map(PathBuf::from)
    })
}

/// Runs `criu check` at log level 4 (in the run folder replaced by
/// `private_run`, when given: bind-mounted over it in a new mount namespace)
/// and returns its log.
fn check_log(criu: &Path, private_run: Option<(&Path, &Path)>) -> Result<String, String> {
    let work = tempdir()?;
    let log = work.join("check.log");
    let mut cmd = Command::new(criu);
    cmd.arg("check")
        .arg("-v4")
        .arg("-o")
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some((tmpfs, run)) = private_run {
        let (src, dst) = (cstring(tmpfs)?, cstring(run)?);
        let root = cstring(Path::new("/"))?;
        // SAFETY: between fork and exec the child only makes syscalls on
        // strings allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        src.as_ptr(),
                        dst.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
    }
    let out = cmd
        .output()
        .map_err(|e| format!("criu-cache: run {} check: {e}", criu.display()));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&work);
    let out = out?;
    if !out.status.success() && text.is_empty() {
        return Err(format!(
            "criu-cache: {} check: {}: {}",
            criu.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(text)
}

/// Whether a `criu check` now loads its cache from `cache`.
fn loads(criu: &Path, cache: &Path) -> Result<bool, String> {
    let want = format!("Loaded kdat cache from {}", cache.display());
    Ok(check_log(criu, None)?.contains(&want))
}

/// Writes CRIU's cache into the private tmpfs (mounted at CACHE_MOUNT when
/// it is not yet) and bind-mounts it over `cache`, replacing an earlier one.
fn write_and_mount(criu: &Path, cache: &Path, dir: &Path) -> Result<(), String> {
    let tmpfs = Path::new(CACHE_MOUNT);
    ensure_tmpfs(tmpfs)?;
    let written = tmpfs.join(KDAT_NAME);
    for stale in [written.clone(), tmpfs.join(format!("{KDAT_NAME}.tmp"))] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("criu-cache: remove {}: {e}", stale.display())),
        }
    }
    check_log(criu, Some((tmpfs, dir)))?;
    let meta = std::fs::symlink_metadata(&written).map_err(|e| {
        format!(
            "criu-cache: `criu check` in a private {} wrote no {}: {e}",
            dir.display(),
            written.display()
        )
    })?;
    if !meta.is_file() || meta.len() == 0 {
        return Err(format!(
            "criu-cache: {} is not a cache CRIU wrote",
            written.display()
        ));
    }
    // An earlier bind mount pins the file it was made of: take it down
    // (every layer) before mounting the new one.
    while is_mount_point(cache)? {
        umount(cache)?;
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(cache)
    {
        Ok(_) => {}
        Err(e) => return Err(format!("criu-cache: create {}: {e}", cache.display())),
    }
    mount(&written, cache, None, libc::MS_BIND, None)
}

/// A tmpfs of root's own at `at` (mode 0700), mounted unless one is there.
fn ensure_tmpfs(at: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(at) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("criu-cache: {} is not a folder", at.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(at)
                .map_err(|e| format!("criu-cache: create {}: {e}", at.display()))?;
        }
        Err(e) => return Err(format!("criu-cache: {}: {e}", at.display())),
    }
    if !is_mount_point(at)? || !is_tmpfs(at)? {
        mount(
            Path::new("vsnap-criu-kdat"),
            at,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some("size=1m,mode=0700"),
        )?;
    }
    let m = std::fs::metadata(at).map_err(|e| format!("criu-cache: {}: {e}", at.display()))?;
    if m.uid() != 0 || m.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "criu-cache: {} belongs to uid {} with mode {:o}; it must be root's, 0700",
            at.display(),
            m.uid(),
            m.permissions().mode() & 0o7777
        ));
    }
    Ok(())
}

fn is_tmpfs(path: &Path) -> Result<bool, String> {
    let c = cstring(path)?;
    // SAFETY: statfs into a zeroed struct of the right type.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return Err(format!(
            "criu-cache: statfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(s.f_type as i64 == TMPFS_MAGIC)
}

/// Whether `path` is where something is mounted (mountinfo's fifth field).
fn is_mount_point(path: &Path) -> Result<bool, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("criu-cache: read /proc/self/mountinfo: {e}"))?;
    let found = mount_points(&info).any(|p| p == path);
    Ok(found)
}

/// The mount points of a mountinfo text (octal escapes undone:
/// vsnap-host's parser).
pub fn mount_points(info: &str) -> impl Iterator<Item = PathBuf> {
    vsnap_host::mountinfo::parse(info)
        .into_iter()
        .map(|r| r.mount_point)
}

fn mount(
    src: &Path,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let (s, d) = (cstring(src)?, cstring(dst)?);
    let t = fstype.map(|t| CString::new(t).unwrap());
    let o = data.map(|o| CString::new(o).unwrap());
    // SAFETY: mount(2) with valid C strings or nulls.
    let rc = unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            t.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            flags,
            o.as_ref().map_or(std::ptr::null(), |o| o.as_ptr().cast()),
        )
    };
    if rc != 0 {
        return Err(format!(
            "criu-cache: mount {} on {}: {}",
            src.display(),
            dst.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn umount(path: &Path) -> Result<(), String> {
    let c = cstring(path)?;
    // SAFETY: umount2(2) with a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(format!(
            "criu-cache: unmount {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn cstring(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{}: a NUL in the path", p.display()))
}

fn tempdir() -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("vsnap-criu-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("criu-cache: create {}: {e}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_named_by_each_of_criu_s_log_lines() {
        for (line, want) in [
            (
                "(00.000134) File /run/criu.kdat does not exist",
                "/run/criu.kdat",
            ),
            (
                "(00.000143) Loaded kdat cache from /run/criu.kdat",
                "/run/criu.kdat",
            ),
            (
                "(00.000143) Warn  (criu/kerndat.c:1250): Stale /var/run/criu/criu.kdat file",
                "/var/run/criu/criu.kdat",
            ),
        ] {
            let log = format!(
                "(00.000000) Version: 4.2.1\n{line}\n(00.000200) PAGEMAP_SCAN is supported\n"
            );
            assert_eq!(kdat_path_in_log(&log), Some(PathBuf::from(want)), "{line}");
        }
        assert_eq!(
            kdat_path_in_log("(00.0) Version: 4.2.1\n(00.1) /run/criu.kdat.tmp\n"),
            None
        );
    }

    #[test]
    fn mount_points_undo_mountinfo_s_escapes() {
        let info = "36 25 0:32 / /run/criu.kdat rw,relatime shared:1 - tmpfs vsnap-criu-kdat rw\n\
                    37 25 0:33 / /mnt/a\\040b rw - tmpfs x rw\n";
        let got: Vec<PathBuf> = mount_points(info).collect();
        assert_eq!(
            got,
            [PathBuf::from("/run/criu.kdat"), PathBuf::from("/mnt/a b")]
        );
    }
}
