//! The snapshot plans end to end under the private containerd, with the
//! reference engine as the workload and real runc + CRIU underneath.

use std::time::Duration;

use vsnap_e2e::engine::{free_port, wait_listening, HostEngine};
use vsnap_e2e::snapshot_env::{answers, control_dirs, poll, setup};

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
    // A shim exits after its Shutdown answered: wait for that.
    poll(
        Duration::from_secs(30),
        "the failed creates' shims to exit",
        || e.c.shim_pids().is_empty(),
    );
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
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
    let options: Vec<&str> = conf
        .lines()
        .filter(|l| !l.starts_with("external "))
        .collect();
    assert_eq!(options.last(), Some(&"leave-stopped"), "{conf}");
    assert!(!options.contains(&"lazy-pages"), "{conf}");
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
