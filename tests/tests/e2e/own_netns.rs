//! A snapshot container in a network namespace of its own (`ctr run`
//! without `--net-host`): the shim makes the namespace at Create
//! (netns_holder.rs), the capture runs in it, a restore is restored into a
//! fresh one whose loopback is up (the copy's canary and listener are
//! probed over it). An artifact of format 5 captured in such a namespace
//! (before the shim made it) is captured again by `auto`, and `restore`
//! names its format.

use std::time::Duration;

use vsnap_e2e::cmd::CmdOutput;
use vsnap_e2e::engine::free_port;
use vsnap_e2e::snapshot_env::{assert_has, poll, setup, Env};

/// `ctr run -d` of the engine under `plan` in a network namespace of its
/// own (no `--net-host`), listening on 127.0.0.1:`port` inside it.
fn run_own_netns(e: &Env, id: &str, plan: &str, artifact: &str, extra: &[&str]) -> CmdOutput {
    let mut args = e.plan_args(plan, artifact, free_port(), false);
    args.extend(extra.iter().map(|a| a.to_string()));
    args.extend(["--rootfs".to_string(), e.rootfs.clone()]);
    let cmd = e.plan_run(id, args, &["/vsnap-ref-engine"]);
    vsnap_e2e::cmd::run(cmd, None, Duration::from_secs(180))
}

#[test]
fn a_container_in_its_own_network_namespace_captures_and_restores() {
    let e = setup("own-netns");
    let exit = ["--annotation", "vsnap.io/after-capture=exit"];
    let out = run_own_netns(&e, "own-donor", "create", "own", &exit);
    assert!(out.ok(), "{out:?}");
    let made = e.wait_manifest("own");
    assert_eq!(made["schema_version"], vsnap_artifact::SCHEMA_VERSION);
    e.wait_stopped("own-donor");
    e.remove("own-donor");

    // Restored into a namespace of its own, the canary over its loopback.
    let out = run_own_netns(&e, "own-copy", "restore", "own", &[]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("own-copy");

    // The same artifact as a vsnap of format 5 made it (CRIU held the
    // container's namespace in its images): no longer read at all.
    let path = e.manifest("own");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(vsnap_artifact::READABLE_SCHEMA_VERSIONS[0] > 5);
    v["schema_version"] = 5.into();
    v["workload"].as_object_mut().unwrap().remove("per_pod_env");
    v.as_object_mut().unwrap().remove("criu");
    v.as_object_mut().unwrap().remove("sealed");
    let m = v.as_object_mut().unwrap();
    m.remove("mac");
    std::fs::write(&path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let out = run_own_netns(&e, "own-old", "restore", "own", &[]);
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "restore: preflight",
            "schema_version 5 is not an artifact format this vsnap reads",
        ],
    );
    e.remove("own-old");
    // `auto` sets it aside and captures anew, in the shim's namespace.
    let out = run_own_netns(&e, "own-auto", "auto", "own", &[]);
    assert!(out.ok(), "{out:?}");
    poll(
        Duration::from_secs(120),
        "a capture of own in the current format",
        || {
            std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .is_some_and(|v| v["schema_version"] == vsnap_artifact::SCHEMA_VERSION)
        },
    );
    assert!(
        e.artifacts.join(".quarantine").join("own").exists(),
        "set aside"
    );
    e.c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "own-auto"]);
    e.wait_stopped("own-auto");
    e.remove("own-auto");
    e.assert_nothing_left();
}
