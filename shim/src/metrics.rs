//! Container resource statistics, read straight from the cgroup filesystem.
//!
//! containerd-shim's own `cgroup::collect_metrics` reads cgroup v2 keys even on
//! a cgroup v1 host, so CPU and RSS come out as 0 there. This module finds a
//! process's cgroups from `/proc/<pid>/cgroup` and `/proc/self/mountinfo` and
//! fills the message containerd decodes for the host's cgroup version, the way
//! containerd's Go runc shim does:
//!
//! - cgroup v1 (also on a hybrid host): `io.containerd.cgroups.v1.Metrics`;
//! - cgroup v2 only: `io.containerd.cgroups.v2.Metrics`.
//!
//! A file that is missing or unreadable leaves its fields at 0; only a process
//! or cgroup that cannot be found is an error. The parsers take file contents
//! as `&str` and do no I/O, so they are unit-tested with literal contents.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::cgroups_v2::metrics as v2;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;

use crate::error::{Error, Result};

/// A process's cgroup statistics, in containerd's type for the host's cgroup
/// version.
#[derive(Debug, Clone, PartialEq)]
pub enum Metrics {
    /// `io.containerd.cgroups.v1.Metrics`.
    V1(v1::Metrics),
    /// `io.containerd.cgroups.v2.Metrics`.
    V2(v2::Metrics),
}

impl Metrics {
    /// Packs the metrics into the `Any` that goes into `StatsResponse.stats`.
    pub fn to_any(&self) -> Result<Any> {
        let any = match self {
            Metrics::V1(m) => containerd_shim::util::convert_to_any(Box::new(m.clone())),
            Metrics::V2(m) => containerd_shim::util::convert_to_any(Box::new(m.clone())),
        };
        any.map_err(|e| Error::Other(format!("stats: encoding the metrics: {e}")))
    }
}

/// Statistics of a container with no process yet (a restore in flight):
/// zero usage, in the type for the host's cgroup version, so that a
/// caller such as CRI's ContainerStats gets an answer, not an error.
pub fn empty() -> Metrics {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        Metrics::V2(v2::Metrics::default())
    } else {
        Metrics::V1(v1::Metrics::default())
    }
}

/// Collects the cgroup statistics of process `pid`.
///
/// Blocking file I/O on cgroupfs and procfs: call it from `spawn_blocking`.
/// Errors when the process or its cgroups cannot be found.
pub fn collect(pid: u32) -> Result<Metrics> {
    match cgroups_of(pid, "stats")? {
        Cgroups::V1(dirs) => {
            let read = |controller: &str, file: &str| read_opt(&dirs.get(controller)?.join(file));
            Ok(Metrics::V1(v1_metrics(&read, clock_ticks())))
        }
        Cgroups::V2(dir) => Ok(Metrics::V2(v2_metrics(&|file| read_opt(&dir.join(file))))),
    }
}

// ---------------------------------------------------------------------------
// Locating a process's cgroups.

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
struct CgroupMount {
    /// The cgroup path mounted there (`/` unless a cgroup namespace or a bind
    /// mount shows only a subtree).
    root: String,
    mount_point: PathBuf,
    /// `true` for cgroup2, `false` for a cgroup v1 hierarchy.
    v2: bool,
    /// The super options: a v1 hierarchy's controllers are among them.
    options: Vec<String>,
}

/// Parses the cgroup and cgroup2 mounts out of `/proc/self/mountinfo`.
fn parse_mountinfo(content: &str) -> Vec<CgroupMount> {
    content.lines().filter_map(parse_mountinfo_line).collect()
}

/// `36 25 0:32 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory`
fn parse_mountinfo_line(line: &str) -> Option<CgroupMount> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let mut right = right.split(' ');
    let (fstype, _source, options) = (right.next()?, right.next()?, right.next()?);
    if fstype != "cgroup" && fstype != "cgroup2" {
        return None;
    }
    Some(CgroupMount {
        root: unescape_octal(left.get(3)?),
        mount_point: PathBuf::from(unescape_octal(left.get(4)?)),
        v2: fstype == "cgroup2",
        options: options.split(',').map(str::to_string).collect(),
    })
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
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

// ---------------------------------------------------------------------------
// Reading and parsing cgroup files.

/// A file's contents; `None` when it is missing or unreadable.
fn read_opt(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `cpuacct.stat` (USER_HZ), 100 if unknown.
fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// A file holding one number; `None` when it holds anything else.
fn parse_u64(content: &str) -> Option<u64> {
    content.trim().parse().ok()
}

/// A v2 limit file (`memory.max`, `pids.max`): a number, or `max` for none.
fn parse_max(content: &str, unlimited: u64) -> Option<u64> {
    match content.trim() {
        "max" => Some(unlimited),
        n => n.parse().ok(),
    }
}

/// A flat-keyed file (`memory.stat`, `cpu.stat`, ...): `key value` lines.
/// Lines whose value is not a number are skipped.
pub(crate) fn parse_flat_keyed(content: &str) -> HashMap<&str, u64> {
    content
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (key, value) = (words.next()?, words.next()?);
            Some((key, value.parse().ok()?))
        })
        .collect()
}

/// `cpuacct.usage_percpu`: one space-separated number per CPU, in ns.
fn parse_per_cpu(content: &str) -> Vec<u64> {
    content
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// `cpuacct.stat` (`user` and `system` in USER_HZ ticks) as (user, kernel) ns.
fn parse_cpuacct_stat(content: &str, clock_ticks: u64) -> (u64, u64) {
    let stat = parse_flat_keyed(content);
    let ns = |key| {
        stat.get(key)
            .map_or(0, |t| t.saturating_mul(1_000_000_000) / clock_ticks)
    };
    (ns("user"), ns("system"))
}

/// cgroup v1 `cpu.stat`: the CFS throttling counters.
fn parse_v1_throttle(content: &str) -> v1::Throttle {
    let stat = parse_flat_keyed(content);
    let get = |key| stat.get(key).copied().unwrap_or(0);
    v1::Throttle {
        periods: get("nr_periods"),
        throttled_periods: get("nr_throttled"),
        throttled_time: get("throttled_time"),
        ..Default::default()
    }
}

/// cgroup v1 `memory.oom_control`.
fn parse_oom_control(content: &str) -> v1::MemoryOomControl {
    let stat = parse_flat_keyed(content);
    let get = |key| stat.get(key).copied().unwrap_or(0);
    v1::MemoryOomControl {
        oom_kill_disable: get("oom_kill_disable"),
        under_oom: get("under_oom"),
        oom_kill: get("oom_kill"),
        ..Default::default()
    }
}

/// cgroup v1 `memory.stat`, field by field as containerd's cgroups library
/// maps it. The usage/swap/kernel entries are filled separately.
fn parse_v1_memory_stat(content: &str) -> v1::MemoryStat {
    let raw = parse_flat_keyed(content);
    let get = |key| raw.get(key).copied().unwrap_or(0);
    v1::MemoryStat {
        cache: get("cache"),
        rss: get("rss"),
        rss_huge: get("rss_huge"),
        mapped_file: get("mapped_file"),
        dirty: get("dirty"),
        writeback: get("writeback"),
        pg_pg_in: get("pgpgin"),
        pg_pg_out: get("pgpgout"),
        pg_fault: get("pgfault"),
        pg_maj_fault: get("pgmajfault"),
        inactive_anon: get("inactive_anon"),
        active_anon: get("active_anon"),
        inactive_file: get("inactive_file"),
        active_file: get("active_file"),
        unevictable: get("unevictable"),
        hierarchical_memory_limit: get("hierarchical_memory_limit"),
        hierarchical_swap_limit: get("hierarchical_memsw_limit"),
        total_cache: get("total_cache"),
        total_rss: get("total_rss"),
        total_rss_huge: get("total_rss_huge"),
        total_mapped_file: get("total_mapped_file"),
        total_dirty: get("total_dirty"),
        total_writeback: get("total_writeback"),
        total_pg_pg_in: get("total_pgpgin"),
        total_pg_pg_out: get("total_pgpgout"),
        total_pg_fault: get("total_pgfault"),
        total_pg_maj_fault: get("total_pgmajfault"),
        total_inactive_anon: get("total_inactive_anon"),
        total_active_anon: get("total_active_anon"),
        total_inactive_file: get("total_inactive_file"),
        total_active_file: get("total_active_file"),
        total_unevictable: get("total_unevictable"),
        ..Default::default()
    }
}

/// Reads a cgroup file of a controller: `read(controller, file)` gives its
/// contents, `None` when missing.
type V1Reader<'a> = &'a dyn Fn(&str, &str) -> Option<String>;

/// Reads a file of the process's cgroup v2 directory, `None` when missing.
type V2Reader<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Builds the cgroup v1 metrics from the controllers' files.
fn v1_metrics(read: V1Reader, clock_ticks: u64) -> v1::Metrics {
    let number = |controller, file| read(controller, file).and_then(|c| parse_u64(&c));
    let pids = v1::PidsStat {
        current: number("pids", "pids.current").unwrap_or(0),
        // As runc and containerd report it: 0 when unlimited.
        limit: number("pids", "pids.max").unwrap_or(0),
        ..Default::default()
    };
    v1::Metrics {
        pids: MessageField::some(pids),
        cpu: MessageField::some(v1_cpu(read, clock_ticks)),
        memory: MessageField::some(v1_memory(read)),
        memory_oom_control: MessageField::some(
            read("memory", "memory.oom_control")
                .map(|c| parse_oom_control(&c))
                .unwrap_or_default(),
        ),
        ..Default::default()
    }
}

/// cgroup v1 CPU: cpuacct's usage and cpu's throttling.
fn v1_cpu(read: V1Reader, clock_ticks: u64) -> v1::CPUStat {
    let (user, kernel) = read("cpuacct", "cpuacct.stat")
        .map(|c| parse_cpuacct_stat(&c, clock_ticks))
        .unwrap_or_default();
    let usage = v1::CPUUsage {
        total: read("cpuacct", "cpuacct.usage")
            .and_then(|c| parse_u64(&c))
            .unwrap_or(0),
        user,
        kernel,
        per_cpu: read("cpuacct", "cpuacct.usage_percpu")
            .map(|c| parse_per_cpu(&c))
            .unwrap_or_default(),
        ..Default::default()
    };
    let throttling = read("cpu", "cpu.stat")
        .map(|c| parse_v1_throttle(&c))
        .unwrap_or_default();
    v1::CPUStat {
        usage: MessageField::some(usage),
        throttling: MessageField::some(throttling),
        ..Default::default()
    }
}

/// cgroup v1 memory: `memory.stat` plus the usage, memsw, kmem and kmem.tcp
/// counters.
fn v1_memory(read: V1Reader) -> v1::MemoryStat {
    let entry = |prefix: &str| {
        let get = |name: &str| {
            read("memory", &format!("{prefix}.{name}"))
                .and_then(|c| parse_u64(&c))
                .unwrap_or(0)
        };
        MessageField::some(v1::MemoryEntry {
            limit: get("limit_in_bytes"),
            usage: get("usage_in_bytes"),
            max: get("max_usage_in_bytes"),
            failcnt: get("failcnt"),
            ..Default::default()
        })
    };
    v1::MemoryStat {
        usage: entry("memory"),
        swap: entry("memory.memsw"),
        kernel: entry("memory.kmem"),
        kernel_tcp: entry("memory.kmem.tcp"),
        ..read("memory", "memory.stat")
            .map(|c| parse_v1_memory_stat(&c))
            .unwrap_or_default()
    }
}

/// cgroup v2 `cpu.stat`.
fn parse_v2_cpu_stat(content: &str) -> v2::CPUStat {
    let stat = parse_flat_keyed(content);
    let get = |key| stat.get(key).copied().unwrap_or(0);
    v2::CPUStat {
        usage_usec: get("usage_usec"),
        user_usec: get("user_usec"),
        system_usec: get("system_usec"),
        nr_periods: get("nr_periods"),
        nr_throttled: get("nr_throttled"),
        throttled_usec: get("throttled_usec"),
        nr_bursts: get("nr_bursts"),
        burst_usec: get("burst_usec"),
        ..Default::default()
    }
}

/// cgroup v2 `memory.stat`; the usage and limit fields are filled separately.
fn parse_v2_memory_stat(content: &str) -> v2::MemoryStat {
    let raw = parse_flat_keyed(content);
    let get = |key| raw.get(key).copied().unwrap_or(0);
    v2::MemoryStat {
        anon: get("anon"),
        file: get("file"),
        kernel_stack: get("kernel_stack"),
        slab: get("slab"),
        sock: get("sock"),
        shmem: get("shmem"),
        file_mapped: get("file_mapped"),
        file_dirty: get("file_dirty"),
        file_writeback: get("file_writeback"),
        anon_thp: get("anon_thp"),
        inactive_anon: get("inactive_anon"),
        active_anon: get("active_anon"),
        inactive_file: get("inactive_file"),
        active_file: get("active_file"),
        unevictable: get("unevictable"),
        slab_reclaimable: get("slab_reclaimable"),
        slab_unreclaimable: get("slab_unreclaimable"),
        pgfault: get("pgfault"),
        pgmajfault: get("pgmajfault"),
        workingset_refault: get("workingset_refault"),
        workingset_activate: get("workingset_activate"),
        workingset_nodereclaim: get("workingset_nodereclaim"),
        pgrefill: get("pgrefill"),
        pgscan: get("pgscan"),
        pgsteal: get("pgsteal"),
        pgactivate: get("pgactivate"),
        pgdeactivate: get("pgdeactivate"),
        pglazyfree: get("pglazyfree"),
        pglazyfreed: get("pglazyfreed"),
        thp_fault_alloc: get("thp_fault_alloc"),
        thp_collapse_alloc: get("thp_collapse_alloc"),
        ..Default::default()
    }
}

/// cgroup v2 `memory.events`.
fn parse_memory_events(content: &str) -> v2::MemoryEvents {
    let raw = parse_flat_keyed(content);
    let get = |key| raw.get(key).copied().unwrap_or(0);
    v2::MemoryEvents {
        low: get("low"),
        high: get("high"),
        max: get("max"),
        oom: get("oom"),
        oom_kill: get("oom_kill"),
        oom_group_kill: get("oom_group_kill"),
        ..Default::default()
    }
}

/// Builds the cgroup v2 metrics from the cgroup's files. Unlimited limits
/// (`max`) are reported as `u64::MAX`, as containerd's cgroups library does.
fn v2_metrics(read: V2Reader) -> v2::Metrics {
    let number = |file| read(file).and_then(|c| parse_u64(&c)).unwrap_or(0);
    let limit = |file| {
        read(file)
            .and_then(|c| parse_max(&c, u64::MAX))
            .unwrap_or(0)
    };
    let memory = v2::MemoryStat {
        usage: number("memory.current"),
        usage_limit: limit("memory.max"),
        swap_usage: number("memory.swap.current"),
        swap_limit: limit("memory.swap.max"),
        max_usage: number("memory.peak"),
        swap_max_usage: number("memory.swap.peak"),
        ..read("memory.stat")
            .map(|c| parse_v2_memory_stat(&c))
            .unwrap_or_default()
    };
    v2::Metrics {
        pids: MessageField::some(v2::PidsStat {
            current: number("pids.current"),
            limit: limit("pids.max"),
            ..Default::default()
        }),
        cpu: MessageField::some(
            read("cpu.stat")
                .map(|c| parse_v2_cpu_stat(&c))
                .unwrap_or_default(),
        ),
        memory: MessageField::some(memory),
        memory_events: MessageField::some(
            read("memory.events")
                .map(|c| parse_memory_events(&c))
                .unwrap_or_default(),
        ),
        ..Default::default()
    }
}

/// Scratch cgroups and children for the tests that need a real cgroup (root).
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// Fails the test, rather than skipping it, when not run as root.
    pub(crate) fn require_root() {
        assert!(
            // SAFETY: geteuid only returns a value.
            unsafe { libc::geteuid() } == 0,
            "this test creates cgroups and must run as root"
        );
    }

    /// A fresh cgroup `vsnap-test-<pid>-<tag>` in the hierarchies of some
    /// controllers (v1), or in the unified hierarchy (v2 only host); removed
    /// on drop.
    pub(crate) struct TestCgroup {
        /// (controller, directory); a v2 directory is listed once per controller.
        dirs: Vec<(String, PathBuf)>,
        pub(crate) v2: bool,
    }

    impl TestCgroup {
        pub(crate) fn create(controllers: &[&str], tag: &str) -> TestCgroup {
            let name = format!("vsnap-test-{}-{tag}", std::process::id());
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let mounts = super::parse_mountinfo(&mountinfo);
            let v1: Vec<_> = controllers
                .iter()
                .filter_map(|c| {
                    let m = mounts
                        .iter()
                        .find(|m| !m.v2 && m.options.iter().any(|o| o == c))?;
                    Some((c.to_string(), m.mount_point.join(&name)))
                })
                .collect();
            let cgroup = if !v1.is_empty() {
                TestCgroup {
                    dirs: v1,
                    v2: false,
                }
            } else {
                let m = mounts
                    .iter()
                    .find(|m| m.v2)
                    .expect("no cgroup mount at all");
                let enable: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
                // Best effort: the controllers are usually enabled already.
                let _ = std::fs::write(
                    m.mount_point.join("cgroup.subtree_control"),
                    enable.join(" "),
                );
                let dir = m.mount_point.join(&name);
                let dirs = controllers
                    .iter()
                    .map(|c| (c.to_string(), dir.clone()))
                    .collect();
                TestCgroup { dirs, v2: true }
            };
            for (_, dir) in &cgroup.dirs {
                if !dir.is_dir() {
                    std::fs::create_dir(dir)
                        .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
                }
            }
            cgroup
        }

        /// The directory of `controller`'s cgroup.
        pub(crate) fn dir(&self, controller: &str) -> &Path {
            let (_, dir) = self.dirs.iter().find(|(c, _)| c == controller).unwrap();
            dir
        }

        /// Moves process `pid` into the cgroup, in every hierarchy.
        pub(crate) fn add(&self, pid: u32) {
            for (_, dir) in &self.dirs {
                let procs = dir.join("cgroup.procs");
                std::fs::write(&procs, pid.to_string())
                    .unwrap_or_else(|e| panic!("writing {}: {e}", procs.display()));
            }
        }
    }

    impl Drop for TestCgroup {
        /// Kills what the tests left in the cgroup (orphans of a killed shell
        /// included) and removes it, retrying while the processes exit.
        fn drop(&mut self) {
            for (_, dir) in &self.dirs {
                let start = Instant::now();
                while dir.is_dir() {
                    let procs = std::fs::read_to_string(dir.join("cgroup.procs"));
                    for pid in procs.unwrap_or_default().lines() {
                        if let Ok(pid) = pid.parse() {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGKILL,
                            );
                        }
                    }
                    match std::fs::remove_dir(dir) {
                        Err(e) if start.elapsed() > Duration::from_secs(10) => {
                            eprintln!("removing {}: {e}", dir.display());
                            break;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                        Ok(()) => {}
                    }
                }
            }
        }
    }

    /// A `sh -c script` child with piped stdin, killed and reaped on drop.
    pub(crate) struct Shell(pub(crate) Child);

    impl Shell {
        pub(crate) fn spawn(script: &str) -> Shell {
            let child = Command::new("sh")
                .arg("-c")
                .arg(script)
                .stdin(Stdio::piped())
                .spawn()
                .expect("spawning sh");
            Shell(child)
        }

        pub(crate) fn pid(&self) -> u32 {
            self.0.id()
        }

        /// Writes a line to the script's stdin (what `read x` waits for).
        pub(crate) fn go(&mut self) {
            use std::io::Write;
            writeln!(self.0.stdin.as_mut().unwrap(), "go").unwrap();
        }
    }

    impl Drop for Shell {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Polls `cond` until it holds, failing with `what` after `timeout`.
    pub(crate) fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < timeout, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::time::Duration;

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
        assert_eq!(unescape_octal("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape_octal("plain\\x"), "plain\\x");
    }

    #[test]
    fn scalar_parsers() {
        assert_eq!(parse_u64("42\n"), Some(42));
        assert_eq!(parse_u64("max\n"), None);
        assert_eq!(parse_max("max\n", u64::MAX), Some(u64::MAX));
        assert_eq!(parse_max("1024\n", u64::MAX), Some(1024));
        assert_eq!(parse_per_cpu("10 20 0 30 \n"), vec![10, 20, 0, 30]);
        let kv = parse_flat_keyed("a 1\nb  2\nbad x\n\nc 3 extra\n");
        assert_eq!((kv["a"], kv["b"], kv["c"]), (1, 2, 3));
        assert!(!kv.contains_key("bad"));
    }

    #[test]
    fn cpuacct_stat_ticks_become_nanoseconds() {
        assert_eq!(
            parse_cpuacct_stat("user 250\nsystem 3\n", 100),
            (2_500_000_000, 30_000_000)
        );
        assert_eq!(parse_cpuacct_stat("user 5\n", 250), (20_000_000, 0));
    }

    /// v1 file contents by (controller, file).
    fn v1_files() -> HashMap<(&'static str, &'static str), &'static str> {
        HashMap::from([
            (("cpuacct", "cpuacct.usage"), "123456789\n"),
            (("cpuacct", "cpuacct.usage_percpu"), "100000000 23456789 \n"),
            (("cpuacct", "cpuacct.stat"), "user 7\nsystem 3\n"),
            (
                ("cpu", "cpu.stat"),
                "nr_periods 10\nnr_throttled 4\nthrottled_time 5000\nnr_bursts 0\nburst_time 0\n",
            ),
            (("memory", "memory.usage_in_bytes"), "1000\n"),
            (("memory", "memory.limit_in_bytes"), "9223372036854771712\n"),
            (("memory", "memory.max_usage_in_bytes"), "2000\n"),
            (("memory", "memory.failcnt"), "1\n"),
            (("memory", "memory.memsw.usage_in_bytes"), "1100\n"),
            (("memory", "memory.memsw.limit_in_bytes"), "5000\n"),
            (("memory", "memory.kmem.usage_in_bytes"), "300\n"),
            (("memory", "memory.kmem.tcp.max_usage_in_bytes"), "7\n"),
            (
                ("memory", "memory.stat"),
                "cache 11\nrss 12\nrss_huge 13\nshmem 99\nmapped_file 14\ndirty 15\n\
                 writeback 16\npgpgin 17\npgpgout 18\npgfault 19\npgmajfault 20\n\
                 inactive_anon 21\nactive_anon 22\ninactive_file 23\nactive_file 24\n\
                 unevictable 25\nhierarchical_memory_limit 26\nhierarchical_memsw_limit 27\n\
                 total_cache 28\ntotal_rss 29\ntotal_rss_huge 30\ntotal_mapped_file 31\n\
                 total_dirty 32\ntotal_writeback 33\ntotal_pgpgin 34\ntotal_pgpgout 35\n\
                 total_pgfault 36\ntotal_pgmajfault 37\ntotal_inactive_anon 38\n\
                 total_active_anon 39\ntotal_inactive_file 40\ntotal_active_file 41\n\
                 total_unevictable 42\n",
            ),
            (
                ("memory", "memory.oom_control"),
                "oom_kill_disable 0\nunder_oom 1\noom_kill 2\n",
            ),
            (("pids", "pids.current"), "3\n"),
            (("pids", "pids.max"), "max\n"),
        ])
    }

    #[test]
    fn v1_metrics_map_every_file() {
        let files = v1_files();
        let read = |c: &str, f: &str| files.get(&(c, f)).map(|s| s.to_string());
        let m = v1_metrics(&read, 100);

        let usage = &m.cpu.usage;
        assert_eq!(usage.total, 123456789);
        assert_eq!(usage.per_cpu, vec![100000000, 23456789]);
        assert_eq!((usage.user, usage.kernel), (70_000_000, 30_000_000));
        let throttle = &m.cpu.throttling;
        assert_eq!(
            (
                throttle.periods,
                throttle.throttled_periods,
                throttle.throttled_time
            ),
            (10, 4, 5000)
        );

        let mem = &m.memory;
        let entry = |e: &v1::MemoryEntry| (e.usage, e.limit, e.max, e.failcnt);
        assert_eq!(entry(&mem.usage), (1000, 9223372036854771712, 2000, 1));
        assert_eq!(entry(&mem.swap), (1100, 5000, 0, 0));
        assert_eq!(entry(&mem.kernel), (300, 0, 0, 0));
        assert_eq!(entry(&mem.kernel_tcp), (0, 0, 7, 0));
        let own = [
            mem.cache,
            mem.rss,
            mem.rss_huge,
            mem.mapped_file,
            mem.dirty,
            mem.writeback,
            mem.pg_pg_in,
            mem.pg_pg_out,
            mem.pg_fault,
            mem.pg_maj_fault,
            mem.inactive_anon,
            mem.active_anon,
            mem.inactive_file,
            mem.active_file,
            mem.unevictable,
            mem.hierarchical_memory_limit,
            mem.hierarchical_swap_limit,
        ];
        assert_eq!(own.to_vec(), (11..=27).collect::<Vec<u64>>());
        let total = [
            mem.total_cache,
            mem.total_rss,
            mem.total_rss_huge,
            mem.total_mapped_file,
            mem.total_dirty,
            mem.total_writeback,
            mem.total_pg_pg_in,
            mem.total_pg_pg_out,
            mem.total_pg_fault,
            mem.total_pg_maj_fault,
            mem.total_inactive_anon,
            mem.total_active_anon,
            mem.total_inactive_file,
            mem.total_active_file,
            mem.total_unevictable,
        ];
        assert_eq!(total.to_vec(), (28..=42).collect::<Vec<u64>>());

        let oom = &m.memory_oom_control;
        assert_eq!(
            (oom.oom_kill_disable, oom.under_oom, oom.oom_kill),
            (0, 1, 2)
        );
        // pids.max "max" is reported as 0, as runc and containerd do on v1.
        assert_eq!((m.pids.current, m.pids.limit), (3, 0));
    }

    #[test]
    fn v1_metrics_without_files_are_zero() {
        let m = v1_metrics(&|_, _| None, 100);
        assert_eq!(m.cpu.usage.total, 0);
        assert!(m.cpu.usage.per_cpu.is_empty());
        assert_eq!(m.memory.usage.usage, 0);
        assert_eq!(m.memory.rss, 0);
        assert_eq!(m.pids.limit, 0);
        assert_eq!(m.memory_oom_control.oom_kill, 0);
    }

    #[test]
    fn v2_metrics_map_every_file() {
        let files: HashMap<&str, &str> = HashMap::from([
            (
                "cpu.stat",
                "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 5\nnr_throttled 2\n\
                 throttled_usec 9\nnr_bursts 1\nburst_usec 3\n",
            ),
            ("memory.current", "4096\n"),
            ("memory.max", "max\n"),
            ("memory.swap.current", "0\n"),
            ("memory.swap.max", "8192\n"),
            ("memory.peak", "5000\n"),
            (
                "memory.stat",
                "anon 1\nfile 2\nkernel_stack 3\nslab 4\nsock 5\nshmem 6\nfile_mapped 7\n\
                 file_dirty 8\nfile_writeback 9\nanon_thp 10\ninactive_anon 11\nactive_anon 12\n\
                 inactive_file 13\nactive_file 14\nunevictable 15\nslab_reclaimable 16\n\
                 slab_unreclaimable 17\npgfault 18\npgmajfault 19\nworkingset_refault 20\n\
                 workingset_activate 21\nworkingset_nodereclaim 22\npgrefill 23\npgscan 24\n\
                 pgsteal 25\npgactivate 26\npgdeactivate 27\npglazyfree 28\npglazyfreed 29\n\
                 thp_fault_alloc 30\nthp_collapse_alloc 31\n",
            ),
            (
                "memory.events",
                "low 0\nhigh 1\nmax 2\noom 3\noom_kill 4\noom_group_kill 5\n",
            ),
            ("pids.current", "2\n"),
            ("pids.max", "max\n"),
        ]);
        let m = v2_metrics(&|f| files.get(f).map(|s| s.to_string()));

        let cpu = &m.cpu;
        assert_eq!(
            [
                cpu.usage_usec,
                cpu.user_usec,
                cpu.system_usec,
                cpu.nr_periods,
                cpu.nr_throttled,
                cpu.throttled_usec,
                cpu.nr_bursts,
                cpu.burst_usec
            ],
            [100, 60, 40, 5, 2, 9, 1, 3]
        );
        let mem = &m.memory;
        assert_eq!(
            (
                mem.usage,
                mem.usage_limit,
                mem.swap_usage,
                mem.swap_limit,
                mem.max_usage
            ),
            (4096, u64::MAX, 0, 8192, 5000)
        );
        let stat = [
            mem.anon,
            mem.file,
            mem.kernel_stack,
            mem.slab,
            mem.sock,
            mem.shmem,
            mem.file_mapped,
            mem.file_dirty,
            mem.file_writeback,
            mem.anon_thp,
            mem.inactive_anon,
            mem.active_anon,
            mem.inactive_file,
            mem.active_file,
            mem.unevictable,
            mem.slab_reclaimable,
            mem.slab_unreclaimable,
            mem.pgfault,
            mem.pgmajfault,
            mem.workingset_refault,
            mem.workingset_activate,
            mem.workingset_nodereclaim,
            mem.pgrefill,
            mem.pgscan,
            mem.pgsteal,
            mem.pgactivate,
            mem.pgdeactivate,
            mem.pglazyfree,
            mem.pglazyfreed,
            mem.thp_fault_alloc,
            mem.thp_collapse_alloc,
        ];
        assert_eq!(stat.to_vec(), (1..=31).collect::<Vec<u64>>());
        let ev = &m.memory_events;
        assert_eq!(
            [
                ev.low,
                ev.high,
                ev.max,
                ev.oom,
                ev.oom_kill,
                ev.oom_group_kill
            ],
            [0, 1, 2, 3, 4, 5]
        );
        assert_eq!((m.pids.current, m.pids.limit), (2, u64::MAX));
    }

    #[test]
    fn v2_metrics_without_files_are_zero() {
        let m = v2_metrics(&|_| None);
        assert_eq!(m.cpu.usage_usec, 0);
        assert_eq!(m.memory.usage_limit, 0);
        assert_eq!(m.pids.limit, 0);
    }

    #[test]
    fn to_any_names_containerds_types() {
        let any = Metrics::V1(v1::Metrics::default()).to_any().unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
        let any = Metrics::V2(v2::Metrics::default()).to_any().unwrap();
        assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    }

    #[test]
    fn a_missing_process_is_an_error_naming_it() {
        // Above the kernel's pid_max limit (4194304), so never a live pid.
        let err = collect(4_194_399).unwrap_err().to_string();
        assert!(err.starts_with("stats: "), "{err}");
        assert!(err.contains("4194399"), "{err}");
    }

    /// A busy, memory-holding child in a fresh cgroup: `collect` sees its CPU
    /// time and memory.
    #[test]
    fn collect_reads_a_live_cgroup() {
        require_root();
        let cgroup = TestCgroup::create(&["cpu", "cpuacct", "memory", "pids"], "stats");
        let mut child = Shell::spawn(
            "read x; x=$(head -c 4000000 /dev/zero | tr '\\0' a); \
             i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done",
        );
        cgroup.add(child.pid());
        child.go();

        let mut last = None;
        wait_until(
            "CPU time and memory in the cgroup",
            Duration::from_secs(20),
            || {
                let m = collect(child.pid()).expect("collect");
                let busy = match &m {
                    Metrics::V1(m) => {
                        let mem = &m.memory;
                        m.cpu.usage.total > 0
                            && m.cpu.usage.user + m.cpu.usage.kernel > 0
                            && mem.usage.usage > 0
                            && mem.rss + mem.cache > 4_000_000
                    }
                    Metrics::V2(m) => {
                        m.cpu.usage_usec > 0 && m.memory.usage > 0 && m.memory.anon > 4_000_000
                    }
                };
                last = Some(m);
                busy
            },
        );
        match last.unwrap() {
            Metrics::V1(m) => {
                assert!(!cgroup.v2);
                assert!(!m.cpu.usage.per_cpu.is_empty());
                assert!(m.cpu.usage.per_cpu.iter().sum::<u64>() > 0);
                assert!(m.memory.usage.limit > 0);
                assert!(m.memory.usage.max >= m.memory.usage.usage);
                if cgroup.dir("pids").join("pids.current").exists() {
                    assert!(m.pids.current >= 1, "pids {:?}", m.pids);
                }
            }
            Metrics::V2(m) => {
                assert!(cgroup.v2);
                assert!(m.pids.current >= 1, "pids {:?}", m.pids);
            }
        }
        drop(child);
    }
}
