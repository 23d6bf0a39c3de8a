//! The snapshot plans end to end under the private containerd, with the
//! reference engine as the workload and real runc + CRIU underneath.

use std::time::Duration;

use vsnap_e2e::engine::{free_port, wait_listening, HostEngine};
use vsnap_e2e::snapshot_env::{answers, control_dirs, setup};

#[test]
fn create_then_restore_twice_answers_like_a_cold_start() {
    let e = setup("snap");
    let cold = HostEngine::start();
    let reference = answers(cold.port);

    // create: cold start privately, capture, publish, then the donor serves.
    let port = free_port();
    let out = e.run("donor", "create", "ref", port, &[]);
    assert!(out.ok(), "{out:?}");
    let manifest = e.wait_manifest("ref");
    assert_eq!(manifest["name"], "ref");
    assert!(manifest["image_bytes"].as_u64().unwrap() > 0);
    // The operator CLI reads the real artifact without running anything from it.
    let vsnap = |args: &[&str]| {
        let bin = vsnap_e2e::containerd::shim_binary().with_file_name("vsnap");
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--root").arg(&e.artifacts).args(args);
        vsnap_e2e::cmd::run(cmd, None, Duration::from_secs(60))
    };
    let inspect = vsnap(&["inspect", "ref", "--json"]);
    assert_eq!(inspect.code, Some(0), "{inspect:?}");
    let inspected: serde_json::Value = serde_json::from_str(&inspect.stdout).unwrap();
    assert!(
        inspect
            .stdout
            .contains(manifest["capture_id"].as_str().unwrap()),
        "{inspected}"
    );
    let verify = vsnap(&["verify", "ref"]);
    assert_eq!(
        verify.code,
        Some(0),
        "a fresh artifact verifies: {verify:?}"
    );
    assert!(vsnap(&["ls"]).stdout.contains("ref"));
    wait_listening(port, Duration::from_secs(60));
    assert_eq!(
        answers(port),
        reference,
        "the donor answers like a cold start"
    );
    e.remove("donor");

    // restore, twice from the same artifact: Start returns only once the copy
    // validated its canary and listens, so it answers right away.
    for copy in ["copy1", "copy2"] {
        let port = free_port();
        let out = e.run(copy, "restore", "ref", port, &[]);
        assert!(out.ok(), "{copy}: {out:?}\n{}", e.c.log_tail());
        assert_eq!(answers(port), reference, "{copy} answers like a cold start");
        // The default placement: vsnap's page server placed the engine's
        // memory (CRIU in lazy-pages mode), every byte, before it ran.
        let phases: serde_json::Value = serde_json::from_slice(
            &std::fs::read(e.bundle(copy).join("vsnap-restore.json")).unwrap(),
        )
        .unwrap();
        assert!(
            phases["pages_placed_bytes"].as_u64().unwrap_or(0) > 0,
            "{copy}: the page server placed the heap: {phases}"
        );
        assert!(
            phases["page_server_tasks"].as_u64().unwrap_or(0) >= 1,
            "{phases}"
        );
        let exec = e.c.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "x",
            copy,
            "/bin/echo",
            "inside",
        ]);
        assert_eq!(exec.stdout, "inside\n", "{exec:?}");
        let deleted = e.remove(copy);
        assert!(
            deleted.contains("137"),
            "SIGKILL status at delete: {deleted}"
        );
    }
    assert_eq!(
        control_dirs(&e.artifacts),
        Vec::<String>::new(),
        "no control dir left"
    );
}

#[test]
fn auto_creates_first_and_restores_second() {
    let e = setup("auto");
    let port = free_port();
    assert!(e.run("a1", "auto", "auto-ref", port, &[]).ok());
    e.wait_manifest("auto-ref");
    wait_listening(port, Duration::from_secs(60));
    e.remove("a1");
    let port = free_port();
    let out = e.run("a2", "auto", "auto-ref", port, &[]);
    assert!(out.ok(), "{out:?}");
    // A restore is listening when ctr returns; a cold start would not be yet.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "a2 was restored"
    );
    e.remove("a2");
}

#[test]
fn canary_drift_after_restore_fails_start_naming_the_phase() {
    let e = setup("drift");
    let port = free_port();
    // The drift switch acts only on a copy; the donor captures normally.
    assert!(e
        .run(
            "d0",
            "create",
            "drift",
            port,
            &["--env", "VSNAP_ENGINE_CANARY_DRIFT=1"]
        )
        .ok());
    e.wait_manifest("drift");
    wait_listening(port, Duration::from_secs(60));
    e.remove("d0");
    let port = free_port();
    // The same environment as at capture: anything else is another workload.
    let out = e.run(
        "d1",
        "restore",
        "drift",
        port,
        &["--env", "VSNAP_ENGINE_CANARY_DRIFT=1"],
    );
    assert!(
        !out.ok(),
        "a drifting copy must never become visible: {out:?}"
    );
    assert!(out.stderr.contains("restore: activation"), "{out:?}");
    assert!(out.stderr.contains("canary"), "{out:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listens"
    );
    e.remove("d1");
    assert_eq!(
        control_dirs(&e.artifacts),
        Vec::<String>::new(),
        "no control dir left"
    );
    assert!(e.manifest("drift").exists(), "the artifact itself stays");
    // The failure outlives the bundle: counted by artifact and by phase.
    let bin = vsnap_e2e::containerd::shim_binary().with_file_name("vsnap");
    let metrics = || {
        let mut cmd = std::process::Command::new(&bin);
        cmd.arg("--root").arg(&e.artifacts).arg("metrics");
        vsnap_e2e::cmd::run(cmd, None, Duration::from_secs(60)).stdout
    };
    vsnap_e2e::snapshot_env::poll(Duration::from_secs(30), "the failure journaled", || {
        let text = metrics();
        text.contains("vsnap_failures_total{op=\"restore\",phase=\"activation\"} 1")
            && text.contains("vsnap_restores_total{artifact=\"drift\",result=\"failed\"} 1")
    });
}

#[test]
fn bad_annotations_and_missing_artifacts_are_refused_by_name() {
    let e = setup("badann");
    let out = e.run("bad1", "restore", "../../etc", free_port(), &[]);
    assert!(
        !out.ok() && out.stderr.contains("vsnap.io/artifact"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "bad1"]);
    let out = e.run("bad2", "sometimes", "x", free_port(), &[]);
    assert!(!out.ok() && out.stderr.contains("vsnap.io/plan"), "{out:?}");
    let _ = e.c.ctr(&["c", "rm", "bad2"]);
    let out = e.run("b3", "restore", "never-made", free_port(), &[]);
    assert!(
        !out.ok() && out.stderr.contains("never-made") && out.stderr.contains("does not exist"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "b3"]);
    // A typo in a key is refused, naming the key it was probably meant as.
    let typo = ["--annotation", "vsnap.io/activation-timout=5"];
    let out = e.run("b4", "create", "x", free_port(), &typo);
    assert!(
        !out.ok()
            && out.stderr.contains(
                "annotation vsnap.io/activation-timout: unknown vsnap.io/ key (did you mean vsnap.io/activation-timeout?)"
            ),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "b4"]);
    // A listen address that can never be probed is refused before a capture.
    let listen = ["--annotation", "vsnap.io/listen=[::1:8000"];
    let out = e.run("b5", "create", "x", free_port(), &listen);
    assert!(
        !out.ok()
            && out.stderr.contains("vsnap.io/listen")
            && out.stderr.contains("unbalanced brackets"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "b5"]);
    assert!(!e.artifact("x").exists(), "nothing captured");
    assert_eq!(e.c.shim_pids(), Vec::<i32>::new());
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
}

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

#[test]
fn two_creates_of_one_artifact_never_write_it_twice() {
    let e = setup("race");
    let slow = ["--env", "VSNAP_ENGINE_INIT_MS=3000"];
    let (p1, p2) = (free_port(), free_port());
    // Engine arguments say where to listen when it starts without a plan.
    let (a1, a2) = (p1.to_string(), p2.to_string());
    let args1 = ["--host", "127.0.0.1", "--port", a1.as_str()];
    let args2 = ["--host", "127.0.0.1", "--port", a2.as_str()];
    assert!(e.run_args("w1", "create", "race", p1, &slow, &args1).ok());
    let out = e.run_args("w2", "create", "race", p2, &slow, &args2);
    assert!(out.ok(), "the second create still starts: {out:?}");
    // w1 holds the artifact's lock: w2 starts cold, with no control dir and
    // nothing to capture.
    assert_eq!(control_dirs(&e.artifacts), vec!["default-w1".to_string()]);
    wait_listening(p2, Duration::from_secs(60));
    let manifest = e.wait_manifest("race");
    assert_eq!(
        manifest["source_container"], "w1",
        "only w1 wrote the artifact"
    );
    wait_listening(p1, Duration::from_secs(60));
    e.remove("w1");
    e.remove("w2");
}

#[test]
fn auto_without_a_name_keys_the_artifact_by_the_workload() {
    let e = setup("autokey");
    let run = |id: &str, port: u16, rev: &str| {
        let listen = format!("vsnap.io/listen=127.0.0.1:{port}");
        let env = format!("MODEL_REV={rev}");
        e.c.ctr(&[
            "run",
            "-d",
            "--net-host",
            "--runtime",
            "io.vsnap.v1",
            "--runtime-config-path",
            &e.config,
            "--annotation",
            "vsnap.io/plan=auto",
            "--annotation",
            &listen,
            "--env",
            &env,
            "--rootfs",
            &e.rootfs,
            id,
            "/vsnap-ref-engine",
        ])
    };
    let artifacts = || {
        vsnap_e2e::containerd::list(&e.artifacts)
            .into_iter()
            .filter(|n| n.starts_with("auto-"))
            .collect::<Vec<_>>()
    };
    let port = free_port();
    assert!(run("k1", port, "1").ok());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while artifacts().is_empty()
        || !e
            .artifacts
            .join(&artifacts()[0])
            .join("manifest.json")
            .exists()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no auto- artifact published"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_listening(port, Duration::from_secs(60));
    e.remove("k1");
    // The same workload finds its artifact and restores (listening at once).
    let port = free_port();
    assert!(run("k2", port, "1").ok());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "k2 was restored"
    );
    e.remove("k2");
    assert_eq!(artifacts().len(), 1);
    // Another workload gets an artifact of its own.
    let port = free_port();
    assert!(run("k3", port, "2").ok());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while artifacts().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "no second auto- artifact"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_listening(port, Duration::from_secs(60));
    e.remove("k3");
}

#[test]
fn an_unlinked_dev_shm_file_is_carried_in_the_artifact() {
    let e = setup("shm");
    // The engine holds a /dev/shm file it unlinked (as multiprocessing's
    // SharedMemory or a POSIX semaphore do) and checks its bytes at recovery.
    let env = ["--env", "VSNAP_ENGINE_SHM_KB=256"];
    let port = free_port();
    assert!(e.run("s0", "create", "shm", port, &env).ok());
    e.wait_manifest("shm");
    let images = vsnap_e2e::containerd::list(&e.artifacts.join("shm/images"));
    // CRIU carries the unlinked file in the image (a ghost file and its remap).
    assert!(
        images.iter().any(|f| f.starts_with("ghost-file"))
            && images.iter().any(|f| f.starts_with("remap-fpath")),
        "{images:?}"
    );
    wait_listening(port, Duration::from_secs(60));
    e.remove("s0");
    for copy in ["s1", "s2"] {
        let out = e.run(copy, "restore", "shm", free_port(), &env);
        assert!(
            out.ok(),
            "{copy}: the copy recovered the unlinked file: {out:?}"
        );
        e.remove(copy);
    }
}

#[test]
fn dev_shm_files_in_a_host_mounted_dev_shm_are_carried_too() {
    let e = setup("shm-host");
    // /dev/shm bind-mounted from a host folder (Kubernetes: an emptyDir of
    // medium Memory), a fresh empty one for every container. Two engines: one
    // holds an unlinked 4 MiB file (above CRIU's default 1 MiB ghost limit),
    // one a named file (which CRIU leaves to the external mount).
    let mount = |id: &str| {
        let dir = e.c.dir.join(format!("shm-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        format!(
            "type=bind,src={},dst=/dev/shm,options=rbind:rw",
            dir.display()
        )
    };
    for (name, named) in [("unlinked", "0"), ("named", "1")] {
        let named_env = format!("VSNAP_ENGINE_SHM_NAMED={named}");
        let env = [
            "--env",
            "VSNAP_ENGINE_SHM_KB=4096",
            "--env",
            named_env.as_str(),
        ];
        let port = free_port();
        let donor = format!("{name}0");
        let m0 = mount(&donor);
        let mut extra = env.to_vec();
        extra.extend_from_slice(&["--mount", &m0]);
        assert!(e.run(&donor, "create", name, port, &extra).ok());
        e.wait_manifest(name);
        wait_listening(port, Duration::from_secs(60));
        e.remove(&donor);
        for copy in ["1", "2"] {
            let copy = format!("{name}{copy}");
            let m = mount(&copy);
            let mut extra = env.to_vec();
            extra.extend_from_slice(&["--mount", &m]);
            let out = e.run(&copy, "restore", name, free_port(), &extra);
            assert!(out.ok(), "{copy}: {out:?}");
            e.remove(&copy);
        }
    }
    // The named file travelled in the artifact, not through the host folder.
    assert!(e
        .artifacts
        .join("named/dev-shm/vsnap-ref-engine-shm")
        .is_file());
}

/// The slow path kept beside the page server: `page_placement = "criu"`
/// restores with CRIU placing the pages and the verification thread hashing
/// every file, damage still refused before anything runs.
#[test]
fn criu_s_own_page_placement_restores_and_verifies_too() {
    let e = setup("snap-criu-placed");
    let mut config = std::fs::read_to_string(&e.config).unwrap();
    config.push_str("page_placement = \"criu\"\n");
    std::fs::write(&e.config, config).unwrap();
    e.create_good("scp-donor", "cp", &[]);
    let cold = HostEngine::start();
    let reference = answers(cold.port);

    let port = free_port();
    let out = e.run("scp-copy", "restore", "cp", port, &[]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    assert_eq!(
        answers(port),
        reference,
        "the copy answers like a cold start"
    );
    let phases: serde_json::Value = serde_json::from_slice(
        &std::fs::read(e.bundle("scp-copy").join("vsnap-restore.json")).unwrap(),
    )
    .unwrap();
    assert!(
        phases["pages_placed_bytes"].is_null(),
        "no page server: {phases}"
    );
    let conf = std::fs::read_to_string(e.bundle("scp-copy").join("vsnap-criu.conf")).unwrap();
    assert!(conf.ends_with("leave-stopped\n"), "{conf}");
    e.remove("scp-copy");

    // One flipped byte of the memory image: refused by the verification
    // beside CRIU, naming the file; nothing of the copy runs.
    let images = e.artifact("cp").join("images");
    let pages = vsnap_e2e::containerd::list(&images)
        .into_iter()
        .find(|n| n.starts_with("pages-"))
        .expect("a pages image");
    let path = images.join(&pages);
    let original = std::fs::read(&path).unwrap();
    let mut bytes = original.clone();
    bytes[original.len() / 2] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let port = free_port();
    let out = e.run("scp-damaged", "restore", "cp", port, &[]);
    assert!(!out.ok(), "{out:?}");
    vsnap_e2e::snapshot_env::assert_has(
        &out.stderr,
        &["restore: verify: damaged", &format!("images/{pages}")],
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    e.remove("scp-damaged");
    std::fs::write(&path, &original).unwrap();
    e.assert_nothing_left();
}
