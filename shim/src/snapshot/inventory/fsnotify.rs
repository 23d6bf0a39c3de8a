//! inotify and fanotify watches of a tree about to be captured, found
//! before CRIU runs and resolved to paths inside the container.
//!
//! CRIU dumps a watch by the file handle of the watched inode and, when it
//! cannot open that handle, looks the inode up by path ("irmap") in a few
//! fixed folders and in the `irmap-scan-path` folders it is given. An
//! overlayfs handle cannot be opened (open_by_handle_at refuses overlay's
//! own handle type without `nfs_export`), so a watch on a folder of an
//! image-based container's root (a cache folder, a config file) fails the
//! dump with "fsnotify: Can't dump that handle". The capture therefore
//! finds each watched inode under the container's root itself and hands
//! CRIU its path; CRIU records the path and the restore watches it again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The API a mark was made through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Inotify,
    Fanotify,
}

impl Api {
    fn as_str(self) -> &'static str {
        match self {
            Api::Inotify => "inotify",
            Api::Fanotify => "fanotify",
        }
    }
}

/// One watched inode: its device (as `stat` gives `st_dev`) and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Inode {
    pub dev: u64,
    pub ino: u64,
}

/// A mark a process of the tree holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub pid: i32,
    pub fd: String,
    pub api: Api,
    pub inode: Inode,
}

impl Watch {
    fn describe(&self) -> String {
        format!(
            "pid {} ({} fd {}) watches inode {} on device {}:{}",
            self.pid,
            self.api.as_str(),
            self.fd,
            self.inode.ino,
            nix::sys::stat::major(self.inode.dev),
            nix::sys::stat::minor(self.inode.dev)
        )
    }
}

/// The inode marks of one fdinfo text: `inotify wd:1 ino:98c2e1 sdev:28
/// ...` and `fanotify ino:... sdev:...` (mount and filesystem marks carry
/// no inode and need no path). `ino` is hex; `sdev` is the kernel's own
/// encoding (major << 20 | minor), turned into a `st_dev`.
pub fn parse_marks(fdinfo: &str) -> Vec<(Api, Inode)> {
    let mut out = Vec::new();
    for line in fdinfo.lines() {
        let api = if line.starts_with("inotify ") {
            Api::Inotify
        } else if line.starts_with("fanotify ") {
            Api::Fanotify
        } else {
            continue;
        };
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| u64::from_str_radix(v, 16).ok())
        };
        if let (Some(ino), Some(sdev)) = (field("ino:"), field("sdev:")) {
            let dev = nix::sys::stat::makedev(sdev >> 20, sdev & 0xfffff);
            out.push((api, Inode { dev, ino }));
        }
    }
    out
}

/// Every inode mark the processes `pids` hold, in pid and fd order.
pub fn watches(pids: &[i32]) -> Vec<Watch> {
    let mut out = Vec::new();
    for &pid in pids {
        for f in vsnap_host::fds::open_fds(pid) {
            let t = f.target.to_string_lossy();
            if t != "anon_inode:inotify" && t != "anon_inode:[fanotify]" {
                continue;
            }
            let text =
                std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", f.fd)).unwrap_or_default();
            for (api, inode) in parse_marks(&text) {
                out.push(Watch {
                    pid,
                    fd: f.fd.to_string(),
                    api,
                    inode,
                });
            }
        }
    }
    out
}

/// Folders never searched: their inodes are the kernel's, not files.
const SKIPPED: [&str; 2] = ["proc", "sys"];

/// The paths (inside the container, from `/`) of the inodes `wanted`,
/// found by a breadth-first walk of `root` (the container's root as the
/// host sees it: `/proc/<pid>/root`) that does not follow symlinks and
/// stops once all are found or `limit` entries were looked at. Shallow
/// paths first: a watched cache or config folder is found early.
pub fn resolve(root: &Path, wanted: &HashSet<Inode>, limit: usize) -> HashMap<Inode, String> {
    let mut found = HashMap::new();
    let mut seen = 0usize;
    let mut queue: VecDeque<PathBuf> = VecDeque::from([PathBuf::new()]);
    if let Ok(md) = std::fs::symlink_metadata(root) {
        note(&mut found, wanted, &md, Path::new(""));
    }
    while let Some(rel) = queue.pop_front() {
        if found.len() == wanted.len() || seen >= limit {
            break;
        }
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            let name = e.file_name();
            if rel.as_os_str().is_empty() && SKIPPED.iter().any(|s| name == *s) {
                continue;
            }
            let child = rel.join(&name);
            let Ok(md) = e.metadata() else { continue };
            note(&mut found, wanted, &md, &child);
            if md.is_dir() {
                queue.push_back(child);
            }
        }
    }
    found
}

fn note(
    found: &mut HashMap<Inode, String>,
    wanted: &HashSet<Inode>,
    md: &std::fs::Metadata,
    rel: &Path,
) {
    let inode = Inode {
        dev: md.dev(),
        ino: md.ino(),
    };
    if wanted.contains(&inode) {
        found
            .entry(inode)
            .or_insert_with(|| format!("/{}", rel.display()));
    }
}

/// Entries a capture looks at, at most, to find its watched inodes.
pub const RESOLVE_LIMIT: usize = 2_000_000;

/// The folders and files CRIU must scan to name every watch of `watches`
/// (`root`: the container's root as the host sees it), sorted; or why a
/// watch cannot be captured, naming the process and what it watches. A
/// watch on a filesystem whose handles CRIU can open (`overlay` is the one
/// that cannot) needs no path: one not found is left to CRIU.
pub fn scan_paths(
    watches: &[Watch],
    root: &Path,
    fs_type: &dyn Fn(u64) -> Option<String>,
) -> Result<Vec<String>, String> {
    if watches.is_empty() {
        return Ok(Vec::new());
    }
    let wanted: HashSet<Inode> = watches.iter().map(|w| w.inode).collect();
    let found = resolve(root, &wanted, RESOLVE_LIMIT);
    let mut paths = Vec::new();
    for w in watches {
        match found.get(&w.inode) {
            Some(path) if path.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'') => {
                return Err(format!(
                    "{} ({path:?}): CRIU's config cannot name a path with a space or a quote",
                    w.describe()
                ))
            }
            Some(path) => paths.push(path.clone()),
            None if fs_type(w.inode.dev).as_deref() == Some("overlay") => {
                return Err(format!(
                    "{} of the container's overlay root, and no path under the container's root leads to it (a deleted file or folder?); CRIU cannot dump such a watch: remove it before capture",
                    w.describe()
                ))
            }
            None => {}
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// The filesystem type of the device `dev` as the mount table `mountinfo`
/// (of `/proc/<pid>/mountinfo`) lists it.
pub fn fs_type(mountinfo: &str, dev: u64) -> Option<String> {
    let want = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    vsnap_host::mountinfo::parse(mountinfo)
        .into_iter()
        .find(|r| r.device == want)
        .map(|r| r.fs_type)
}

/// The watched inodes a CRIU dump log says it could not open
/// (`fsnotify: Handle 0x28:0x98c2e1 cannot be opened`: the kernel's device
/// encoding and the inode number, in hex).
pub fn unopened(dump_log: &str) -> Vec<Inode> {
    let mut out = Vec::new();
    for line in dump_log.lines() {
        let Some(rest) = line.split("Handle 0x").nth(1) else {
            continue;
        };
        let Some((handle, _)) = rest.split_once(" cannot be opened") else {
            continue;
        };
        let Some((sdev, ino)) = handle.split_once(":0x") else {
            continue;
        };
        if let (Ok(sdev), Ok(ino)) = (u64::from_str_radix(sdev, 16), u64::from_str_radix(ino, 16)) {
            let inode = Inode {
                dev: nix::sys::stat::makedev(sdev >> 20, sdev & 0xfffff),
                ino,
            };
            if !out.contains(&inode) {
                out.push(inode);
            }
        }
    }
    out
}

/// What a failed dump's log (`dump_log`) says about watches, in words:
/// each watched file CRIU could not reopen, with its path under `root`
/// (the container's root) and the processes of `pids` watching it; empty
/// when the log names none.
pub fn explain_dump_failure(dump_log: &str, root: &Path, pids: &[i32]) -> String {
    let inodes = unopened(dump_log);
    if inodes.is_empty() {
        return String::new();
    }
    let found = resolve(root, &inodes.iter().copied().collect(), RESOLVE_LIMIT);
    let watches = watches(pids);
    let named: Vec<String> = inodes
        .iter()
        .map(|i| {
            let path = found.get(i).map_or_else(
                || {
                    format!(
                        "inode {} on device {}:{}",
                        i.ino,
                        nix::sys::stat::major(i.dev),
                        nix::sys::stat::minor(i.dev)
                    )
                },
                |p| p.clone(),
            );
            let by: Vec<String> = watches
                .iter()
                .filter(|w| w.inode == *i)
                .map(|w| format!("pid {} ({})", w.pid, w.api.as_str()))
                .collect();
            match by.is_empty() {
                true => path,
                false => format!("{path} watched by {}", by.join(", ")),
            }
        })
        .collect();
    format!("; CRIU could not reopen the watched {}", named.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_from_fdinfo() {
        let text = "pos:\t0\nflags:\t00\nmnt_id:\t17\nino:\t1039\n\
            inotify wd:1 ino:98c2e1 sdev:28 mask:102 ignored_mask:0 fhandle-bytes:20 fhandle-type:f8 f_handle:00\n\
            inotify wd:2 ino:2 sdev:800001 mask:2 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:02\n\
            fanotify flags:0 event-flags:0\n\
            fanotify mnt_id:20 mflags:0 mask:1 ignored_mask:0\n\
            fanotify ino:1f sdev:fd00003 mflags:0 mask:2 ignored_mask:0 fhandle-bytes:8 fhandle-type:1 f_handle:1f\n";
        let marks = parse_marks(text);
        let mk = nix::sys::stat::makedev;
        assert_eq!(
            marks,
            vec![
                (
                    Api::Inotify,
                    Inode {
                        dev: mk(0, 40),
                        ino: 0x98c2e1
                    }
                ),
                (
                    Api::Inotify,
                    Inode {
                        dev: mk(8, 1),
                        ino: 2
                    }
                ),
                (
                    Api::Fanotify,
                    Inode {
                        dev: mk(253, 3),
                        ino: 0x1f
                    }
                ),
            ]
        );
    }

    #[test]
    fn watched_inodes_are_found_shallow_first_without_proc() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("root/.cache/vllm")).unwrap();
        std::fs::create_dir_all(root.join("proc/1")).unwrap();
        std::fs::write(root.join("etc.conf"), b"x").unwrap();
        std::fs::hard_link(root.join("etc.conf"), root.join("root/.cache/link")).unwrap();
        let inode = |p: &str| {
            let md = std::fs::metadata(root.join(p)).unwrap();
            Inode {
                dev: md.dev(),
                ino: md.ino(),
            }
        };
        let (cache, conf, hidden) = (
            inode("root/.cache/vllm"),
            inode("etc.conf"),
            inode("proc/1"),
        );
        let found = resolve(root, &HashSet::from([cache, conf, hidden]), 1000);
        assert_eq!(found[&cache], "/root/.cache/vllm");
        // The shallowest of two names of one file.
        assert_eq!(found[&conf], "/etc.conf");
        assert!(!found.contains_key(&hidden), "{found:?}");

        let w = |inode| Watch {
            pid: 7,
            fd: "5".into(),
            api: Api::Inotify,
            inode,
        };
        let overlay = |_| Some("overlay".to_string());
        assert_eq!(
            scan_paths(&[w(cache), w(conf), w(cache)], root, &overlay).unwrap(),
            ["/etc.conf", "/root/.cache/vllm"]
        );
        let err = scan_paths(&[w(hidden)], root, &overlay).unwrap_err();
        assert!(
            err.starts_with("pid 7 (inotify fd 5) watches inode"),
            "{err}"
        );
        assert!(err.contains("overlay root"), "{err}");
        // Elsewhere CRIU opens the handle itself.
        assert!(scan_paths(&[w(hidden)], root, &|_| Some("ext4".into()))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_dump_log_names_the_handles_it_could_not_open() {
        let log = "(00.07) fsnotify: wd: wd 0x00000001 s_dev 0x00000028 i_ino 0x98c2e1 mask 0x102\n\
            (00.07) Warn  (criu/fsnotify.c:288): fsnotify: \tHandle 0x28:0x98c2e1 cannot be opened\n\
            (00.08) Error (criu/fsnotify.c:284): fsnotify: \tCan't dump that handle\n";
        let mk = nix::sys::stat::makedev;
        assert_eq!(
            unopened(log),
            [Inode {
                dev: mk(0, 40),
                ino: 0x98c2e1
            }]
        );
        let dir = tempfile::tempdir().unwrap();
        let words = explain_dump_failure(log, dir.path(), &[]);
        assert_eq!(
            words,
            "; CRIU could not reopen the watched inode 10011361 on device 0:40"
        );
        assert_eq!(explain_dump_failure("Dumping FAILED", dir.path(), &[]), "");
    }

    #[test]
    fn a_device_is_named_by_its_mount() {
        let info = "22 1 0:40 / / rw,relatime - overlay overlay rw,lowerdir=/l\n\
                    30 22 8:1 /data /data rw - ext4 /dev/sda1 rw\n";
        let mk = nix::sys::stat::makedev;
        assert_eq!(fs_type(info, mk(0, 40)).as_deref(), Some("overlay"));
        assert_eq!(fs_type(info, mk(8, 1)).as_deref(), Some("ext4"));
        assert_eq!(fs_type(info, mk(9, 9)), None);
    }
}
