//! Memory at restore: an artifact records what its tree held at capture
//! (CRIU's page images and the container's /dev/shm); a container whose
//! memory limit is below that is refused in the preflight, before CRIU runs,
//! naming both numbers; and a restore the OOM killer ends anyway (here:
//! one let past the preflight by the runtime config's `memory_preflight =
//! false`) says that it ran out of memory, with either page placement.

use std::net::TcpStream;

use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{assert_has, setup, Env};

/// The engine keeps 160 MiB of memory (it lands in the page images) and
/// 4 MiB in an unlinked file of its /dev/shm (a tmpfs of its own).
const ENV: [&str; 4] = [
    "--env",
    "VSNAP_ENGINE_RESIDENT_MB=160",
    "--env",
    "VSNAP_ENGINE_SHM_KB=4096",
];
const MIB: u64 = 1 << 20;
/// A limit far below the 160 MiB the engine holds.
const LIMIT: u64 = 64 * MIB;

/// Creates the artifact `name` from a donor holding 160 MiB and 4 MiB of
/// /dev/shm; returns its manifest's `memory` record, after checking what it
/// counts.
fn create(e: &Env, donor: &str, name: &str) -> serde_json::Value {
    let env = [ENV[1], ENV[3]];
    let manifest: serde_json::Value =
        serde_json::from_slice(&e.create_good(donor, name, &env)).unwrap();
    let memory = manifest["memory"].clone();
    let pages = memory["pages_bytes"].as_u64().unwrap_or(0);
    assert!(
        (160 * MIB..400 * MIB).contains(&pages),
        "the page images hold the engine's 160 MiB: {memory}"
    );
    let shm = memory["dev_shm_bytes"].as_u64().unwrap_or(0);
    assert!(
        (4 * MIB..8 * MIB).contains(&shm),
        "the tmpfs at /dev/shm held the engine's 4 MiB file: {memory}"
    );
    memory
}

/// A restore of `name` under a memory limit of `limit` bytes that must fail:
/// returns ctr's stderr after checking that nothing listens and removing
/// the container.
fn refused(e: &Env, id: &str, name: &str, limit: u64) -> String {
    let port = free_port();
    let limit = limit.to_string();
    let mut extra = vec!["--memory-limit", limit.as_str()];
    extra.extend_from_slice(&ENV);
    let out = e.run(id, "restore", name, port, &extra);
    assert!(!out.ok(), "{id} must not start: {out:?}");
    eprintln!("{id}: {}", out.stderr.trim());
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens on {port}"
    );
    out.stderr
}

/// `vsnap metrics` of this test's artifact root.
fn metrics(e: &Env) -> String {
    let bin = vsnap_e2e::containerd::shim_binary().with_file_name("vsnap");
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("--root").arg(&e.artifacts).arg("metrics");
    let out = vsnap_e2e::cmd::run(cmd, None, std::time::Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out:?}");
    out.stdout
}

/// The value of the sample `series` (name and labels as printed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn a_memory_limit_below_the_recorded_need_is_refused_before_criu() {
    let e = setup("mem-preflight");
    let memory = create(&e, "mem-p0", "held");
    let need = memory["pages_bytes"].as_u64().unwrap() + memory["dev_shm_bytes"].as_u64().unwrap();
    let err = refused(&e, "mem-p1", "held", LIMIT);
    assert_has(
        &err,
        &[
            "restore: preflight: memory: the container's memory limit 64 MiB is below the ",
            &format!(
                " {} MiB this artifact's tree held at capture (pages ",
                need.div_ceil(MIB)
            ),
            "/dev/shm ",
            "memory_preflight",
        ],
    );
    // Refused at create: no task was made, so no Start and no runc restore
    // (CRIU runs only there); the journal has the failure in the preflight.
    assert_eq!(e.task_status("mem-p1"), None, "no task");
    let text = metrics(&e);
    assert_eq!(
        sample(
            &text,
            "vsnap_failures_total{op=\"restore\",phase=\"preflight\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "vsnap_failures_total{op=\"restore\",phase=\"criu\"}"),
        None,
        "{text}"
    );
    e.c.ctr_ok(&["c", "rm", "mem-p1"]);
    assert_eq!(e.cgroups("mem-p1"), Vec::<String>::new(), "no cgroup");
    // A limit with room above the need passes the preflight and restores.
    let port = free_port();
    let limit = (need + 256 * MIB).to_string();
    let mut extra = vec!["--memory-limit", limit.as_str()];
    extra.extend_from_slice(&ENV);
    let out = e.run("mem-p2", "restore", "held", port, &extra);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("mem-p2");
    e.assert_nothing_left();
    assert_eq!(e.cgroups("mem-p2"), Vec::<String>::new(), "no cgroup");
}

#[test]
fn an_oom_kill_at_restore_says_out_of_memory_with_either_placement() {
    let e = setup("mem-oom");
    create(&e, "mem-o0", "oom");
    // The operator's escape hatch lets the restore past the preflight.
    let config = std::fs::read_to_string(&e.config).unwrap();
    std::fs::write(&e.config, format!("{config}memory_preflight = false\n")).unwrap();
    for (id, placement) in [("mem-o1", ""), ("mem-o2", "page_placement = \"criu\"\n")] {
        std::fs::write(
            &e.config,
            format!("{config}memory_preflight = false\n{placement}"),
        )
        .unwrap();
        let err = refused(&e, id, "oom", LIMIT);
        assert_has(
            &err,
            &[
                "restore: out of memory: the container's memory limit 64 MiB ",
                " MiB this artifact's tree held at capture",
                "OOM killer",
            ],
        );
        e.remove(id);
        assert_eq!(e.cgroups(id), Vec::<String>::new(), "{id}: no cgroup");
    }
    e.assert_nothing_left();
}
