//! cgroup v2 (unified hierarchy only): the cgroup's files mapped into
//! containerd's `io.containerd.cgroups.v2.Metrics`, field by field.

use containerd_shim_protos::cgroups_v2::metrics as v2;
use containerd_shim_protos::protobuf::MessageField;

use super::parse::{parse_flat_keyed, parse_max, parse_u64};

/// Reads a file of the process's cgroup v2 directory, `None` when missing.
pub(super) type V2Reader<'a> = &'a dyn Fn(&str) -> Option<String>;

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
pub(super) fn v2_metrics(read: V2Reader) -> v2::Metrics {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
}
