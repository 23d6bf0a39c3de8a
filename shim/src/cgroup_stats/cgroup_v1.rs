//! cgroup v1 (also a hybrid host): the controllers' files mapped into
//! containerd's `io.containerd.cgroups.v1.Metrics`, field by field.

use containerd_shim_protos::cgroups::metrics as v1;
use containerd_shim_protos::protobuf::MessageField;

use super::parse::{parse_flat_keyed, parse_per_cpu, parse_u64};

/// Reads a cgroup file of a controller: `read(controller, file)` gives its
/// contents, `None` when missing.
pub(super) type V1Reader<'a> = &'a dyn Fn(&str, &str) -> Option<String>;

/// `sysconf(_SC_CLK_TCK)`: the unit of `cpuacct.stat` (USER_HZ), 100 if unknown.
pub(super) fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
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

/// Builds the cgroup v1 metrics from the controllers' files.
pub(super) fn v1_metrics(read: V1Reader, clock_ticks: u64) -> v1::Metrics {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
}
