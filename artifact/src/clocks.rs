//! The capturing host's boot and clocks at the dump, and whether a restore
//! here gives the engine back the clocks its timers were set on.
//!
//! A restored engine's pending timers are due at the capturing host's
//! CLOCK_MONOTONIC (every event loop computes its next wake-up from it;
//! some use CLOCK_BOOTTIME). CRIU (3.14 and later, so 4.2.1 here) dumps
//! both clocks with every tree (`timens-0.img`) and, on a kernel with time
//! namespaces (5.6+, CONFIG_TIME_NS), restores the tree into a new time
//! namespace whose offsets continue them from the dump, whether this host's
//! clocks read more or less than the capture's. runc needs no part in it
//! (1.1.5 knows no time namespace). On a kernel without time namespaces the
//! restored tree reads this host's clocks: where they are behind the
//! capture's (the host rebooted, or one that booted more recently), every
//! pending timer waits out the difference, possibly days, and the restore
//! dies at its activation deadline. [`check_restore`] refuses that case
//! before CRIU runs.
//!
//! The boot id is recorded to explain a difference, never compared: a
//! restore on another boot is fine wherever CRIU continues the clocks.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Where the kernel says it has time namespaces (CRIU asks the same file).
pub const TIME_NAMESPACES: &str = "/proc/self/timens_offsets";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// A host's boot id and clocks at one moment (for a manifest: right before
/// the dump), as the shim sees them: in the container's time namespace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Clocks {
    /// `/proc/sys/kernel/random/boot_id`: which boot of which host (empty
    /// when unreadable).
    pub boot_id: String,
    /// CLOCK_MONOTONIC in nanoseconds.
    pub monotonic_ns: u64,
    /// CLOCK_BOOTTIME in nanoseconds (CLOCK_MONOTONIC plus time suspended).
    pub boottime_ns: u64,
}

impl Clocks {
    /// This host's boot id and clocks now.
    pub fn now() -> Self {
        let boot_id = std::fs::read_to_string(BOOT_ID)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Clocks {
            boot_id,
            monotonic_ns: read_clock(libc::CLOCK_MONOTONIC),
            boottime_ns: read_clock(libc::CLOCK_BOOTTIME),
        }
    }
}

fn read_clock(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to write; both clocks exist
    // on every kernel vsnap runs on (2.6.39+).
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether this kernel has time namespaces, in which CRIU continues a
/// restored tree's clocks.
pub fn has_time_namespaces() -> bool {
    Path::new(TIME_NAMESPACES).exists()
}

/// Whether a tree dumped at `captured` can be restored on a host whose
/// clocks read `live`: an error naming the clocks when its timers would
/// wait for this host's clocks to catch up (no time namespaces, a clock
/// behind). `Ok(Some(note))` when a clock is behind but CRIU continues
/// the captured clocks in a time namespace, for the log; `Ok(None)` when
/// this host's clocks are ahead of the capture's.
pub fn check_restore(
    captured: &Clocks,
    live: &Clocks,
    time_namespaces: bool,
) -> Result<Option<String>, String> {
    let behind: Vec<(&str, u64, u64)> = [
        ("CLOCK_MONOTONIC", live.monotonic_ns, captured.monotonic_ns),
        ("CLOCK_BOOTTIME", live.boottime_ns, captured.boottime_ns),
    ]
    .into_iter()
    .filter(|(_, live, captured)| live < captured)
    .collect();
    if behind.is_empty() {
        return Ok(None);
    }
    let clocks = behind
        .iter()
        .map(|(clock, live, captured)| {
            format!(
                "this host's {clock} is {}, the capture's was {}",
                seconds(*live),
                seconds(*captured)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let boots = format!(
        "boot id {}, this host's {}",
        boot_id(&captured.boot_id),
        boot_id(&live.boot_id)
    );
    let wait = behind
        .iter()
        .map(|(_, live, captured)| captured - live)
        .max()
        .unwrap_or_default();
    if time_namespaces {
        return Ok(Some(format!(
            "clocks: {clocks} ({boots}): CRIU restores the engine in a time namespace \
             that continues the captured clocks"
        )));
    }
    Err(format!(
        "clocks: {clocks} ({boots}): the restored engine's timers would wait {} for this \
         host's clocks to catch up, and this kernel has no time namespaces ({TIME_NAMESPACES} \
         is missing: CONFIG_TIME_NS, Linux 5.6+) in which CRIU would continue the captured \
         clocks; capture again on this host, or restore on a host that has been up longer \
         than {}",
        seconds(wait),
        seconds(captured.monotonic_ns.max(captured.boottime_ns))
    ))
}

fn boot_id(id: &str) -> &str {
    if id.is_empty() {
        "unknown"
    } else {
        id
    }
}

/// Nanoseconds as seconds with one decimal: `97530.9 s`.
pub fn seconds(ns: u64) -> String {
    format!("{:.1} s", ns as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn at(boot_id: &str, monotonic_s: f64, boottime_s: f64) -> Clocks {
        Clocks {
            boot_id: boot_id.into(),
            monotonic_ns: (monotonic_s * S as f64) as u64,
            boottime_ns: (boottime_s * S as f64) as u64,
        }
    }

    #[test]
    fn a_host_whose_clocks_are_ahead_restores_without_a_word() {
        let captured = at("a", 100.0, 100.0);
        for ns in [true, false] {
            assert_eq!(
                check_restore(&captured, &at("a", 200.0, 250.0), ns),
                Ok(None)
            );
            assert_eq!(check_restore(&captured, &captured, ns), Ok(None));
            assert_eq!(
                check_restore(&captured, &at("b", 100.5, 120.0), ns),
                Ok(None)
            );
        }
    }

    #[test]
    fn clocks_behind_without_time_namespaces_are_refused_naming_both_and_the_wait() {
        let captured = at("boot-x", 98765.4, 98800.0);
        let live = at("boot-y", 1234.5, 1300.0);
        let e = check_restore(&captured, &live, false).unwrap_err();
        assert!(
            e.starts_with(
                "clocks: this host's CLOCK_MONOTONIC is 1234.5 s, the capture's was 98765.4 s; \
                 this host's CLOCK_BOOTTIME is 1300.0 s, the capture's was 98800.0 s \
                 (boot id boot-x, this host's boot-y): the restored engine's timers would \
                 wait 97530.9 s for this host's clocks to catch up"
            ),
            "{e}"
        );
        assert!(e.contains("no time namespaces"), "{e}");
        assert!(e.contains("capture again on this host"), "{e}");
        assert!(e.contains("up longer than 98800.0 s"), "{e}");
    }

    #[test]
    fn one_clock_behind_is_enough_and_only_it_is_named() {
        // More time suspended at capture: BOOTTIME behind, MONOTONIC ahead.
        let e = check_restore(&at("a", 100.0, 5000.0), &at("b", 200.0, 300.0), false).unwrap_err();
        assert!(
            e.starts_with("clocks: this host's CLOCK_BOOTTIME is 300.0 s, the capture's was 5000.0 s (boot id a, this host's b): the restored engine's timers would wait 4700.0 s"),
            "{e}"
        );
        assert!(!e.contains("CLOCK_MONOTONIC"), "{e}");
    }

    #[test]
    fn clocks_behind_with_time_namespaces_restore_with_a_note() {
        let note = check_restore(&at("x", 1e6, 1e6), &at("", 300.0, 300.0), true)
            .unwrap()
            .expect("a note for the log");
        assert!(
            note.contains("this host's CLOCK_MONOTONIC is 300.0 s, the capture's was 1000000.0 s"),
            "{note}"
        );
        assert!(note.contains("boot id x, this host's unknown"), "{note}");
        assert!(
            note.contains("time namespace that continues the captured clocks"),
            "{note}"
        );
    }

    #[test]
    fn this_hosts_clocks_are_read() {
        let a = Clocks::now();
        let b = Clocks::now();
        assert!(a.monotonic_ns > 0 && b.monotonic_ns >= a.monotonic_ns);
        assert_eq!(a.boot_id.len(), 36, "a uuid: {a:?}");
    }
}
