//! `vsnap-hook` as a runtime runs it: the binary, the container state on
//! stdin, the exit code and the one line on stderr. Artifacts are made as the
//! shim makes them (staging, sealed manifest, atomic publish) with small
//! stand-ins for runc, CRIU and the CUDA plugin. Run as root (ownership).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{json, Value};
use vsnap_artifact::{FingerprintKey, Workload};
use vsnap_oci_hooks::CONTROL_MOUNT;

mod support;

use support::{hook, hook_as, spec, Host};

#[test]
fn a_good_artifact_passes_every_check() {
    let h = Host::new(&spec());
    h.fingerprint().passed();
    h.ownership(&[]).passed();
    let control = h.root.join(".control/default-c1");
    std::fs::create_dir_all(&control).unwrap();
    for d in [h.root.join(".control"), control.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    h.ownership(&["--control-dir", control.to_str().unwrap()])
        .passed();
}

#[test]
fn a_manifest_edited_by_hand_or_another_hosts_key_fails_the_mac() {
    let h = Host::new(&spec());
    let original = std::fs::read(h.manifest_path()).unwrap();
    let mut m = h.manifest();
    m["source_container"] = json!("someone-else");
    std::fs::write(h.manifest_path(), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    assert_eq!(
        out.line("fingerprint"),
        format!(
            "vsnap-hook fingerprint: {}: MAC does not verify with this host's key (edited, or made on another host)",
            h.manifest_path().display()
        )
    );
    std::fs::write(h.manifest_path(), &original).unwrap();
    h.fingerprint().passed();
    std::fs::write(h.root.join(".host-key"), [7u8; 32]).unwrap();
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    assert!(out.line("fingerprint").contains("MAC does not verify"));
}

#[test]
fn every_host_field_that_must_match_is_named_and_the_others_accepted() {
    let h = Host::new(&spec());
    let mut original = h.manifest();
    // A GPU artifact, so that the CUDA tools must match too (the live GPUs
    // come from the fake nvidia-smi).
    original["host"]["gpus"] = json!(["NVIDIA H200 GPU-00000000-test 570.124.06"]);
    h.reseal(&original);
    h.fingerprint().passed();
    let fields: Vec<String> = original["host"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(
        fields.len(),
        12,
        "a new host field needs a case: {fields:?}"
    );
    // Another vsnap version is tolerated too: its format is the manifest's
    // schema_version (an upgrade of the shim keeps its artifacts).
    let may_differ = ["machine_id", "runc_sha256", "criu_sha256", "shim_version"];
    for field in fields {
        let mut m = original.clone();
        let live = m["host"][&field].clone();
        let (changed, expected) = match field.as_str() {
            "cpu_flags" => (
                json!(["not-a-flag-here"]),
                "host.cpu_flags: captured with \"not-a-flag-here\", live lacks them".to_string(),
            ),
            "gpus" => (
                json!(["NVIDIA A100 GPU-00000000-test 570.124.06"]),
                "host.gpus: captured [\"NVIDIA A100 570.124.06\"], live [\"NVIDIA H200 570.124.06\"] (model and driver, in order)".to_string(),
            ),
            _ => {
                let changed = json!(format!("changed-{field}"));
                let expected = format!("host.{field}: captured {changed}, live {live}");
                (changed, expected)
            }
        };
        m["host"][&field] = changed;
        h.reseal(&m);
        let out = h.fingerprint();
        if may_differ.contains(&field.as_str()) {
            assert_eq!(out.code, 0, "{field} may differ: {}", out.stderr);
            continue;
        }
        assert_eq!(out.code, 1, "{field}: {}", out.stderr);
        let line = out.line("fingerprint");
        assert!(
            line.ends_with(&format!("made for another host or workload: {expected}")),
            "{field}: {line}"
        );
        assert!(!line.contains("; "), "only {field} differs: {line}");
    }
    // Another kernel of the same series is compatible.
    let mut m = original.clone();
    let release = m["host"]["kernel_release"].as_str().unwrap().to_string();
    m["host"]["kernel_release"] = json!(format!("{release}-patched"));
    h.reseal(&m);
    h.fingerprint().passed();
    h.reseal(&original);
    h.fingerprint().passed();
}

#[test]
fn a_fleet_fingerprint_key_keys_the_live_workload_as_at_capture() {
    let h = Host::new(&spec());
    let key_path = h.tmp.path().join("fleet-fingerprint.key");
    vsnap_artifact::layout::write_synced(&key_path, &[3u8; 32]).unwrap();
    let fleet = FingerprintKey::fleet(&key_path).unwrap();
    let mut m = h.manifest();
    m["workload"] =
        serde_json::to_value(Workload::from_spec(&spec(), CONTROL_MOUNT, &fleet)).unwrap();
    h.reseal(&m);
    let key_arg = key_path.display().to_string();
    h.fingerprint_with(&["--fingerprint-key", &key_arg])
        .passed();
    // Without the fleet's key: the key is named, not every secret.
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    let line = out.line("fingerprint");
    assert!(
        line.contains(&format!(
            "workload.fingerprint_key: captured \"{}\", live \"host\"",
            fleet.id()
        )),
        "{line}"
    );
    assert!(!line.contains("; "), "only the key: {line}");
    let out = h.fingerprint_with(&["--fingerprint-key", "relative.key"]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

#[test]
fn every_workload_field_changed_alone_is_named() {
    let h = Host::new(&spec());
    let original = h.manifest();
    let w = &original["workload"];
    let mut cases: Vec<(Vec<String>, Value)> = vec![
        (vec!["argv".into()], json!(["/engine", "--other"])),
        (vec!["rootfs".into()], json!("/elsewhere")),
        (vec!["image".into()], json!("localhost/other:2")),
    ];
    for map in ["env", "security"] {
        for k in w[map].as_object().unwrap().keys() {
            cases.push((vec![map.into(), k.clone()], json!("0".repeat(64))));
        }
    }
    assert!(
        cases.len() >= 3 + 3 + 11,
        "every env variable and security field"
    );
    for (path, value) in cases {
        let mut m = original.clone();
        let mut slot = &mut m["workload"];
        for p in &path {
            slot = &mut slot[p.as_str()];
        }
        *slot = value;
        h.reseal(&m);
        let out = h.fingerprint();
        assert_eq!(out.code, 1, "{path:?}: {}", out.stderr);
        let line = out.line("fingerprint");
        let field = format!("workload.{}", path.join("."));
        assert!(
            line.contains(&format!(
                "made for another host or workload: {field}: captured "
            )),
            "{line}"
        );
        assert!(line.contains(", live "), "{line}");
        assert!(!line.contains("; "), "only {field} differs: {line}");
    }
    h.reseal(&original);
    h.fingerprint().passed();
}

#[test]
fn a_changed_container_spec_is_named_too() {
    let h = Host::new(&spec());
    let mut live = spec();
    live["process"]["user"] = json!({"uid": 1000, "gid": 0});
    live["process"]["capabilities"]["bounding"] = json!(["CAP_KILL", "CAP_NET_ADMIN"]);
    h.write_spec(&live);
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    // Each named by what differs: the field in the object, the element
    // in the list.
    assert!(
        out.line("fingerprint").ends_with(
            ": workload.security.capabilities.bounding: live adds CAP_NET_ADMIN; workload.security.user.uid: captured 0, live 1000"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn secrets_never_reach_the_manifest_or_the_error() {
    let h = Host::new(&spec());
    let manifest = std::fs::read_to_string(h.manifest_path()).unwrap();
    assert!(!manifest.contains("s3cret"), "{manifest}");
    assert!(!manifest.contains("xyz"), "{manifest}");
    assert!(
        manifest.contains("\"***:"),
        "the value is redacted (a keyed tag): {manifest}"
    );
    // The restored container differs in its argv (secret unchanged, port
    // changed) and in its token: both are named, neither value is shown.
    let mut live = spec();
    live["process"]["args"] = json!(["/engine", "--api-key", "s3cret", "--port", "9000"]);
    live["process"]["env"] = json!(["PATH=/bin", "HF_TOKEN=xyzzy-live", "MODEL_REV=1"]);
    h.write_spec(&live);
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    let line = h.without_paths(out.line("fingerprint"));
    assert!(line.contains("workload.argv: captured "), "{line}");
    assert!(line.contains("workload.env.HF_TOKEN: captured "), "{line}");
    for secret in ["s3cret", "xyz", "xyzzy-live"] {
        assert!(!line.contains(secret), "{secret} shown: {line}");
    }
    // A changed secret changes the identity, still without showing it.
    live["process"]["args"] = json!(["/engine", "--api-key", "n3w", "--port", "8000"]);
    live["process"]["env"] = json!(["PATH=/bin", "HF_TOKEN=xyz", "MODEL_REV=1"]);
    h.write_spec(&live);
    let line = h.without_paths(h.fingerprint().line("fingerprint"));
    assert!(line.contains("workload.argv: captured "), "{line}");
    assert!(!line.contains("n3w") && !line.contains("s3cret"), "{line}");
    // The same with the secret in --api-key=VALUE form.
    live["process"]["args"] = json!(["/engine", "--api-key=s3cret", "--port", "8000"]);
    h.write_spec(&live);
    let line = h.without_paths(h.fingerprint().line("fingerprint"));
    assert!(!line.contains("s3cret"), "{line}");
}

#[test]
fn a_missing_artifact_or_bundle_fails_by_name() {
    let h = Host::new(&spec());
    let root = h.root.display().to_string();
    let out = hook(
        &[
            "fingerprint",
            "--artifact-root",
            &root,
            "--artifact",
            "nope",
        ],
        Some(&h.state()),
    );
    assert_eq!(out.code, 1);
    assert_eq!(
        out.line("fingerprint"),
        format!(
            "vsnap-hook fingerprint: artifact {} does not exist",
            h.root.join("nope").display()
        )
    );
    // No state on stdin: the check cannot know the container (exit 3).
    let out = hook(
        &["fingerprint", "--artifact-root", &root, "--artifact", "a"],
        None,
    );
    assert_eq!(out.code, 3);
    assert!(out
        .line("fingerprint")
        .contains("no container state on stdin"));
    let out = hook(&["fingerprint", "--artifact", "a"], None);
    assert_eq!(out.code, 2);
    assert_eq!(
        out.line("fingerprint"),
        "vsnap-hook fingerprint: --artifact-root is required"
    );
}

#[test]
fn ownership_names_the_unsafe_component() {
    let h = Host::new(&spec());
    std::fs::set_permissions(&h.root, std::fs::Permissions::from_mode(0o770)).unwrap();
    let out = h.ownership(&[]);
    assert_eq!(out.code, 1);
    assert_eq!(
        out.line("ownership"),
        format!(
            "vsnap-hook ownership: {} is group/world-writable (mode 0770)",
            h.root.display()
        )
    );
    std::fs::set_permissions(&h.root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let images = h.root.join("a/images");
    std::os::unix::fs::chown(&images, Some(1000), Some(1000)).unwrap();
    assert_eq!(
        h.ownership(&[]).line("ownership"),
        format!(
            "vsnap-hook ownership: {} is owned by uid 1000, not root",
            images.display()
        )
    );
    std::os::unix::fs::chown(&images, Some(0), Some(0)).unwrap();
    let artifact = h.root.join("a");
    let moved = h.root.join("real-a");
    std::fs::rename(&artifact, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &artifact).unwrap();
    assert_eq!(
        h.ownership(&[]).line("ownership"),
        format!("vsnap-hook ownership: {} is a symlink", artifact.display())
    );
}

#[test]
fn ownership_run_by_a_non_root_uid_accepts_that_uid_only() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mine = tmp.path().join("mine");
    let theirs = tmp.path().join("theirs");
    for (d, uid) in [(&mine, 1000), (&theirs, 1001)] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(d, Some(uid), Some(uid)).unwrap();
    }
    let arg = |p: &Path| p.display().to_string();
    hook_as(
        &["ownership", "--control-dir", &arg(&mine)],
        None,
        Some(1000),
    )
    .passed();
    let out = hook_as(
        &["ownership", "--control-dir", &arg(&theirs)],
        None,
        Some(1000),
    );
    assert_eq!(out.code, 1);
    assert_eq!(
        out.line("ownership"),
        format!(
            "vsnap-hook ownership: {} is owned by uid 1001, not root or uid 1000",
            theirs.display()
        )
    );
}

/// A bundle whose spec runs as `uid`, and a fake sysctl holding `value`.
fn io_uring_case(uid: u32, value: &str) -> (tempfile::TempDir, String, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = spec();
    s["process"]["user"] = json!({"uid": uid, "gid": uid});
    std::fs::write(tmp.path().join("config.json"), s.to_string()).unwrap();
    std::fs::write(tmp.path().join("io_uring_disabled"), format!("{value}\n")).unwrap();
    let state = json!({"ociVersion": "1.0.2", "id": "c1", "status": "creating",
                       "pid": std::process::id(), "bundle": tmp.path()})
    .to_string();
    let args = vec![
        "io-uring".to_string(),
        "--sysctl".into(),
        tmp.path().join("io_uring_disabled").display().to_string(),
        "--group-sysctl".into(),
        tmp.path().join("no-group").display().to_string(),
    ];
    (tmp, state, args)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn io_uring_disabled_must_be_2_for_root_and_at_least_1_for_others() {
    for (uid, value, passes) in [
        (0, "0", false),
        (0, "1", false),
        (0, "2", true),
        (1000, "0", false),
        (1000, "1", true),
        (1000, "2", true),
    ] {
        let (tmp, state, args) = io_uring_case(uid, value);
        let out = hook(&strs(&args), Some(&state));
        if passes {
            out.passed();
            continue;
        }
        assert_eq!(out.code, 1, "uid {uid} at {value}");
        let who = if uid == 0 {
            "runs as root (uid 0,".to_string()
        } else {
            format!("runs as uid {uid} (")
        };
        let need = if uid == 0 {
            "needs 2"
        } else {
            "needs at least 1"
        };
        let line = out.line("io-uring");
        assert!(
            line.starts_with(&format!(
                "vsnap-hook io-uring: kernel.io_uring_disabled is {value} ({}/io_uring_disabled); the container {who}",
                tmp.path().display()
            )),
            "{line}"
        );
        assert!(line.ends_with(need), "{line}");
    }
}

#[test]
fn io_uring_flags_override_the_spec() {
    let (_tmp, state, args) = io_uring_case(1000, "1");
    let mut root = strs(&args);
    root.push("--root-user");
    let out = hook(&root, None);
    assert_eq!(out.code, 1, "--root-user needs 2 and reads no state");
    assert!(out.line("io-uring").contains("(uid 0, --root-user)"));
    let (_tmp0, state0, args0) = io_uring_case(0, "1");
    let mut uid = strs(&args0);
    uid.extend(["--uid", "1000"]);
    hook(&uid, None).passed();
    // The state's pid (this test process) and its children: no io_uring.
    let mut pids = strs(&args);
    pids.push("--pids-of-state");
    hook(&pids, Some(&state)).passed();
    let _ = state0;
}

#[test]
fn the_artifact_can_come_from_the_states_annotation() {
    let h = Host::new(&spec());
    let root = h.root.display().to_string();
    let (runc, criu, plugin) = (
        h.tools.runc.display().to_string(),
        h.tools.criu.display().to_string(),
        h.tools.cuda_plugin.display().to_string(),
    );
    let fingerprint = [
        "fingerprint",
        "--artifact-root",
        &root,
        "--artifact-from-state",
        "--runc",
        &runc,
        "--criu",
        &criu,
        "--cuda-plugin",
        &plugin,
    ];
    let ownership = [
        "ownership",
        "--artifact-root",
        &root,
        "--artifact-from-state",
    ];
    let named = h.state_with(json!({"vsnap.io/artifact": "a", "vsnap.io/plan": "restore"}));
    hook(&fingerprint, Some(&named)).passed();
    hook(&ownership, Some(&named)).passed();
    let out = hook(&fingerprint, Some(&h.state()));
    assert_eq!(out.code, 3);
    assert_eq!(
        out.line("fingerprint"),
        "vsnap-hook fingerprint: the state of container c1 has no vsnap.io/artifact annotation (--artifact-from-state)"
    );
    let path = h.state_with(json!({"vsnap.io/artifact": "../etc"}));
    let out = hook(&ownership, Some(&path));
    assert_eq!(out.code, 2);
    assert!(
        out.line("ownership").contains("paths are refused"),
        "{}",
        out.stderr
    );
}

#[test]
fn recorded_gpus_are_compared_with_nvidia_smi() {
    let h = Host::new(&spec());
    let mut m = h.manifest();
    m["host"]["gpus"] = json!(["NVIDIA H200 GPU-00000000-test 570.124.06"]);
    h.reseal(&m);
    h.fingerprint().passed();
    // Another GPU of the same model and driver (another UUID): compatible.
    std::fs::write(
        h.nvidia_smi(),
        "#!/bin/sh\necho 'NVIDIA H200, GPU-11111111-other, 570.124.06'\n",
    )
    .unwrap();
    h.fingerprint().passed();
    // Another driver: named, without UUIDs.
    std::fs::write(
        h.nvidia_smi(),
        "#!/bin/sh\necho 'NVIDIA H200, GPU-00000000-test, 575.51.03'\n",
    )
    .unwrap();
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    assert!(
        out.line("fingerprint").ends_with(
            "host.gpus: captured [\"NVIDIA H200 570.124.06\"], live [\"NVIDIA H200 575.51.03\"] (model and driver, in order)"
        ),
        "{}",
        out.stderr
    );
    // No driver: named.
    std::fs::write(h.nvidia_smi(), "#!/bin/sh\nexit 9\n").unwrap();
    let out = h.fingerprint();
    assert_eq!(out.code, 1);
    assert!(
        out.line("fingerprint").contains("nvidia-smi --query-gpu"),
        "{}",
        out.stderr
    );
}
