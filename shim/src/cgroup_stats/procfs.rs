//! Where a process's cgroups are: `/proc/<pid>/cgroup` and
//! `/proc/self/mountinfo` read and matched into cgroup directories.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Where a process's cgroups are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cgroups {
    /// cgroup v1 (or hybrid): the directory of each controller, by name
    /// (`cpu`, `cpuacct`, `memory`, `pids`, ...). Only existing ones are kept.
    V1(HashMap<String, PathBuf>),
    /// cgroup v2 only: the process's one directory.
    V2(PathBuf),
}

impl Cgroups {
    /// The directory of the process's memory cgroup.
    pub(crate) fn memory_dir(&self) -> Option<&Path> {
        match self {
            Cgroups::V1(dirs) => dirs.get("memory").map(PathBuf::as_path),
            Cgroups::V2(dir) => Some(dir),
        }
    }
}

/// Finds the existing cgroup directories of process `pid`. `phase` prefixes
/// error messages ("stats", "oom").
pub(crate) fn cgroups_of(pid: u32, phase: &str) -> Result<Cgroups> {
    let proc_path = format!("/proc/{pid}/cgroup");
    let proc_cgroup = std::fs::read_to_string(&proc_path)
        .map_err(|e| Error::io(format!("{phase}: pid {pid}: reading {proc_path}"), e))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io(format!("{phase}: reading /proc/self/mountinfo"), e))?;
    let not_found = || Error::NotFound(format!("{phase}: no cgroup of pid {pid} found"));
    match locate(&proc_cgroup, &mountinfo).ok_or_else(not_found)? {
        Cgroups::V1(mut dirs) => {
            dirs.retain(|_, dir| dir.is_dir());
            if dirs.is_empty() {
                return Err(not_found());
            }
            Ok(Cgroups::V1(dirs))
        }
        Cgroups::V2(dir) if dir.is_dir() => Ok(Cgroups::V2(dir)),
        Cgroups::V2(_) => Err(not_found()),
    }
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcCgroup {
    /// The comma-separated controllers; empty for the cgroup v2 hierarchy.
    controllers: Vec<String>,
    path: String,
}

/// Parses `/proc/<pid>/cgroup`.
fn parse_proc_cgroup(content: &str) -> Vec<ProcCgroup> {
    content
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some(ProcCgroup {
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// A cgroup filesystem mount from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CgroupMount {
    /// The cgroup path mounted there (`/` unless a cgroup namespace or a bind
    /// mount shows only a subtree).
    root: String,
    pub(super) mount_point: PathBuf,
    /// `true` for cgroup2, `false` for a cgroup v1 hierarchy.
    pub(super) v2: bool,
    /// The super options: a v1 hierarchy's controllers are among them.
    pub(super) options: Vec<String>,
}

/// The cgroup and cgroup2 mounts of `/proc/self/mountinfo` (read by
/// vsnap-host's, the one mountinfo parser).
pub(super) fn parse_mountinfo(content: &str) -> Vec<CgroupMount> {
    vsnap_host::mountinfo::parse(content)
        .into_iter()
        .filter(|r| r.fs_type == "cgroup" || r.fs_type == "cgroup2")
        .map(|r| CgroupMount {
            root: r.root.to_string_lossy().into_owned(),
            mount_point: r.mount_point,
            v2: r.fs_type == "cgroup2",
            options: r.super_options.split(',').map(str::to_string).collect(),
        })
        .collect()
}

/// Where `cgroup_path` of a hierarchy shows up under `mount`, if the mount
/// covers it.
fn under_mount(mount: &CgroupMount, cgroup_path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        cgroup_path
    } else {
        let rest = cgroup_path.strip_prefix(mount.root.as_str())?;
        if !rest.is_empty() && !rest.starts_with('/') {
            return None;
        }
        rest
    };
    Some(mount.mount_point.join(rel.trim_start_matches('/')))
}

/// Works out a process's cgroup directories from its `/proc/<pid>/cgroup` and
/// the mount table; `None` when it has no cgroup at all. The directories are
/// not checked for existence. A host with any v1 hierarchy counts as v1.
fn locate(proc_cgroup: &str, mountinfo: &str) -> Option<Cgroups> {
    let lines = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    if lines.iter().any(|l| !l.controllers.is_empty()) {
        let mut dirs = HashMap::new();
        for line in &lines {
            for controller in &line.controllers {
                let dir = mounts
                    .iter()
                    .filter(|m| !m.v2 && m.options.contains(controller))
                    .find_map(|m| under_mount(m, &line.path));
                if let Some(dir) = dir {
                    dirs.insert(controller.clone(), dir);
                }
            }
        }
        return Some(Cgroups::V1(dirs));
    }
    let line = lines.iter().find(|l| l.controllers.is_empty())?;
    mounts
        .iter()
        .filter(|m| m.v2)
        .find_map(|m| under_mount(m, &line.path))
        .map(Cgroups::V2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's layout: cpu and cpuacct mounted apart, plus unified.
    const MOUNTINFO_HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const PROC_HYBRID: &str = "\
9:name=systemd:/
8:pids:/k8s/c1
4:memory:/k8s/c1
2:cpuacct:/k8s/c1
1:cpu:/k8s/c1
0::/
";

    #[test]
    fn locates_v1_controllers_mounted_apart() {
        let Some(Cgroups::V1(dirs)) = locate(PROC_HYBRID, MOUNTINFO_HYBRID) else {
            panic!("not v1");
        };
        assert_eq!(dirs["cpu"], Path::new("/sys/fs/cgroup/cpu/k8s/c1"));
        assert_eq!(dirs["cpuacct"], Path::new("/sys/fs/cgroup/cpuacct/k8s/c1"));
        assert_eq!(dirs["memory"], Path::new("/sys/fs/cgroup/memory/k8s/c1"));
        assert_eq!(dirs["pids"], Path::new("/sys/fs/cgroup/pids/k8s/c1"));
        assert_eq!(dirs["name=systemd"], Path::new("/sys/fs/cgroup/systemd"));
        assert_eq!(dirs.len(), 5);
    }

    #[test]
    fn locates_v1_cpu_and_cpuacct_comounted() {
        let mountinfo = "\
25 24 0:22 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
26 24 0:23 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";
        let proc = "3:cpu,cpuacct:/a/b\n2:memory:/a/b\n";
        let Some(Cgroups::V1(dirs)) = locate(proc, mountinfo) else {
            panic!("not v1");
        };
        assert_eq!(dirs["cpu"], Path::new("/sys/fs/cgroup/cpu,cpuacct/a/b"));
        assert_eq!(dirs["cpuacct"], Path::new("/sys/fs/cgroup/cpu,cpuacct/a/b"));
        assert_eq!(dirs["memory"], Path::new("/sys/fs/cgroup/memory/a/b"));
    }

    #[test]
    fn locates_v2_only() {
        let mountinfo =
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            locate("0::/system.slice/x.scope\n", mountinfo),
            Some(Cgroups::V2(PathBuf::from(
                "/sys/fs/cgroup/system.slice/x.scope"
            )))
        );
        assert_eq!(
            locate("0::/\n", mountinfo),
            Some(Cgroups::V2(PathBuf::from("/sys/fs/cgroup")))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_maps_paths_below_its_root() {
        let mountinfo = "\
26 24 0:23 /outer /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
27 24 0:24 /outer /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
        let proc = "2:memory:/outer/c1\n3:pids:/outerx/c1\n";
        let Some(Cgroups::V1(dirs)) = locate(proc, mountinfo) else {
            panic!("not v1");
        };
        assert_eq!(dirs["memory"], Path::new("/sys/fs/cgroup/memory/c1"));
        // `/outerx` is not below `/outer`.
        assert!(!dirs.contains_key("pids"));
    }

    #[test]
    fn no_cgroup_lines_locate_nothing() {
        assert_eq!(locate("", MOUNTINFO_HYBRID), None);
        // v2 line but no cgroup2 mount.
        assert_eq!(
            locate("0::/x\n", "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"),
            None
        );
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        let mounts = parse_mountinfo("40 31 0:37 / /mnt/my\\040cg rw - cgroup cgroup rw,memory\n");
        assert_eq!(mounts[0].mount_point, Path::new("/mnt/my cg"));
    }
}
