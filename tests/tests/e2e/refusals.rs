//! Restores refused for what they are: another workload, a foreign
//! manifest, a different capability or mount (each named whole), a fleet
//! fingerprint key, a host held to compatibility rather than identity.

use std::time::Duration;

use vsnap_e2e::engine::{free_port, wait_listening};
use vsnap_e2e::snapshot_env::setup;

#[test]
fn a_restore_of_another_workload_or_a_foreign_manifest_is_refused_naming_why() {
    let e = setup("ident");
    let port = free_port();
    assert!(e
        .run("i0", "create", "ident", port, &["--env", "MODEL_REV=1"])
        .ok());
    e.wait_manifest("ident");
    wait_listening(port, Duration::from_secs(60));
    e.remove("i0");

    // Another environment value and another user: both fields are named.
    let out = e.run(
        "i1",
        "restore",
        "ident",
        free_port(),
        &["--env", "MODEL_REV=2", "--user", "1000"],
    );
    assert!(!out.ok(), "{out:?}");
    assert!(
        out.stderr
            .contains("restore: preflight: fingerprint mismatch"),
        "{out:?}"
    );
    assert!(out.stderr.contains("workload.env.MODEL_REV"), "{out:?}");
    assert!(out.stderr.contains("workload.security.user"), "{out:?}");
    assert!(
        !out.stderr.contains("MODEL_REV=2"),
        "values are never shown: {out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "i1"]);

    // A manifest edited by hand (valid JSON, same schema) fails its MAC.
    let manifest = e.manifest("ident");
    let original = std::fs::read(&manifest).unwrap();
    let edited = String::from_utf8(original.clone())
        .unwrap()
        .replace("\"i0\"", "\"i9\"");
    assert_ne!(edited.as_bytes(), &original[..]);
    std::fs::write(&manifest, edited).unwrap();
    let out = e.run(
        "i2",
        "restore",
        "ident",
        free_port(),
        &["--env", "MODEL_REV=1"],
    );
    assert!(
        !out.ok() && out.stderr.contains("MAC does not verify"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "i2"]);
    std::fs::write(&manifest, &original).unwrap();

    // Another host's key: the same manifest no longer verifies.
    let key = e.artifacts.join(".host-key");
    let ours = std::fs::read(&key).unwrap();
    std::fs::write(&key, [7u8; 32]).unwrap();
    let out = e.run(
        "i3",
        "restore",
        "ident",
        free_port(),
        &["--env", "MODEL_REV=1"],
    );
    assert!(
        !out.ok() && out.stderr.contains("MAC does not verify"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "i3"]);
    std::fs::write(&key, ours).unwrap();

    // Restored as captured, it works.
    let port = free_port();
    let out = e.run("i4", "restore", "ident", port, &["--env", "MODEL_REV=1"]);
    assert!(out.ok(), "{out:?}");
    e.remove("i4");
}

#[test]
fn a_refused_restore_names_each_capability_and_mount_that_differ_whole() {
    let e = setup("refusal");
    let mount = |dir: &str, options: &str| {
        let src = e.c.dir.join(dir);
        std::fs::create_dir_all(&src).unwrap();
        format!(
            "type=bind,src={},dst=/data,options={options}",
            src.display()
        )
    };
    let captured = mount("data", "rbind:rw");
    let port = free_port();
    assert!(e
        .run("rf0", "create", "refusal", port, &["--mount", &captured])
        .ok());
    e.wait_manifest("refusal");
    wait_listening(port, Duration::from_secs(60));
    e.remove("rf0");

    // One more capability, one fewer, /data read-only and a volume at a
    // path long enough that a cut would hide it: each named, whole.
    let long = format!("/models/{}", "qwen3-30b-a3b-instruct-2507-fp8-".repeat(6));
    let read_only = mount("data", "rbind:ro");
    let added = format!(
        "type=bind,src={},dst={long},options=rbind:ro",
        e.c.dir.join("data").display()
    );
    let out = e.run(
        "rf1",
        "restore",
        "refusal",
        free_port(),
        &[
            "--cap-add",
            "CAP_NET_ADMIN",
            "--cap-drop",
            "CAP_KILL",
            "--mount",
            &read_only,
            "--mount",
            &added,
        ],
    );
    assert!(!out.ok(), "{out:?}");
    eprintln!("rf1: {}", out.stderr);
    for named in [
        "restore: preflight: fingerprint mismatch: ",
        "workload.security.capabilities.bounding: live adds CAP_NET_ADMIN and drops CAP_KILL",
        "workload.security.capabilities.effective: live adds CAP_NET_ADMIN and drops CAP_KILL",
        "workload.security.capabilities.permitted: live adds CAP_NET_ADMIN and drops CAP_KILL",
        "workload.security.mounts: /data: rw -> ro",
        &format!("workload.security.mounts: live adds {long} (options [rbind, ro], type bind)"),
    ] {
        assert!(out.stderr.contains(named), "{named}: {out:?}");
    }
    let _ = e.c.ctr(&["c", "rm", "rf1"]);

    // The same spec from another host folder: a bind's source is not
    // identity, and the restore runs.
    let port = free_port();
    let elsewhere = mount("elsewhere", "rbind:rw");
    let out = e.run("rf2", "restore", "refusal", port, &["--mount", &elsewhere]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("rf2");
}

#[test]
fn a_fleet_fingerprint_key_keys_the_workload_at_create_and_restore() {
    let e = setup("fleetkey");
    let key = e.c.dir.join("fleet-fingerprint.key");
    vsnap_artifact::layout::write_synced(&key, &[42u8; 32]).unwrap();
    let host_only = std::fs::read_to_string(&e.config).unwrap();
    let with_key = format!("{host_only}fleet_fingerprint_key = \"{}\"\n", key.display());
    std::fs::write(&e.config, &with_key).unwrap();
    let manifest = e.create_good("fk0", "fleet", &["MODEL_REV=1"]);
    let manifest: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    // Keyed with the fleet's key (as every host of the fleet keys it), and
    // the manifest says so.
    let fleet = vsnap_artifact::FingerprintKey::fleet(&key).unwrap();
    assert_eq!(manifest["workload"]["fingerprint_key"], fleet.id());
    assert_eq!(
        manifest["workload"]["env"]["MODEL_REV"],
        vsnap_artifact::fingerprint::env_fingerprint(&fleet, "MODEL_REV", "1")
    );

    // Restored with the key: the shim and the fingerprint hook (given the
    // key by the shim) both key the live workload alike.
    let port = free_port();
    let out = e.run("fk1", "restore", "fleet", port, &["--env", "MODEL_REV=1"]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("fk1");

    // Without it, the key is named, not the environment.
    std::fs::write(&e.config, &host_only).unwrap();
    let out = e.run(
        "fk2",
        "restore",
        "fleet",
        free_port(),
        &["--env", "MODEL_REV=1"],
    );
    assert!(!out.ok(), "{out:?}");
    assert!(
        out.stderr.contains(&format!(
            "restore: preflight: fingerprint mismatch: workload.fingerprint_key: captured \"{}\", live \"host\"",
            fleet.id()
        )),
        "{out:?}"
    );
    assert!(!out.stderr.contains("workload.env"), "{out:?}");
    let _ = e.c.ctr(&["c", "rm", "fk2"]);
}

#[test]
fn a_restore_holds_the_host_to_compatibility_not_identity() {
    let e = setup("compat");
    e.create_good("hc0", "moved", &["MODEL_REV=1"]);
    let path = e.manifest("moved");
    let original = std::fs::read(&path).unwrap();
    let key = vsnap_artifact::HostKey::load(&e.artifacts).unwrap();
    // As if captured on another machine of the same kind (re-sealed here,
    // as a verified pull does): restored, by the shim and by the hook.
    let reseal = |edit: &dyn Fn(&mut vsnap_artifact::Manifest)| {
        let mut m = vsnap_artifact::Manifest::parse(&original, &path).unwrap();
        edit(&mut m);
        m.seal(&key);
        std::fs::write(&path, m.to_bytes()).unwrap();
    };
    reseal(&|m| {
        m.host.machine_id = "another-machine".into();
        m.host.criu_sha256 = "0".repeat(64);
    });
    let out = e.run(
        "hc1",
        "restore",
        "moved",
        free_port(),
        &["--env", "MODEL_REV=1"],
    );
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("hc1");
    // Another kernel series, or a CPU without a captured flag: refused, named.
    reseal(&|m| {
        m.host.kernel_release = "3.10.0-elsewhere".into();
        m.host.cpu_flags.push("not-a-flag-here".into());
    });
    let out = e.run(
        "hc2",
        "restore",
        "moved",
        free_port(),
        &["--env", "MODEL_REV=1"],
    );
    assert!(!out.ok(), "{out:?}");
    assert!(
        out.stderr.contains(
            "restore: preflight: fingerprint mismatch: host.kernel_release: captured \"3.10.0-elsewhere\", live "
        ),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains("host.cpu_flags: captured with \"not-a-flag-here\", live lacks them"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("machine_id"), "{out:?}");
    let _ = e.c.ctr(&["c", "rm", "hc2"]);
}
