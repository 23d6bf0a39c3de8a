//! A capture on a host whose clocks are far ahead, restored on one whose
//! clocks are behind (a host that booted later, or the same host after a
//! reboot): the capture records its boot id and clocks, and CRIU restores
//! the engine in a time namespace that continues the captured clocks, so
//! its pending timers are due as they were at the dump.

use std::time::{Duration, Instant};

use vsnap_e2e::containerd::Containerd;
use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::snapshot_env::{answers, setup_on, Env};

/// About 11.6 days: the capturing containerd runs in a time namespace
/// whose CLOCK_MONOTONIC and CLOCK_BOOTTIME read this much more than the
/// host's, as on a host that has been up that much longer.
const AHEAD_S: i64 = 1_000_000;
const S: u64 = 1_000_000_000;

#[test]
fn a_restore_on_a_host_whose_clocks_are_behind_the_captures_continues_the_engines_clocks() {
    let mut e = setup_on(Containerd::start_with_clock_offset("clocks", AHEAD_S));
    let reference = answers(HostEngine::start().port);
    let manifest: serde_json::Value =
        serde_json::from_slice(&e.create_good("ahead0", "ahead", &[])).unwrap();
    let clocks = &manifest["clocks"];
    let captured = clocks["monotonic_ns"].as_u64().unwrap();
    let host_now = clock(libc::CLOCK_MONOTONIC);
    assert!(
        captured > host_now + (AHEAD_S as u64 - 60) * S,
        "the capture's CLOCK_MONOTONIC is the containerd's, ahead of the host's: {clocks}"
    );
    assert!(clocks["boottime_ns"].as_u64().unwrap() > host_now + (AHEAD_S as u64 - 60) * S);
    assert_eq!(
        clocks["boot_id"],
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap()
            .trim(),
        "{clocks}"
    );

    // Restored under the same clocks: nothing to continue.
    restore_and_check(&e, "same1", captured, &reference);

    // Restored on the host's clocks, about 10^6 s behind the capture's.
    e.c.restart_on_host_clocks();
    assert!(clock(libc::CLOCK_MONOTONIC) + (AHEAD_S as u64 - 60) * S < captured);
    restore_and_check(&e, "behind1", captured, &reference);
    let log = std::fs::read_to_string(e.c.dir.join("containerd.log")).unwrap();
    assert!(
        log.contains(
            "CRIU restores the engine in a time namespace that continues the captured clocks"
        ),
        "the preflight saw the clocks behind and let CRIU continue them:\n{}",
        e.c.log_tail()
    );
    e.assert_nothing_left();
}

/// Restores `id` from "ahead" and checks it answers like a cold start, fast,
/// on clocks that continue the capture's: its CLOCK_MONOTONIC (this host's
/// plus its time namespace's offset) within a minute of the one captured,
/// not the host's. Removes it.
fn restore_and_check(e: &Env, id: &str, captured_ns: u64, reference: &[Answer]) {
    let port = free_port();
    let started = Instant::now();
    let out = e.run(id, "restore", "ahead", port, &[]);
    let took = started.elapsed();
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    eprintln!("{id}: restored in {took:?}");
    assert!(took < Duration::from_secs(30), "{id}: {took:?}");
    assert_eq!(answers(port), reference, "{id} answers like a cold start");
    let pid = task_pid(e, id);
    let engine = clock(libc::CLOCK_MONOTONIC) as i128 + monotonic_offset_ns(pid);
    let drift = engine - captured_ns as i128;
    eprintln!("{id}: the engine's CLOCK_MONOTONIC is {drift} ns past the captured one");
    assert!(
        (0..60 * S as i128).contains(&drift),
        "{id}: the engine's clock continues the capture's: {drift} ns after it"
    );
    e.remove(id);
}

type Answer = (serde_json::Value, serde_json::Value, serde_json::Value);

fn task_pid(e: &Env, id: &str) -> i32 {
    e.c.task_pid("default", id)
}

/// The CLOCK_MONOTONIC offset of `pid`'s time namespace, in nanoseconds
/// (`monotonic <s> <ns>` in /proc/PID/timens_offsets).
fn monotonic_offset_ns(pid: i32) -> i128 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/timens_offsets")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("monotonic"))
        .unwrap_or_else(|| panic!("{text}"));
    let f: Vec<i128> = line
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    f[0] * S as i128 + f[1]
}

/// This test's (the host's) `clock` in nanoseconds.
fn clock(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to write.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    ts.tv_sec as u64 * S + ts.tv_nsec as u64
}
