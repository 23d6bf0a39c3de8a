//! The cgroupfs file formats (one number, a limit or `max`, flat-keyed
//! `key value` lines, space-separated numbers), parsed from their contents
//! without I/O.

use std::collections::HashMap;

/// A file holding one number; `None` when it holds anything else.
pub(super) fn parse_u64(content: &str) -> Option<u64> {
    content.trim().parse().ok()
}

/// A v2 limit file (`memory.max`, `pids.max`): a number, or `max` for none.
pub(super) fn parse_max(content: &str, unlimited: u64) -> Option<u64> {
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
pub(super) fn parse_per_cpu(content: &str) -> Vec<u64> {
    content
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
