//! A node that changes: under `auto`, an artifact this host cannot restore
//! (damaged, or made with another runc) is set aside and the start becomes
//! a create; a restore that fails after CRIU started sets it aside and the
//! same start goes on cold, capturing anew. `restore` stays fail-closed.
//! Issue 33.

use std::path::PathBuf;
use std::time::Duration;

use vsnap_e2e::cri::{container_config, envs, CriEnv, ENGINE_IMAGE, VSNAP};
use vsnap_e2e::engine::{free_port, wait_listening};
use vsnap_e2e::snapshot_env::{
    assert_has, flip_middle_byte, largest_image, poll, setup, truncate_a_page, Env,
};

/// An `auto` start of `name` as container `id` that serves: restored when
/// ctr returns, or cold-started (then capture-ready and published) soon.
fn serve_auto(e: &Env, id: &str, name: &str) -> bool {
    let port = free_port();
    let out = e.run(id, "auto", name, port, &[]);
    assert!(out.ok(), "{id}: {out:?}\n{}", e.c.log_tail());
    let restored = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    wait_listening(port, Duration::from_secs(120));
    restored
}

/// The quarantined copy of `name` and its reason.
fn quarantined(e: &Env, name: &str) -> (PathBuf, serde_json::Value) {
    let dir = e.artifacts.join(".quarantine").join(name);
    let reason = std::fs::read(dir.join("quarantine.json"))
        .unwrap_or_else(|err| panic!("{}: no quarantine.json: {err}", dir.display()));
    (dir, serde_json::from_slice(&reason).unwrap())
}

/// The node's runc upgraded (see [`Env::upgrade`]).
fn upgrade_runc(e: &Env) {
    e.upgrade("runc", "runc_binary", "runc version 1.1.99");
}

/// The first `auto` start publishes `name`; the engine is then removed.
fn published_by_auto(e: &Env, name: &str) -> serde_json::Value {
    assert!(
        !serve_auto(e, &format!("{name}-0"), name),
        "first start is cold"
    );
    let manifest = e.wait_manifest(name);
    e.remove(&format!("{name}-0"));
    manifest
}

/// After a fallback: the old artifact aside with `cause`, a new one
/// published by the start `id`, and the next `auto` start restores it;
/// the metric counts the fallback once.
fn assert_fell_back(e: &Env, id: &str, name: &str, old_mac: &serde_json::Value, cause: &str) {
    let (dir, reason) = quarantined(e, name);
    assert_eq!(reason["cause"], cause, "{reason}");
    assert!(
        dir.join("manifest.json").exists(),
        "kept whole: {}",
        dir.display()
    );
    let fresh = e.wait_manifest(name);
    assert_ne!(&fresh["mac"], old_mac, "a new artifact under the same name");
    e.remove(id);
    assert!(
        serve_auto(e, &format!("{id}-next"), name),
        "the fresh artifact restores"
    );
    e.remove(&format!("{id}-next"));
    let ls = e.vsnap(&["ls"]);
    assert!(ls.ok() && ls.stdout.contains("quarantined"), "{ls:?}");
    let metrics = e.vsnap(&["metrics"]);
    assert_has(
        &metrics.stdout,
        &[&format!(
            "vsnap_auto_fallbacks_total{{artifact=\"{name}\",reason=\"{cause}\"}} 1"
        )],
    );
}

#[test]
fn auto_sets_a_truncated_artifact_aside_and_captures_anew() {
    let e = setup("nc-size");
    let old = published_by_auto(&e, "ncs");
    truncate_a_page(&largest_image(&e.artifact("ncs"), true));
    // `restore` refuses, before CRIU, naming the file.
    let out = e.run("ncs-r", "restore", "ncs", free_port(), &[]);
    assert!(!out.ok(), "{out:?}");
    assert_has(&out.stderr, &["restore: preflight", "pages-"]);
    e.remove("ncs-r");
    // `auto` sets it aside and starts cold, capturing anew.
    assert!(!serve_auto(&e, "ncs-1", "ncs"), "a cold start");
    assert_fell_back(&e, "ncs-1", "ncs", &old["mac"], "damaged");
}

#[test]
fn auto_on_an_upgraded_runc_captures_anew_and_restore_refuses_before_criu() {
    let e = setup("nc-runc");
    let old = published_by_auto(&e, "ncr");
    upgrade_runc(&e);
    let out = e.run("ncr-r", "restore", "ncr", free_port(), &[]);
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &["restore: preflight", "host.runc_version", "1.1.99"],
    );
    e.remove("ncr-r");
    assert!(!serve_auto(&e, "ncr-1", "ncr"), "a cold start");
    assert_fell_back(&e, "ncr-1", "ncr", &old["mac"], "host");
}

/// The start `id`'s record of its fallback: the cause, and how the
/// start went on after its restore failed.
fn went_on(e: &Env, id: &str) -> serde_json::Value {
    let path = e.bundle(id).join("vsnap-fallback.json");
    let record = std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_json::from_slice(&record).unwrap()
}

#[test]
fn a_flipped_byte_found_during_the_restore_is_set_aside_and_the_same_start_goes_on_cold() {
    let e = setup("nc-flip");
    let old = published_by_auto(&e, "ncf");
    flip_middle_byte(&largest_image(&e.artifact("ncf"), true));
    // Found beside CRIU: `restore` fails naming the damage...
    let out = e.run("ncf-r", "restore", "ncf", free_port(), &[]);
    assert!(!out.ok(), "{out:?}");
    assert_has(&out.stderr, &["restore: verify", "does not match"]);
    e.remove("ncf-r");
    // ...and `auto` sets it aside and goes on cold in the same start,
    // capturing anew.
    assert!(!serve_auto(&e, "ncf-1", "ncf"), "a cold start");
    let record = went_on(&e, "ncf-1");
    assert_eq!(record["cause"], "damaged", "{record}");
    assert_eq!(record["start"], "cold, capturing", "{record}");
    assert_fell_back(&e, "ncf-1", "ncf", &old["mac"], "damaged");
    e.assert_nothing_left();
}

/// `manifest.json` of `name` rewritten as the previous vsnap wrote it: the
/// previous artifact format and an older shim, sealed with this host's
/// key. The fixture is made from a fresh capture rather than checked in,
/// because a manifest binds the host it was made on (its key, runc, CRIU,
/// kernel): a format 5 artifact is a format 7 one whose workload names no
/// per-pod variables (every variable compared) and whose manifest records
/// no CRIU options (its dump used what every vsnap used), and its manifest
/// has the other fields.
fn as_made_by_the_previous_vsnap(e: &Env, name: &str) {
    let path = e.manifest(name);
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let previous = vsnap_artifact::READABLE_SCHEMA_VERSIONS[0];
    assert!(previous < vsnap_artifact::SCHEMA_VERSION);
    v["schema_version"] = previous.into();
    let m = v.as_object_mut().unwrap();
    assert!(m.remove("criu").is_some(), "a format 7 record");
    // Captured with `seal_at_rest = false`: a format 6 artifact is in clear.
    assert!(m.remove("sealed").is_none(), "no format 8 sealing");
    v["host"]["shim_version"] = "0.0.1-older".into();
    let mut m: vsnap_artifact::Manifest = serde_json::from_value(v).unwrap();
    m.seal(&vsnap_artifact::HostKey::load(&e.artifacts).unwrap());
    std::fs::write(&path, m.to_bytes()).unwrap();
}

#[test]
fn an_artifact_of_the_previous_format_restores_and_a_future_format_is_set_aside() {
    let e = setup("nc-format");
    // Masked folders stored by CRIU itself, as format 4 and some format 5
    // artifacts have them.
    let mut config = std::fs::read_to_string(&e.config).unwrap();
    config.push_str("external_masks = false\nseal_at_rest = false\n");
    std::fs::write(&e.config, config).unwrap();
    e.create_good("ncv-0", "ncv", &[]);
    // Made by the previous vsnap (a rolling upgrade of the shim): it
    // restores, under `restore` and under `auto`, and stays as it is.
    as_made_by_the_previous_vsnap(&e, "ncv");
    let path = e.manifest("ncv");
    let previous = std::fs::read(&path).unwrap();
    let out = e.run("ncv-1", "restore", "ncv", free_port(), &[]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("ncv-1");
    assert!(serve_auto(&e, "ncv-1a", "ncv"), "auto restores it");
    e.remove("ncv-1a");
    assert_eq!(std::fs::read(&path).unwrap(), previous, "not set aside");
    assert!(!e.artifacts.join(".quarantine").join("ncv").exists());
    // A format this shim does not read: `restore` refuses naming it...
    let mut future: serde_json::Value = serde_json::from_slice(&previous).unwrap();
    future["schema_version"] = (vsnap_artifact::SCHEMA_VERSION + 1).into();
    std::fs::write(&path, serde_json::to_vec(&future).unwrap()).unwrap();
    let out = e.run("ncv-2", "restore", "ncv", free_port(), &[]);
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "restore: preflight",
            "schema_version",
            "is not an artifact format this vsnap reads",
        ],
    );
    e.remove("ncv-2");
    // ...and `auto` sets it aside as a host reason and captures anew.
    assert!(!serve_auto(&e, "ncv-3", "ncv"), "a cold start");
    let (_, reason) = quarantined(&e, "ncv");
    assert_eq!(reason["cause"], "host", "{reason}");
    e.wait_manifest("ncv");
    e.remove("ncv-3");
    assert!(
        serve_auto(&e, "ncv-4", "ncv"),
        "the fresh artifact restores"
    );
    e.remove("ncv-4");
}

/// An `auto` pod of the reference engine listening on `port`.
fn auto_pod(e: &CriEnv, name: &str, port: u16) -> String {
    auto_pod_of(e, "ncc", name, port, &[]).0
}

/// An `auto` pod of artifact `artifact` listening on `port`, and where its
/// engine's log is.
fn auto_pod_of(
    e: &CriEnv,
    artifact: &str,
    name: &str,
    port: u16,
    env: &[(&str, &str)],
) -> (String, PathBuf) {
    let listen = format!("127.0.0.1:{port}");
    let ann = [
        ("vsnap.io/plan", "auto"),
        ("vsnap.io/artifact", artifact),
        ("vsnap.io/listen", listen.as_str()),
    ];
    let config = e.pod_config(name, true, &ann);
    let pod = e.run_pod(&config, VSNAP);
    let mut engine = container_config("engine", ENGINE_IMAGE, &["/vsnap-ref-engine"]);
    engine.envs = envs(env);
    e.run_container(&pod, &config, engine);
    let log = PathBuf::from(&config.log_directory).join("engine.log");
    (pod, log)
}

/// Kubernetes, a restore that fails after CRIU started (a flipped byte
/// found beside CRIU): the pod starts on its first attempt, as a cold
/// start whose output reaches the container's log, and captures anew;
/// the next pod restores.
#[test]
fn a_pod_whose_restore_fails_after_criu_started_starts_cold_on_its_first_attempt() {
    let e = CriEnv::start("nc-cri-cold");
    // A named file in the pod's /dev/shm (a host folder, carried by vsnap):
    // the restore puts it back, and the cold start creates it anew, which
    // fails if the one put back is still there.
    let shm = [
        ("VSNAP_ENGINE_SHM_KB", "64"),
        ("VSNAP_ENGINE_SHM_NAMED", "1"),
    ];
    let port = free_port();
    let (pod, _) = auto_pod_of(&e, "ncp", "first", port, &shm);
    let old = e.wait_manifest("ncp");
    wait_listening(port, Duration::from_secs(120));
    e.remove_pod(&pod);
    flip_middle_byte(&largest_image(&e.artifact("ncp"), true));
    let port = free_port();
    let (pod, log) = auto_pod_of(&e, "ncp", "damaged", port, &shm);
    wait_listening(port, Duration::from_secs(120));
    let (_, reason) = quarantined(&e, "ncp");
    assert_eq!(reason["cause"], "damaged", "{reason}");
    let fresh = e.wait_manifest("ncp");
    assert_ne!(fresh["mac"], old["mac"]);
    // The engine binds, then logs; the line reaches CRI's log file through
    // the shim's and containerd's copies.
    poll(Duration::from_secs(30), "the engine's serving line", || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("vsnap-ref-engine: serving"))
    });
    e.remove_pod(&pod);
    let port = free_port();
    let (pod, _) = auto_pod_of(&e, "ncp", "restored", port, &shm);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "restored: listening when StartContainer returned"
    );
    e.remove_pod(&pod);
    e.assert_nothing_left();
}

/// Kubernetes on a node whose runc changed: the pod with `auto` starts on
/// its first attempt (cold, capturing anew), the next one restores.
#[test]
fn a_pod_with_auto_on_a_node_whose_runc_changed_starts_on_its_first_attempt() {
    let e = CriEnv::start("nc-cri");
    let port = free_port();
    let pod = auto_pod(&e, "first", port);
    let old = e.wait_manifest("ncc");
    wait_listening(port, Duration::from_secs(120));
    e.remove_pod(&pod);
    upgrade_runc(&e);
    let port = free_port();
    let pod = auto_pod(&e, "upgraded", port);
    wait_listening(port, Duration::from_secs(120));
    let (_, reason) = quarantined(&e, "ncc");
    assert_eq!(reason["cause"], "host", "{reason}");
    let fresh = e.wait_manifest("ncc");
    assert_ne!(fresh["mac"], old["mac"]);
    e.remove_pod(&pod);
    let port = free_port();
    let pod = auto_pod(&e, "restored", port);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "restored: listening when StartContainer returned"
    );
    e.remove_pod(&pod);
    e.assert_nothing_left();
}

#[test]
fn a_copy_whose_canary_does_not_match_is_set_aside_and_the_same_start_goes_on_cold() {
    let e = setup("nc-canary");
    // The engine's fault injection: every copy answers its canary wrong.
    let drift = ["--env", "VSNAP_ENGINE_CANARY_DRIFT=1"];
    let run = |id: &str, plan: &str| {
        let port = free_port();
        (e.run(id, plan, "ncd", port, &drift), port)
    };
    let (out, port) = run("ncd-0", "auto");
    assert!(out.ok(), "{out:?}");
    let old = e.wait_manifest("ncd");
    wait_listening(port, Duration::from_secs(120));
    e.remove("ncd-0");
    let (out, _) = run("ncd-r", "restore");
    assert!(!out.ok(), "a drifting copy never becomes visible: {out:?}");
    assert_has(&out.stderr, &["restore: activation", "canary"]);
    e.remove("ncd-r");
    // Under `auto` the same start goes on cold and captures anew.
    let (out, port) = run("ncd-1", "auto");
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    wait_listening(port, Duration::from_secs(120));
    assert_eq!(went_on(&e, "ncd-1")["start"], "cold, capturing");
    let (_, reason) = quarantined(&e, "ncd");
    assert_eq!(reason["cause"], "restore", "{reason}");
    assert_ne!(e.wait_manifest("ncd")["mac"], old["mac"], "captured anew");
    e.remove("ncd-1");
    e.assert_nothing_left();
}

#[test]
fn auto_on_an_upgraded_criu_captures_anew() {
    let e = setup("nc-criu");
    let old = published_by_auto(&e, "ncc2");
    e.upgrade("criu", "criu_binary", "Version: 4.9");
    let out = e.run("ncc2-r", "restore", "ncc2", free_port(), &[]);
    assert!(!out.ok(), "{out:?}");
    assert_has(&out.stderr, &["restore: preflight", "host.criu_version"]);
    e.remove("ncc2-r");
    assert!(!serve_auto(&e, "ncc2-1", "ncc2"), "a cold start");
    assert_fell_back(&e, "ncc2-1", "ncc2", &old["mac"], "host");
}

#[test]
fn a_flipped_byte_in_a_criu_image_is_set_aside_and_the_same_start_goes_on_cold() {
    let e = setup("nc-img");
    let old = published_by_auto(&e, "nci");
    // The largest image that is not memory: the process tree's own state.
    flip_middle_byte(&largest_image(&e.artifact("nci"), false));
    // Found by the verification beside CRIU, or by CRIU itself: either way
    // the artifact is aside and the same start goes on cold.
    assert!(!serve_auto(&e, "nci-1", "nci"), "a cold start");
    let (_, reason) = quarantined(&e, "nci");
    assert!(
        reason["cause"] == "damaged" || reason["cause"] == "restore",
        "{reason}"
    );
    let cause = reason["cause"].as_str().unwrap().to_string();
    assert_fell_back(&e, "nci-1", "nci", &old["mac"], &cause);
    e.assert_nothing_left();
}
