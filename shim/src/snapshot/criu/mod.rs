//! What vsnap tells runc and CRIU for a snapshot container, in one place:
//! the CRIU options a capture and its restores share, the per-container CRIU
//! config file (runc hands it to CRIU through `org.criu.config`), and what
//! CRIU's logs must show about the CUDA plugin.
//!
//! Facts this rests on (CRIU 4.2, runc 1.1-1.3):
//! * runc passes CRIU exactly one config file: the one named by the spec's
//!   `org.criu.config` annotation or, without it, `/etc/criu/runc.conf`.
//!   Options in that file override the ones runc sets over RPC.
//! * CRIU loads plugins from `libdir` (`-L`), else `$CRIU_LIBS_DIR`, else
//!   `/usr/lib/criu`.
//! * A restore must be given the options the dump used: a dump with
//!   established TCP connections is refused at restore without
//!   `tcp-established` ("Connected TCP socket in image"), and file locks are
//!   dropped without `file-locks`.
//! * The CUDA plugin runs `cuda-checkpoint` through `execvp`, from CRIU's
//!   PATH (inherited from runc, inherited from the shim), and turns itself
//!   off with only a warning when it cannot run it.
//! * Errors of the plugin's late resume hook are not failures of the
//!   restore: CRIU reports success and the copy hangs on its GPU.

pub(crate) mod masks;
pub(crate) mod memory;
pub(crate) mod options;
pub(crate) mod pages;
pub(crate) mod pod;
pub(crate) mod restore_oom;

use std::path::Path;

use crate::error::{Error, Result};

/// The per-container config vsnap writes into the bundle.
pub const BUNDLE_CONFIG: &str = "vsnap-criu.conf";
/// Unlinked files held open (multiprocessing SharedMemory, semaphores) are
/// dumped as "ghost files" up to this size; CRIU's default, 1 MiB, fails the
/// dump of an engine holding a larger one.
pub const GHOST_LIMIT_BYTES: u64 = 64 << 30;

/// Appends `irmap-scan-path` lines for `paths` (inside the container) to
/// the container's CRIU config `config`, each once: where CRIU looks up a
/// watched inode it cannot open by its handle (see fsnotify.rs).
pub fn add_irmap_scan_paths(config: &Path, paths: &[String]) -> std::io::Result<()> {
    let text = std::fs::read_to_string(config)?;
    let mut add = String::new();
    for p in paths {
        let line = format!("irmap-scan-path {p}");
        if !text.lines().any(|l| l == line) {
            add.push_str(&line);
            add.push('\n');
        }
    }
    if add.is_empty() {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new().append(true).open(config)?;
    std::io::Write::write_all(&mut f, add.as_bytes())
}

/// The action script a capture gives CRIU when the container's `/dev/shm`
/// is a host folder: CRIU removes its `link_remap.N` files there at the end
/// of a dump that leaves the tree running (criu/cr-dump.c), after its
/// post-dump scripts ran, so the script keeps each as a hard link
/// (`.vsnap-kept-link_remap.N`, the same inode) for shm.rs to carry.
pub const POST_DUMP_SCRIPT: &str = "vsnap-post-dump.sh";

pub fn post_dump_script(host_shm: &Path) -> Result<String> {
    let dir = host_shm.display().to_string();
    if dir.contains('\'') || dir.contains('\n') {
        return Err(Error::InvalidArgument(format!(
            "create: /dev/shm folder {dir:?}: a path with a quote or a newline"
        )));
    }
    Ok(format!(
        "#!/bin/sh\n# vsnap: CRIU's link-remap files in the container's /dev/shm folder outlive the dump (shm.rs)\n\
         [ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n\
         cd '{dir}' || exit 0\n\
         for f in {prefix}*; do [ -f \"$f\" ] && ln -f \"$f\" \"{kept}$f\"; done\n\
         exit 0\n",
        prefix = crate::snapshot::rootfs::shm::LINK_REMAP_PREFIX,
        kept = crate::snapshot::rootfs::shm::KEPT_PREFIX,
    ))
}

/// For a GPU container's capture: the dump log must show that the CUDA
/// plugin initialized. A plugin that turned itself off (cuda-checkpoint not
/// found, a driver without `--action`, no GPU visible) lets CRIU go on and
/// fail later on a device, or worse; this names the plugin's own reason.
pub fn check_cuda_plugin_ran(dump_log: &str) -> std::result::Result<(), String> {
    if dump_log
        .lines()
        .any(|l| l.contains("cuda_plugin: initialized"))
    {
        return Ok(());
    }
    let reason = dump_log
        .lines()
        .filter(|l| l.contains("cuda_plugin: "))
        .map(|l| l.split_once("cuda_plugin: ").map_or(l, |(_, m)| m).trim())
        .find(|m| !m.is_empty());
    Err(match reason {
        Some(r) => format!("the CUDA plugin did not initialize: {r}"),
        None => "the CUDA plugin did not load (dump.log never mentions cuda_plugin: check libdir and cuda_plugin_dir)".to_string(),
    })
}

/// For a GPU container's restore: CRIU's restore log must not show a failed
/// device step of the CUDA plugin (CRIU reports success regardless). Returns
/// the plugin's own lines of the failed step.
pub fn check_cuda_resume(restore_log: &str) -> std::result::Result<(), String> {
    let failed: Vec<&str> = restore_log
        .lines()
        .filter(|l| l.contains("Error (") && l.contains("cuda_plugin: "))
        // A process of the tree without CUDA: the plugin has nothing to resume.
        .filter(|l| !l.contains("to retrieve restore tid"))
        .map(|l| l.split_once("cuda_plugin: ").map_or(l, |(_, m)| m).trim())
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the CUDA plugin failed to resume the GPU: {}",
        failed.join("; ")
    ))
}

/// What an operator can do about a dump failure CRIU's words do not
/// explain (empty when there is nothing to add). `errors`: [`log_errors`].
pub fn dump_hint(errors: &str) -> String {
    // CRIU reads each task's rlimits with prlimit(2), which needs
    // CAP_SYS_RESOURCE for a process of another user.
    if errors.contains("Can't get rlimit") && !has_effective_cap(CAP_SYS_RESOURCE) {
        return "; the shim (root) lacks CAP_SYS_RESOURCE, which CRIU needs to dump a process that runs as another user: give containerd (and so the shim) that capability, or run the engine as root".to_string();
    }
    String::new()
}

const CAP_SYS_RESOURCE: u32 = 24;

fn has_effective_cap(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|bits| bits & (1 << cap) != 0)
}

/// The error lines of a CRIU log that explain a failure, as `; CRIU: ...`
/// (empty without any): see [`error_summary`].
pub fn log_errors(log: &std::path::Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return String::new();
    };
    let errors = error_summary(&text);
    if errors.is_empty() {
        return String::new();
    }
    format!("; CRIU: {}", errors.join("; "))
}

/// Most error lines [`error_summary`] keeps.
const SUMMARY_LINES: usize = 12;

/// The messages of CRIU's `Error (file.c:line): message` lines worth
/// showing: every one that names a path (the file a restore could not open
/// comes long before the "Unable to open fd" and "Restoring FAILED" that end
/// the log), and the last three, each message once, in log order, at most
/// [`SUMMARY_LINES`] (the first paths and the last three when there are more).
fn error_summary(text: &str) -> Vec<&str> {
    let mut errors: Vec<&str> = Vec::new();
    for line in text.lines().filter(|l| l.contains("Error (")) {
        let message = line.split_once("): ").map_or(line, |(_, m)| m).trim();
        if !message.is_empty() && !errors.contains(&message) {
            errors.push(message);
        }
    }
    let last = errors.len().saturating_sub(3);
    let with_path = errors[..last]
        .iter()
        .filter(|m| m.contains('/') || ends_in_errno(m))
        .take(SUMMARY_LINES - 3)
        .copied();
    with_path.chain(errors[last..].iter().copied()).collect()
}

/// Whether a message ends as CRIU's `pr_perror` ends one, in the kernel's
/// own words (`Can't bind inet socket (id 12): Cannot assign requested
/// address`): the cause, however early in the log it comes.
fn ends_in_errno(message: &str) -> bool {
    message.rsplit_once(": ").is_some_and(|(_, e)| {
        e.starts_with(|c: char| c.is_ascii_uppercase())
            && e.contains(' ')
            && e.chars().all(|c| c.is_ascii_alphabetic() || c == ' ')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_that_turned_itself_off_is_named() {
        let on = "(00.01) cuda_plugin: initialized: cuda_plugin stage 1\n(00.02) cuda_plugin: pausing devices on pid 7\n";
        check_cuda_plugin_ran(on).unwrap();
        let off = "(00.01) Warn  (cuda_plugin.c:585): cuda_plugin: check that cuda-checkpoint is present in $PATH\n";
        assert_eq!(
            check_cuda_plugin_ran(off).unwrap_err(),
            "the CUDA plugin did not initialize: check that cuda-checkpoint is present in $PATH"
        );
        let none = check_cuda_plugin_ran("(00.01) Dumping finished successfully\n").unwrap_err();
        assert!(none.contains("did not load"), "{none}");
    }

    #[test]
    fn the_error_naming_the_missing_file_is_kept_with_the_last_three() {
        let log = "\
(00.100000) 1: Warn  (criu/files-reg.c:1200): something /not/an/error
(00.123456) 1: Error (criu/files-reg.c:2164): Can't open file root/.triton/cache/ab/cuda_utils.so on restore: No such file or directory
(00.123460) 1: Error (criu/files-reg.c:2100): Can't open file root/.triton/cache/ab/cuda_utils.so on restore: No such file or directory
(00.123470) 1: Error (criu/files.c:1228): Unable to open fd=7 id=0x1f
(00.123480) 1: Error (criu/cr-restore.c:1480): Can't restore files
(00.123490) 1: Error (criu/cr-restore.c:1500): Restore task 1 failed
(00.200000) Error (criu/cr-restore.c:2460): Restoring FAILED.
";
        assert_eq!(
            error_summary(log),
            [
                "Can't open file root/.triton/cache/ab/cuda_utils.so on restore: No such file or directory",
                "Can't restore files",
                "Restore task 1 failed",
                "Restoring FAILED.",
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("restore.log");
        std::fs::write(&path, log).unwrap();
        assert!(log_errors(&path)
            .starts_with("; CRIU: Can't open file root/.triton/cache/ab/cuda_utils.so"));
        assert_eq!(log_errors(&dir.path().join("absent.log")), "");
    }

    #[test]
    fn a_socket_criu_cannot_bind_is_named_before_the_lines_that_end_the_log() {
        let log = "\
(00.100) 1: Error (criu/sk-inet.c:1020): Can't bind inet socket (id 12): Cannot assign requested address
(00.101) 1: Error (criu/files.c:1228): Unable to open fd=5 id=0xc
(00.102) 1: Error (criu/cr-restore.c:1480): Can't restore files
(00.103) Error (criu/cgroup.c:2000): cgroupd: recv req error
(00.104) Error (criu/cr-restore.c:2460): Restoring FAILED.
";
        let summary = error_summary(log);
        assert_eq!(
            summary[0],
            "Can't bind inet socket (id 12): Cannot assign requested address"
        );
        assert!(
            !summary.contains(&"Unable to open fd=5 id=0xc"),
            "{summary:?}"
        );
    }

    #[test]
    fn a_log_of_many_errors_gives_the_first_paths_and_the_last_three() {
        let mut log: String = (0..20)
            .map(|i| format!("(00.{i:06}) 1: Error (criu/files-reg.c:1): Can't open /f{i}\n"))
            .collect();
        log.push_str("(01.000000) Error (criu/cr-restore.c:2): Restoring FAILED.\n");
        let summary = error_summary(&log);
        assert_eq!(summary.len(), SUMMARY_LINES);
        assert_eq!(summary[0], "Can't open /f0");
        assert_eq!(summary[8], "Can't open /f8");
        assert_eq!(
            summary[9..],
            ["Can't open /f18", "Can't open /f19", "Restoring FAILED."]
        );
        assert!(error_summary("(00.1) Dumping finished successfully\n").is_empty());
    }

    #[test]
    fn a_failed_gpu_resume_fails_the_restore() {
        let good = "(00.50) cuda_plugin: resuming devices on pid 12\n(00.90) Restore finished successfully. Tasks resumed.\n";
        check_cuda_resume(good).unwrap();
        let bad = include_str!("../../../tests/fixtures/restore-cuda-resume-failed.log");
        let e = check_cuda_resume(bad).unwrap_err();
        assert_eq!(
            e,
            "the CUDA plugin failed to resume the GPU: RESUME_DEVICES RESTORE failed with Error: out of memory while restoring device memory"
        );
    }
}
