//! CRIU's logs of failed captures and restores, kept under the artifact
//! root after the task that ran them is gone (a capture's staging folder
//! and a restore's bundle, where CRIU wrote them, go with it).
//!
//! `<root>/.criu-logs/<stamp>-<artifact>-<container>-<dump|restore>.log`,
//! root-only; each log's last [`MAX_BYTES`] only, the newest [`KEEP`] logs
//! of the root only; `vsnap gc` removes them by age. The folder's name is
//! no artifact name: `ls`, `gc`'s sizes and the registry never see it.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The folder under the artifact root.
pub const DIR: &str = ".criu-logs";
/// Logs kept per artifact root, newest first.
pub const KEEP: usize = 32;
/// The tail of a log kept (where CRIU says what failed).
pub const MAX_BYTES: u64 = 4 << 20;

/// Copies the tail of CRIU's `log` of a failed `kind` ("dump" or
/// "restore") of `artifact` by `container` into the root's log folder as
/// `<stamp>-<artifact>-<container>-<kind>.log` (`stamp`: a UTC time that
/// sorts, e.g. `20261204T191000.123Z`), then removes all but the newest
/// [`KEEP`]. Returns the kept file.
pub fn keep(
    root: &Path,
    stamp: &str,
    artifact: &str,
    container: &str,
    kind: &str,
    log: &Path,
) -> std::io::Result<PathBuf> {
    let dir = root.join(DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    let mut src = std::fs::File::open(log)?;
    let len = src.metadata()?.len();
    let path = dir.join(format!("{stamp}-{artifact}-{container}-{kind}.log"));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    if len > MAX_BYTES {
        writeln!(
            out,
            "(vsnap: the first {} bytes of {} left out)",
            len - MAX_BYTES,
            log.display()
        )?;
        src.seek(SeekFrom::Start(len - MAX_BYTES))?;
    }
    std::io::copy(&mut src.take(MAX_BYTES), &mut out)?;
    out.sync_all()?;
    prune(&dir, KEEP);
    Ok(path)
}

/// The kept logs of `root`, oldest first, with their modification times.
pub fn list(root: &Path) -> Vec<(PathBuf, std::time::SystemTime)> {
    let Ok(entries) = std::fs::read_dir(root.join(DIR)) else {
        return Vec::new();
    };
    let mut logs: Vec<(PathBuf, std::time::SystemTime)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
        .collect();
    logs.sort();
    logs
}

/// Removes all but the newest `keep` logs of the folder `dir` (by name:
/// names start with their time).
fn prune(dir: &Path, keep: usize) {
    let Some(root) = dir.parent() else { return };
    let logs = list(root);
    for (path, _) in logs.iter().take(logs.len().saturating_sub(keep)) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_log_is_kept_root_only_bounded_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("artifacts");
        std::fs::create_dir(&root).unwrap();
        let log = dir.path().join("dump.log");
        std::fs::write(
            &log,
            b"(00.1) Error (criu/fsnotify.c:284): fsnotify: Can't dump that handle\n",
        )
        .unwrap();
        let kept = keep(&root, "20261204T000000.000Z", "m", "c1", "dump", &log).unwrap();
        assert_eq!(
            kept,
            root.join(".criu-logs/20261204T000000.000Z-m-c1-dump.log")
        );
        assert_eq!(std::fs::read(&kept).unwrap(), std::fs::read(&log).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&kept), mode(&root.join(DIR))), (0o600, 0o700));

        // A large log keeps its tail, and says so.
        let mut big = vec![b'a'; MAX_BYTES as usize];
        big.extend_from_slice(b"THE END\n");
        std::fs::write(&log, &big).unwrap();
        let kept = keep(&root, "20261204T000001.000Z", "m", "c2", "restore", &log).unwrap();
        let text = std::fs::read_to_string(&kept).unwrap();
        assert!(
            text.starts_with("(vsnap: the first 8 bytes of "),
            "{}",
            &text[..80]
        );
        assert!(text.ends_with("THE END\n"));

        for i in 0..KEEP + 3 {
            keep(
                &root,
                &format!("20261205T{i:06}.000Z"),
                "m",
                "c",
                "dump",
                &log,
            )
            .unwrap();
        }
        let names: Vec<String> = list(&root)
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), KEEP);
        assert_eq!(names[0], "20261205T000003.000Z-m-c-dump.log");
    }
}
