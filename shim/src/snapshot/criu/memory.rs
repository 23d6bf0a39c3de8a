//! Memory at restore: what a capture records of its tree's memory
//! (vsnap_artifact::memory), the container's memory limit (its spec's, and
//! those of the cgroups above it), the preflight that holds the one to the
//! other before CRIU runs, and the error of a restore the OOM killer ended
//! anyway (restore_oom.rs finds that out).

use std::path::{Path, PathBuf};

use serde_json::Value;
use vsnap_artifact::memory::{mib_down, mib_up, tmpfs_used};
use vsnap_artifact::Memory;

use crate::error::{Error, Result};

/// At or above this a cgroup's limit means none (v1 writes 2^63 - 4096).
const UNLIMITED: u64 = 1 << 60;

/// What the captured tree held in memory: its page images under `images`,
/// and its `/dev/shm`: the files carried to `carried_shm` when it is the
/// host folder `host_shm` on a tmpfs, else the tmpfs the container's init
/// `pid` sees at `/dev/shm` (read while the tree still runs).
pub fn at_capture(images: &Path, carried_shm: &Path, host_shm: Option<&Path>, pid: i32) -> Memory {
    let dev_shm_bytes = match host_shm {
        Some(host) => match tmpfs_used(host) {
            Some(_) => vsnap_artifact::layout::bytes_under(carried_shm),
            None => 0,
        },
        None => tmpfs_used(&PathBuf::from(format!("/proc/{pid}/root/dev/shm"))).unwrap_or(0),
    };
    Memory {
        pages_bytes: Memory::pages_under(images),
        dev_shm_bytes,
    }
}

/// The memory limit a restored tree lives under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    /// The cgroup above the container's whose limit it is (a pod's), or
    /// None for the container's own (`linux.resources.memory.limit`).
    pub parent: Option<PathBuf>,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = mib_down(self.bytes);
        match &self.parent {
            None => write!(f, "the container's memory limit {mib} MiB"),
            Some(p) => write!(
                f,
                "the memory limit {mib} MiB of cgroup {} (above the container's)",
                p.display()
            ),
        }
    }
}

/// The lowest memory limit over the container: its spec's
/// (`linux.resources.memory.limit`, what `ctr run --memory-limit` and a
/// Kubernetes `resources.limits.memory` set) and those of the cgroups
/// above its own (a pod's), read from cgroupfs now. None: unlimited.
pub fn limit_of(spec: &Value) -> Option<Limit> {
    let own = spec["linux"]["resources"]["memory"]["limit"]
        .as_i64()
        .filter(|&l| l > 0)
        .map(|l| Limit {
            bytes: l as u64,
            parent: None,
        });
    let above = cgroup_of(spec).and_then(|c| parents_limit(&c, read_limit));
    match (own, above) {
        (Some(a), Some(b)) if b.bytes < a.bytes => Some(b),
        (Some(a), _) => Some(a),
        (None, b) => b,
    }
}

/// The container's cgroup, relative to a hierarchy's root: the spec's
/// `cgroupsPath` as cgroupfs takes it (`/default/id`), or as runc's systemd
/// driver makes it of `slice:prefix:name`.
pub fn cgroup_of(spec: &Value) -> Option<PathBuf> {
    let path = spec["linux"]["cgroupsPath"].as_str()?;
    if path.starts_with('/') {
        return Some(PathBuf::from(path));
    }
    let mut parts = path.split(':');
    let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || name.is_empty() {
        return None;
    }
    let slice = if slice.is_empty() {
        "system.slice"
    } else {
        slice
    };
    let unit = if name.ends_with(".slice") {
        name.to_string()
    } else if prefix.is_empty() {
        format!("{name}.scope")
    } else {
        format!("{prefix}-{name}.scope")
    };
    Some(expand_slice(slice)?.join(unit))
}

/// systemd's path of a slice: `a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`.
fn expand_slice(slice: &str) -> Option<PathBuf> {
    let stem = slice.strip_suffix(".slice")?;
    let mut path = PathBuf::from("/");
    if stem == "-" {
        return Some(path);
    }
    if stem.is_empty() || stem.starts_with('-') || stem.ends_with('-') || stem.contains("--") {
        return None;
    }
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    Some(path)
}

/// The memory cgroup directory of `cgroup` (relative to a hierarchy's
/// root): cgroup v2's where the host has only that, else v1's memory
/// hierarchy.
pub fn memory_dir(cgroup: &Path) -> PathBuf {
    let relative = cgroup.strip_prefix("/").unwrap_or(cgroup);
    if is_v2() {
        Path::new("/sys/fs/cgroup").join(relative)
    } else {
        Path::new("/sys/fs/cgroup/memory").join(relative)
    }
}

pub fn is_v2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A cgroup's memory limit, None when it has none or cannot be read.
fn read_limit(cgroup: &Path) -> Option<u64> {
    let dir = memory_dir(cgroup);
    let text = std::fs::read_to_string(dir.join("memory.max"))
        .or_else(|_| std::fs::read_to_string(dir.join("memory.limit_in_bytes")))
        .ok()?;
    parse_limit(&text)
}

/// `memory.max` (`max` or bytes) or `memory.limit_in_bytes`; None for no limit.
fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&b| b < UNLIMITED)
}

/// The lowest limit of the cgroups above `cgroup`, as `read` finds them.
fn parents_limit(cgroup: &Path, read: impl Fn(&Path) -> Option<u64>) -> Option<Limit> {
    cgroup
        .ancestors()
        .skip(1)
        .filter(|p| *p != Path::new("/") && !p.as_os_str().is_empty())
        .filter_map(|p| {
            read(p).map(|bytes| Limit {
                bytes,
                parent: Some(p.to_path_buf()),
            })
        })
        .min_by_key(|l| l.bytes)
}

/// "the 1031 MiB this artifact's tree held at capture (pages 1024 MiB,
/// /dev/shm 7 MiB)".
fn held(need: &Memory) -> String {
    format!(
        "the {} MiB this artifact's tree held at capture (pages {} MiB, /dev/shm {} MiB)",
        mib_up(need.need()),
        mib_up(need.pages_bytes),
        mib_up(need.dev_shm_bytes)
    )
}

/// The preflight's comparison: an error naming both numbers when the
/// limit is below the need. No need recorded or no limit: nothing to hold.
pub fn check(need: Option<&Memory>, limit: Option<&Limit>) -> std::result::Result<(), String> {
    match (need, limit) {
        (Some(need), Some(limit)) if limit.bytes < need.need() => Err(format!(
            "{limit} is below {}: raise the limit above it (CRIU and the kernel need some more), \
             or set memory_preflight = false in the runtime config to try the restore anyway",
            held(need)
        )),
        _ => Ok(()),
    }
}

/// The restore preflight's memory check (before CRIU runs): the
/// container's limit held to what the artifact's tree held at capture.
pub fn preflight(need: Option<&Memory>, spec: &Value, enabled: bool) -> Result<()> {
    if !enabled || need.is_none() {
        return Ok(());
    }
    check(need, limit_of(spec).as_ref())
        .map_err(|e| Error::FailedPrecondition(format!("restore: preflight: memory: {e}")))
}

/// What restore_oom.rs found: how many OOM kills (or OOM events), and
/// where it read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomSeen {
    pub count: u64,
    pub how: String,
}

/// The error of a restore the OOM killer ended: the limit, what the kernel
/// counted, the need, and what failed as it happened.
pub fn out_of_memory(
    limit: Option<&Limit>,
    need: Option<&Memory>,
    seen: &OomSeen,
    failed: &Error,
) -> Error {
    let limit = match limit {
        Some(l) => format!("{l} did not hold the restored tree"),
        None => "the container has no memory limit, and the host ran out of memory".into(),
    };
    let need = match need {
        Some(n) => format!(
            "the restore charges at least {}, and CRIU and the kernel some more: raise the limit",
            held(n)
        ),
        None => "the artifact records no need (captured by an older vsnap): raise the limit".into(),
    };
    Error::OutOfMemory(format!(
        "restore: out of memory: {limit}: {}; {need} (what failed: {failed})",
        seen.how
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIB: u64 = 1 << 20;

    fn need() -> Memory {
        Memory {
            pages_bytes: 1024 * MIB,
            dev_shm_bytes: 7 * MIB,
        }
    }

    #[test]
    fn a_limit_below_the_need_is_refused_naming_both() {
        let limit = Limit {
            bytes: 64 * MIB,
            parent: None,
        };
        let err = check(Some(&need()), Some(&limit)).unwrap_err();
        assert!(
            err.starts_with("the container's memory limit 64 MiB is below the 1031 MiB this artifact's tree held at capture (pages 1024 MiB, /dev/shm 7 MiB): "),
            "{err}"
        );
        assert!(err.contains("memory_preflight = false"), "{err}");
        // At the need, or above it, or with either unknown: nothing to refuse.
        let at = Limit {
            bytes: need().need(),
            parent: None,
        };
        assert_eq!(check(Some(&need()), Some(&at)), Ok(()));
        assert_eq!(check(None, Some(&limit)), Ok(()));
        assert_eq!(check(Some(&need()), None), Ok(()));
        // One byte short reads as smaller, never as equal.
        let short = Limit {
            bytes: need().need() - 1,
            parent: None,
        };
        let err = check(Some(&need()), Some(&short)).unwrap_err();
        assert!(
            err.contains("limit 1030 MiB is below the 1031 MiB"),
            "{err}"
        );
    }

    #[test]
    fn a_parent_cgroup_s_limit_is_named_as_its() {
        let limit = Limit {
            bytes: 512 * MIB,
            parent: Some("/kubepods/burstable/pod1".into()),
        };
        let err = check(Some(&need()), Some(&limit)).unwrap_err();
        assert!(
            err.starts_with("the memory limit 512 MiB of cgroup /kubepods/burstable/pod1 (above the container's) is below the 1031 MiB"),
            "{err}"
        );
    }

    #[test]
    fn the_preflight_is_off_without_a_need_or_when_turned_off() {
        let spec = json!({"linux": {"resources": {"memory": {"limit": 64 * MIB}}}});
        let err = preflight(Some(&need()), &spec, true)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("restore: preflight: memory: the container's memory limit 64 MiB is below the 1031 MiB"), "{err}");
        assert!(preflight(Some(&need()), &spec, false).is_ok());
        assert!(preflight(None, &spec, true).is_ok());
        let unlimited = json!({"linux": {"resources": {"memory": {"limit": -1}}}});
        assert!(preflight(Some(&need()), &unlimited, true).is_ok());
        assert!(preflight(Some(&need()), &json!({}), true).is_ok());
    }

    #[test]
    fn limits_are_read_as_cgroupfs_writes_them() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("67108864\n"), Some(64 * MIB));
        assert_eq!(parse_limit(""), None);
    }

    #[test]
    fn the_lowest_limit_above_the_container_counts() {
        let read = |p: &Path| match p.to_str().unwrap() {
            "/kubepods" => Some(8192 * MIB),
            "/kubepods/pod1" => Some(512 * MIB),
            _ => None,
        };
        let l = parents_limit(Path::new("/kubepods/pod1/ctr"), read).unwrap();
        assert_eq!(l.bytes, 512 * MIB);
        assert_eq!(l.parent.as_deref(), Some(Path::new("/kubepods/pod1")));
        assert_eq!(parents_limit(Path::new("/default/x"), read), None);
    }

    #[test]
    fn the_container_s_own_limit_wins_when_lower() {
        // Its cgroup's parents do not exist on this host: the spec's alone.
        let spec = json!({"linux": {
            "cgroupsPath": "/vsnap-no-such-parent/x",
            "resources": {"memory": {"limit": 100 * MIB}},
        }});
        assert_eq!(
            limit_of(&spec),
            Some(Limit {
                bytes: 100 * MIB,
                parent: None
            })
        );
    }

    #[test]
    fn systemd_cgroup_paths_are_expanded_as_runc_does() {
        let of = |p: &str| cgroup_of(&json!({"linux": {"cgroupsPath": p}}));
        assert_eq!(of("/default/x"), Some("/default/x".into()));
        assert_eq!(
            of("kubepods-burstable-pod1.slice:cri-containerd:abc"),
            Some("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope".into())
        );
        assert_eq!(of(":vsnap:x"), Some("/system.slice/vsnap-x.scope".into()));
        assert_eq!(of("-.slice::x"), Some("/x.scope".into()));
        assert_eq!(of("bad--slice.slice:p:x"), None);
        assert_eq!(of("relative/path"), None);
        assert_eq!(cgroup_of(&json!({})), None);
    }

    #[test]
    fn the_out_of_memory_error_names_the_limit_the_count_and_the_need() {
        let seen = OomSeen {
            count: 1,
            how: "the OOM killer killed 1 process in the container's memory cgroup".into(),
        };
        let limit = Limit {
            bytes: 64 * MIB,
            parent: None,
        };
        let failed = Error::FailedPrecondition("restore: page placement: pid 1: ESRCH".into());
        let e = out_of_memory(Some(&limit), Some(&need()), &seen, &failed);
        let text = e.to_string();
        assert!(matches!(e, Error::OutOfMemory(_)));
        assert!(
            text.starts_with("restore: out of memory: the container's memory limit 64 MiB did not hold the restored tree: the OOM killer killed 1 process"),
            "{text}"
        );
        assert!(text.contains("at least the 1031 MiB this artifact's tree held at capture (pages 1024 MiB, /dev/shm 7 MiB)"), "{text}");
        assert!(
            text.ends_with("(what failed: restore: page placement: pid 1: ESRCH)"),
            "{text}"
        );
        let text = out_of_memory(None, None, &seen, &failed).to_string();
        assert!(
            text.contains("no memory limit") && text.contains("records no need"),
            "{text}"
        );
    }
}
