//! Container resource statistics, read straight from the cgroup filesystem:
//! what containerd's Stats asks (its `Metrics` messages; `ctr task metrics`).
//! Not the metrics journal of restores and captures (snapshot/records/).
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
//!
//! One concern a file: `procfs` finds the cgroup directories, `parse` reads
//! the cgroupfs file formats, `cgroup_v1` and `cgroup_v2` map the files into
//! containerd's message for each version, `test_support` holds the scratch
//! cgroups of the root tests. This file is the API: `collect` for a live
//! process, `empty`, and `Metrics::to_any` for `StatsResponse.stats`.

mod cgroup_v1;
mod cgroup_v2;
mod parse;
mod procfs;
#[cfg(test)]
pub(crate) mod test_support;

use std::path::Path;

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::cgroups_v2::metrics as v2;
use containerd_shim_protos::protobuf::well_known_types::any::Any;

use crate::error::{Error, Result};

pub(crate) use parse::parse_flat_keyed;
pub(crate) use procfs::{cgroups_of, Cgroups};

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
            Metrics::V1(m) => crate::any::pack(m),
            Metrics::V2(m) => crate::any::pack(m),
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
            Ok(Metrics::V1(cgroup_v1::v1_metrics(
                &read,
                cgroup_v1::clock_ticks(),
            )))
        }
        Cgroups::V2(dir) => Ok(Metrics::V2(cgroup_v2::v2_metrics(&|file| {
            read_opt(&dir.join(file))
        }))),
    }
}

/// A file's contents; `None` when it is missing or unreadable.
fn read_opt(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::time::Duration;

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
