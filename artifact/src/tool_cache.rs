//! The identity of a tool binary (its `--version` line and sha256), kept
//! under the artifact root and reused while the file's `stat` is unchanged.
//!
//! A restore asks for it twice on its critical path (the shim's preflight
//! and the `fingerprint` OCI hook inside `runc restore`), and each time it
//! hashed runc and CRIU (~15 MB) and ran both with `--version`: 25-40 ms
//! apiece here. An entry is used only when device, inode, size, mtime and
//! ctime all match the file now; any write to the binary or its metadata
//! changes its ctime, which no unprivileged call can set back. The file
//! lives beside the host key, under the same root-owned artifact root: whoever
//! could forge an entry could forge a manifest's MAC anyway.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Its name under the artifact root.
pub const FILE: &str = ".tool-identity.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sha256: String,
    /// `--version`'s first line, for the tools that have one.
    #[serde(default)]
    version: Option<String>,
}

impl Entry {
    fn stat(path: &Path) -> Option<(u64, u64, u64, i128, i128)> {
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        Some((
            m.dev(),
            m.ino(),
            m.size(),
            ns(m.mtime(), m.mtime_nsec()),
            ns(m.ctime(), m.ctime_nsec()),
        ))
    }

    fn matches(&self, stat: (u64, u64, u64, i128, i128)) -> bool {
        (self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns) == stat
    }
}

/// The cache for one probe: loaded at the start, saved at the end when
/// something new was computed. `None` dir: nothing is cached.
pub struct ToolCache {
    file: Option<PathBuf>,
    entries: BTreeMap<String, Entry>,
    changed: bool,
}

impl ToolCache {
    pub fn load(dir: Option<&Path>) -> Self {
        let file = dir.map(|d| d.join(FILE));
        let entries = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        ToolCache {
            file,
            entries,
            changed: false,
        }
    }

    /// The sha256 (and, with `version_arg`, the version line) of `path`,
    /// from the cache when the file is unchanged, else computed by the
    /// given functions. A missing file is `"absent"` and never cached.
    pub fn identity(
        &mut self,
        path: &Path,
        version_arg: Option<&str>,
        sha256: impl FnOnce(&Path) -> String,
        version: impl FnOnce(&Path, &str) -> String,
    ) -> (String, String) {
        let Some(stat) = Entry::stat(path) else {
            let v = version_arg.map(|a| version(path, a)).unwrap_or_default();
            return ("absent".to_string(), v);
        };
        let key = path.display().to_string();
        if let Some(e) = self.entries.get(&key) {
            if e.matches(stat) && (version_arg.is_none() || e.version.is_some()) {
                return (e.sha256.clone(), e.version.clone().unwrap_or_default());
            }
        }
        let digest = sha256(path);
        let v = version_arg.map(|a| version(path, a));
        // Only if the file did not change while it was read, and its
        // version was read (a failed run is not the binary's identity).
        let ran = v.as_deref() != Some("absent");
        if ran && Entry::stat(path) == Some(stat) && self.file.is_some() {
            self.entries.insert(
                key,
                Entry {
                    dev: stat.0,
                    ino: stat.1,
                    size: stat.2,
                    mtime_ns: stat.3,
                    ctime_ns: stat.4,
                    sha256: digest.clone(),
                    version: v.clone(),
                },
            );
            self.changed = true;
        }
        (digest, v.unwrap_or_default())
    }

    /// Writes the cache (a temporary file, renamed), best effort: a cache
    /// that cannot be written costs only time.
    pub fn save(self) {
        let (Some(file), true) = (self.file, self.changed) else {
            return;
        };
        let Ok(bytes) = serde_json::to_vec(&self.entries) else {
            return;
        };
        let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
        let written = {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .and_then(|mut f| f.write_all(&bytes))
        };
        if written.and_then(|()| std::fs::rename(&tmp, &file)).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_file_is_not_read_again_and_a_changed_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("tool");
        std::fs::write(&tool, b"v1").unwrap();
        let hashes = std::cell::Cell::new(0);
        let hash = |_: &Path| {
            hashes.set(hashes.get() + 1);
            format!("h{}", hashes.get())
        };
        let version = |_: &Path, _: &str| "tool 1.0".to_string();

        let mut c = ToolCache::load(Some(dir.path()));
        assert_eq!(
            c.identity(&tool, Some("--version"), hash, version),
            ("h1".into(), "tool 1.0".into())
        );
        c.save();
        let mut c = ToolCache::load(Some(dir.path()));
        assert_eq!(
            c.identity(&tool, Some("--version"), hash, version).0,
            "h1",
            "cached"
        );
        assert_eq!(hashes.get(), 1);

        // Rewritten in place (same inode, same size) until its ctime moves:
        // the file system's clock ticks coarser than a write.
        let before = Entry::stat(&tool).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            std::fs::write(&tool, b"v2").unwrap();
            if Entry::stat(&tool).unwrap() != before {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "its ctime never moved"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            c.identity(&tool, Some("--version"), hash, version).0,
            "h2",
            "recomputed"
        );
        c.save();
        let mode = std::fs::metadata(dir.path().join(FILE)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_missing_tool_is_absent_and_no_dir_caches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = ToolCache::load(None);
        let (h, _) = c.identity(
            &dir.path().join("none"),
            None,
            |_| unreachable!(),
            |_, _| unreachable!(),
        );
        assert_eq!(h, "absent");
        let tool = dir.path().join("t");
        std::fs::write(&tool, b"x").unwrap();
        assert_eq!(
            c.identity(&tool, None, |_| "h".into(), |_, _| String::new())
                .0,
            "h"
        );
        c.save();
        assert!(!dir.path().join(FILE).exists());
    }
}
