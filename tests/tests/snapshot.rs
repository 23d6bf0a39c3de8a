//! The snapshot plans end to end under the private containerd, with the
//! reference engine as the workload and real runc + CRIU underneath.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vsnap_e2e::engine::{answer, complete, engine_rootfs, free_port, wait_listening, HostEngine};
use vsnap_e2e::Containerd;

const RT: &str = "io.vsnap.v1";
const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Once upon a time",
    "vsnap restores",
];

struct Env {
    c: Containerd,
    rootfs: String,
    config: String,
    artifacts: PathBuf,
}

fn setup(tag: &str) -> Env {
    let c = Containerd::start(tag);
    let rootfs = engine_rootfs(&c.dir).display().to_string();
    let artifacts = c.dir.join("artifacts");
    let config = c.dir.join("vsnap.toml");
    std::fs::write(
        &config,
        format!(
            "artifact_root = \"{}\"\ncapture_timeout_s = 120\nactivation_timeout_s = 60\n",
            artifacts.display()
        ),
    )
    .unwrap();
    Env {
        c,
        rootfs,
        config: config.display().to_string(),
        artifacts,
    }
}

impl Env {
    /// `ctr run -d` of the engine with a plan; returns ctr's result.
    fn run(
        &self,
        id: &str,
        plan: &str,
        artifact: &str,
        port: u16,
        extra: &[&str],
    ) -> vsnap_e2e::CmdOutput {
        let listen = format!("127.0.0.1:{port}");
        let plan = format!("vsnap.io/plan={plan}");
        let artifact = format!("vsnap.io/artifact={artifact}");
        let listen = format!("vsnap.io/listen={listen}");
        let mut args = vec![
            "run",
            "-d",
            "--net-host",
            "--runtime",
            RT,
            "--runtime-config-path",
            &self.config,
            "--annotation",
            &plan,
            "--annotation",
            &artifact,
            "--annotation",
            &listen,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--rootfs", &self.rootfs, id, "/vsnap-ref-engine"]);
        self.c.ctr(&args)
    }

    fn manifest(&self, name: &str) -> PathBuf {
        self.artifacts.join(name).join("manifest.json")
    }

    fn wait_manifest(&self, name: &str) -> serde_json::Value {
        let path = self.manifest(name);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !path.exists() {
            assert!(
                Instant::now() < deadline,
                "no artifact published: {}",
                self.c.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    /// Kills a task, deletes it and its container; returns the delete output.
    fn remove(&self, id: &str) -> String {
        let _ = self.c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self
            .c
            .ctr_ok(&["task", "ls"])
            .lines()
            .any(|l| l.starts_with(id) && !l.contains("STOPPED"))
        {
            assert!(Instant::now() < deadline, "{id} never stopped");
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self.c.ctr(&["task", "delete", id]);
        self.c.ctr_ok(&["c", "rm", id]);
        format!("{}{}", out.stdout, out.stderr)
    }
}

fn answers(port: u16) -> Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> {
    PROMPTS
        .iter()
        .map(|p| answer(&complete(port, p, 8)))
        .collect()
}

fn control_dirs(artifacts: &Path) -> Vec<String> {
    vsnap_e2e::containerd::list(&artifacts.join(".control"))
}

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
    let out = e.run("d1", "restore", "drift", port, &[]);
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
}

#[test]
fn bad_annotations_and_missing_artifacts_are_refused_by_name() {
    let e = setup("badann");
    let out = e.run("b1", "restore", "../../etc", free_port(), &[]);
    assert!(
        !out.ok() && out.stderr.contains("vsnap.io/artifact"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "b1"]);
    let out = e.run("b2", "sometimes", "x", free_port(), &[]);
    assert!(!out.ok() && out.stderr.contains("vsnap.io/plan"), "{out:?}");
    let _ = e.c.ctr(&["c", "rm", "b2"]);
    let out = e.run("b3", "restore", "never-made", free_port(), &[]);
    assert!(
        !out.ok() && out.stderr.contains("never-made") && out.stderr.contains("does not exist"),
        "{out:?}"
    );
    let _ = e.c.ctr(&["c", "rm", "b3"]);
    assert_eq!(e.c.shim_pids(), Vec::<i32>::new());
    assert_eq!(control_dirs(&e.artifacts), Vec::<String>::new());
}
