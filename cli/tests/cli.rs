//! The `vsnap` binary against real artifact folders built with the
//! vsnap-artifact API (staging, sealed manifest, atomic publish) under a
//! temporary root. The artifact checks demand a root-owned path, so these
//! tests run as root (as CI does) and skip themselves otherwise.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use time::OffsetDateTime;
use vsnap_artifact::layout::bytes_under;
use vsnap_artifact::{
    ensure_root, ArtifactLock, Clocks, FingerprintKey, HostIdentity, HostKey, Manifest, Origin,
    Staging, Timings, Tools, Workload, SCHEMA_VERSION,
};
use vsnap_protocol::Oracle;

/// Beyond any pid_max (at most 2^22): no process has it.
const DEAD_PID: u32 = 4_194_305;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

impl Fixture {
    /// None (the test skips) unless running as root.
    fn new() -> Option<Self> {
        if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
            // A missing prerequisite is a failure, never a silent skip.
            panic!("the CLI tests need root: the artifact checks need a root-owned path");
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("artifacts");
        ensure_root(&root).unwrap();
        // An empty runtime config: the defaults, whatever /etc/vsnap holds.
        let config = dir.path().join("config.toml");
        fs::write(&config, "").unwrap();
        Some(Fixture {
            _dir: dir,
            root,
            config,
        })
    }

    fn vsnap(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_vsnap"))
            .arg("--root")
            .arg(&self.root)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> (i32, Value) {
        let out = self.vsnap(args);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?}: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap(), v)
    }

    /// Publishes an artifact captured `age` ago with `image_len` image bytes.
    fn make(&self, name: &str, age: Duration, image_len: usize) -> Manifest {
        let key = HostKey::load_or_create(&self.root).unwrap();
        let staging = Staging::new(&self.root, name).unwrap();
        write_private(&staging.images().join("pages-1.img"), &vec![7u8; image_len]);
        write_private(&staging.images().join("inventory.img"), b"inventory");
        write_private(&staging.control().join("capture-ready.json"), b"{}");
        write_private(&staging.work().join("dump.log"), b"log");
        let spec = json!({
            "process": {
                "args": ["/vsnap-ref-engine", "--api-key", "s3cret", "--port", "8000"],
                "env": ["PATH=/bin", "HF_TOKEN=hf_secret"],
            },
            "root": {"path": "/rootfs"},
            "annotations": {"io.containerd.image.name": "example.com/engine:1"},
        });
        let created = OffsetDateTime::now_utc() - age;
        let mut m = Manifest {
            schema_version: SCHEMA_VERSION,
            name: name.to_string(),
            created_at: created
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap(),
            capture_id: format!("cap-{name}"),
            oracle: Oracle {
                sampled_token_logprob: -0.25,
                text: "canary text".into(),
                token_ids: vec![11, 22, 33],
            },
            source_container: format!("src-{name}"),
            image_bytes: bytes_under(&staging.images()),
            contents: vsnap_artifact::content::digest(&staging.dir, 1).unwrap(),
            timings_ms: Timings {
                cold_start_to_capture_ready: 1500,
                inventory: 3,
                checkpoint: 250,
                rootfs: 0,
            },
            host: host().clone(),
            workload: Workload::from_spec(
                &spec,
                "/run/vsnap/control",
                &FingerprintKey::host(HostKey::load(&self.root).unwrap()),
            )
            .with_tenant(&vsnap_artifact::Tenant::parse("k8s.io/team-a").unwrap()),
            clocks: Some(Clocks::now()),
            origin: None,
            rootfs: None,
            memory: Some(vsnap_artifact::Memory {
                pages_bytes: 1024 << 20,
                dev_shm_bytes: (7 << 20) - 100,
            }),
            mac: String::new(),
        };
        m.seal(&key);
        staging.publish(&self.root, &m.to_bytes()).unwrap();
        m
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        self.root.join(name).join("manifest.json")
    }

    /// Rewrites the manifest in place (mode and owner kept), without resealing.
    fn tamper(&self, name: &str) {
        let path = self.manifest_path(name);
        let text = fs::read_to_string(&path).unwrap();
        let edited = text.replace(&format!("src-{name}"), "someone-else");
        assert_ne!(text, edited);
        fs::write(&path, edited).unwrap();
    }

    fn exists(&self, name: &str) -> bool {
        self.root.join(name).exists()
    }

    fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

/// This host, probed once: hashing runc and CRIU in a debug build is slow.
fn host() -> &'static HostIdentity {
    static HOST: OnceLock<HostIdentity> = OnceLock::new();
    HOST.get_or_init(|| HostIdentity::probe(&Tools::default(), env!("CARGO_PKG_VERSION")))
}

fn write_private(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn set_mtime(path: &Path, ago: Duration) {
    fs::File::open(path)
        .unwrap()
        .set_modified(SystemTime::now() - ago)
        .unwrap();
}

const DAY: Duration = Duration::from_secs(86_400);

#[test]
fn inspect_shows_identity_without_secrets_and_the_mac_status() {
    let Some(f) = Fixture::new() else { return };
    let m = f.make("demo", Duration::from_secs(3 * 3600), 4096);

    let out = f.vsnap(&["inspect", "demo"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    for want in [
        "Name:",
        "demo",
        "Capture ID:",
        "cap-demo",
        "src-demo",
        "verified",
        "3h ago",
        "cold start to capture-ready 1500 ms, inventory 3 ms, checkpoint 250 ms",
        "\"canary text\"",
        "[11,22,33]",
        "-0.25",
        "kernel_release:",
        "\"--api-key\",\"***:",
        "HF_TOKEN",
        "PATH",
        "example.com/engine:1",
        "/rootfs",
        "seccomp",
        "owner:",
        "k8s.io/team-a",
        "Memory:",
        "1031 MiB (pages 1024 MiB, /dev/shm 7 MiB)",
    ] {
        assert!(stdout.contains(want), "{want:?} missing:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("({} bytes)", m.image_bytes)),
        "{stdout}"
    );
    assert!(!stdout.contains("s3cret") && !stdout.contains("hf_secret"));

    let (code, v) = f.json(&["inspect", "demo", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["name"], "demo");
    assert_eq!(v["mac"], "verified");
    assert_eq!(v["in_use"], false);
    assert_eq!(v["manifest"]["capture_id"], "cap-demo");
    assert_eq!(v["manifest"]["image_bytes"], m.image_bytes);
    assert_eq!(v["manifest"]["memory"]["pages_bytes"], 1024u64 << 20);
    assert_eq!(
        v["manifest"]["workload"]["env"]["HF_TOKEN"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    assert!(v["disk_bytes"].as_u64().unwrap() > m.image_bytes);
    let back: Manifest = serde_json::from_value(v["manifest"].clone()).unwrap();
    assert_eq!(back, m, "the manifest is shown whole");

    // An edited manifest is still shown, with the MAC failure named.
    f.tamper("demo");
    let out = f.vsnap(&["inspect", "demo"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("FAILS") && stdout.contains("someone-else"),
        "{stdout}"
    );
    let (_, v) = f.json(&["inspect", "demo", "--json"]);
    assert_eq!(v["mac"], "fails");

    // Without the host key nothing can be verified, but it can be inspected.
    fs::remove_file(f.root.join(".host-key")).unwrap();
    let (code, v) = f.json(&["inspect", "demo", "--json"]);
    assert_eq!((code, &v["mac"]), (0, &json!("no-host-key")));
    let (stdout, _) = text(&f.vsnap(&["inspect", "demo"]));
    assert!(stdout.contains("no host key"), "{stdout}");
}

#[test]
fn inspect_shows_where_a_pulled_artifact_came_from() {
    let Some(f) = Fixture::new() else { return };
    f.make("local", Duration::ZERO, 100);
    let (stdout, _) = text(&f.vsnap(&["inspect", "local"]));
    assert!(stdout.contains("Origin:        not pulled"), "{stdout}");
    assert!(stdout.contains("fingerprint key:    \"host\""), "{stdout}");
    let (_, v) = f.json(&["inspect", "local", "--json"]);
    assert!(v["manifest"].get("origin").is_none(), "{v}");

    let mut m = f.make("pulled", Duration::ZERO, 100);
    m.origin = Some(Origin {
        reference: "registry.example/engines/qwen:7b".into(),
        manifest_digest: format!("sha256:{}", "ab".repeat(32)),
        signed_by: Some("ed25519:0123456789abcdef".into()),
        pulled_at: "2026-12-01T10:00:00Z".into(),
    });
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("pulled"), m.to_bytes()).unwrap();
    let out = f.vsnap(&["inspect", "pulled"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "pulled from \"registry.example/engines/qwen:7b\" (manifest \"sha256:{}\"), signed by \"ed25519:0123456789abcdef\", at \"2026-12-01T10:00:00Z\"",
            "ab".repeat(32)
        )),
        "{stdout}"
    );
    assert!(stdout.contains("verified"), "{stdout}");
    let (_, v) = f.json(&["inspect", "pulled", "--json"]);
    assert_eq!(
        v["manifest"]["origin"]["signed_by"],
        "ed25519:0123456789abcdef"
    );
}

#[test]
fn inspect_refuses_paths_and_names_missing_artifacts() {
    let Some(f) = Fixture::new() else { return };
    for (args, code, says) in [
        (&["inspect", "nope"][..], 2, "does not exist"),
        (&["inspect", "../etc"], 2, "not an artifact name"),
        (&["verify", ".host-key"], 2, "not an artifact name"),
        (&["verify", "nope"], 2, "does not exist"),
    ] {
        let out = f.vsnap(args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn verify_passes_for_a_fresh_artifact() {
    let Some(f) = Fixture::new() else { return };
    f.make("good", Duration::ZERO, 1000);
    let out = f.vsnap(&["verify", "good"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("good: valid"), "{stdout}");
    let (code, v) = f.json(&["verify", "good", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["valid"], true);
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["status"], "ok", "{c}");
            c["check"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        checks,
        ["layout", "files", "manifest", "mac", "contents", "host", "clocks"]
    );
}

#[test]
fn inspect_shows_the_capture_clocks_and_verify_holds_this_hosts_to_them() {
    let Some(f) = Fixture::new() else { return };
    let mut m = f.make("clocked", Duration::ZERO, 100);
    let captured = m.clocks.clone().unwrap();
    let (stdout, _) = text(&f.vsnap(&["inspect", "clocked"]));
    assert!(
        stdout.contains(&format!(
            "Clocks:        boot id \"{}\", CLOCK_MONOTONIC ",
            captured.boot_id
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("(the capturing host's, right before the dump)"),
        "{stdout}"
    );
    let (_, v) = f.json(&["inspect", "clocked", "--json"]);
    assert_eq!(
        v["manifest"]["clocks"]["boot_id"],
        captured.boot_id.as_str()
    );
    let (code, v) = f.json(&["verify", "clocked", "--json"]);
    assert_eq!(code, 0, "{v}");
    let check = |v: &Value| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "clocks")
            .cloned()
            .unwrap()
    };
    assert_eq!(
        check(&v)["detail"],
        "this host's clocks are ahead of the capture's"
    );

    // Captured on a host up 10^6 s longer than this one: this kernel has
    // time namespaces, in which CRIU continues the captured clocks.
    m.clocks = Some(Clocks {
        boot_id: "another-boot".into(),
        monotonic_ns: captured.monotonic_ns + 1_000_000_000_000_000,
        boottime_ns: captured.boottime_ns + 1_000_000_000_000_000,
    });
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("clocked"), m.to_bytes()).unwrap();
    let (code, v) = f.json(&["verify", "clocked", "--json"]);
    if vsnap_artifact::clocks::has_time_namespaces() {
        assert_eq!(code, 0, "{v}");
        let detail = check(&v)["detail"].as_str().unwrap().to_string();
        assert!(detail.contains("boot id another-boot"), "{detail}");
        assert!(
            detail.contains("time namespace that continues the captured clocks"),
            "{detail}"
        );
    } else {
        assert_eq!(code, 1, "{v}");
        assert_eq!(check(&v)["status"], "failed");
    }

    // A manifest from before clocks were recorded.
    m.clocks = None;
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("clocked"), m.to_bytes()).unwrap();
    let (stdout, _) = text(&f.vsnap(&["inspect", "clocked"]));
    assert!(
        stdout.contains("Clocks:        - (not recorded"),
        "{stdout}"
    );
    let (code, v) = f.json(&["verify", "clocked", "--json"]);
    assert_eq!(code, 0, "{v}");
}

#[test]
fn verify_fails_an_edited_manifest() {
    let Some(f) = Fixture::new() else { return };
    f.make("edited", Duration::ZERO, 1000);
    f.tamper("edited");
    let out = f.vsnap(&["verify", "edited"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("mac         FAILED: FAILS"), "{stdout}");
    assert!(
        stdout.contains("edited: INVALID (1 check failed)"),
        "{stdout}"
    );
    let (code, v) = f.json(&["verify", "edited", "--json"]);
    assert_eq!((code, &v["valid"]), (1, &json!(false)));
    let mac = &v["checks"][3];
    assert_eq!(
        (&mac["check"], &mac["status"]),
        (&json!("mac"), &json!("failed"))
    );
}

#[test]
fn verify_fails_a_group_writable_artifact_folder() {
    let Some(f) = Fixture::new() else { return };
    f.make("perm", Duration::ZERO, 1000);
    let dir = f.root.join("perm");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
    let out = f.vsnap(&["verify", "perm"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("group/world-writable (mode 0770)"),
        "{stdout}"
    );
    let (_, v) = f.json(&["verify", "perm", "--json"]);
    let status: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        status,
        ["failed", "ok", "skipped", "skipped", "skipped", "skipped", "skipped"],
        "{v}"
    );
    // Inspect names the problem too, and reads nothing through it.
    let out = f.vsnap(&["inspect", "perm"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("group/world-writable"));
}

#[test]
fn verify_fails_changed_images_and_another_host() {
    let Some(f) = Fixture::new() else { return };
    f.make("img", Duration::ZERO, 1000);
    let page = f.root.join("img/images/pages-1.img");
    // One byte flipped: the digests catch it, naming the file and chunk;
    // --quick (sizes only) does not.
    let mut bytes = fs::read(&page).unwrap();
    bytes[500] ^= 1;
    fs::write(&page, &bytes).unwrap();
    let out = f.vsnap(&["verify", "img"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("images/pages-1.img chunk 0 (bytes 0-999) does not match its digest"),
        "{stdout}"
    );
    let out = f.vsnap(&["verify", "--quick", "img"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).0);
    // Truncated: the size tells, with --quick too.
    fs::write(&page, vec![0u8; 10]).unwrap();
    for args in [&["verify", "img"][..], &["verify", "--quick", "img"]] {
        let out = f.vsnap(args);
        let (stdout, _) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        assert!(
            stdout.contains("images/pages-1.img holds 10 bytes, the manifest says 1000"),
            "{stdout}"
        );
    }

    // Sealed with this host's key but recording another kernel.
    f.make("moved", Duration::ZERO, 1000);
    let mut m = Manifest::load_verified(&f.root, "moved").unwrap();
    m.host.kernel_release = "0.0.1-elsewhere".into();
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("moved"), m.to_bytes()).unwrap();
    let out = f.vsnap(&["verify", "moved"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("host.kernel_release: captured \"0.0.1-elsewhere\", live"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("mac ") && l.contains(" ok: verifies")),
        "the MAC verifies: {stdout}"
    );

    // Another machine of a compatible kind: valid, and the difference shown.
    f.make("fleet", Duration::ZERO, 1000);
    let mut m = Manifest::load_verified(&f.root, "fleet").unwrap();
    m.host.machine_id = "another-machine".into();
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("fleet"), m.to_bytes()).unwrap();
    let out = f.vsnap(&["verify", "fleet"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("allowed to differ: host.machine_id: captured \"another-machine\", live"),
        "{stdout}"
    );

    // A world-writable image file is named.
    f.make("loose", Duration::ZERO, 1000);
    let img = f.root.join("loose/images/inventory.img");
    fs::set_permissions(&img, fs::Permissions::from_mode(0o666)).unwrap();
    let out = f.vsnap(&["verify", "loose"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("inventory.img is group/world-writable (mode 0666)"),
        "{stdout}"
    );
}

#[test]
fn ls_shows_ok_invalid_and_in_use() {
    let Some(f) = Fixture::new() else { return };
    f.make("alpha", Duration::ZERO, 2048);
    f.make("beta", Duration::ZERO, 2048);
    f.make("gamma", Duration::ZERO, 2048);
    f.tamper("beta");
    let _reader = ArtifactLock::shared(&f.root, "gamma").unwrap();
    let _writer = Staging::new(&f.root, "delta").unwrap();

    let out = f.vsnap(&["ls"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three artifacts:\n{stdout}");
    let header = lines[0];
    assert!(header.starts_with("NAME     CREATED"), "{stdout}");
    let status_col = header.find("STATUS").unwrap();
    let source_col = header.find("SOURCE").unwrap();
    let size_col = header.find("SIZE").unwrap();
    let status_of = |name: &str| {
        let line = lines.iter().find(|l| l.starts_with(name)).unwrap();
        let source = if name == "beta" { "someone-" } else { "src-" };
        assert!(line[source_col..].starts_with(source), "aligned: {line}");
        assert!(
            line[size_col..].starts_with(|c: char| c.is_ascii_digit()),
            "aligned: {line}"
        );
        line[status_col..].to_string()
    };
    assert_eq!(status_of("alpha"), "ok");
    assert!(
        status_of("beta").starts_with("invalid: beta/manifest.json: MAC does not verify"),
        "{stdout}"
    );
    assert_eq!(status_of("gamma"), "in-use");

    let (code, v) = f.json(&["ls", "--json"]);
    assert_eq!(code, 0);
    let rows = v.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
    assert_eq!(rows[0]["status"], "ok");
    assert_eq!(rows[1]["status"], "invalid");
    assert_eq!(rows[1]["valid"], false);
    assert_eq!(rows[1]["source_container"], "someone-else");
    assert_eq!(
        (&rows[2]["status"], &rows[2]["valid"]),
        (&json!("in-use"), &json!(true))
    );
    assert!(rows[0]["size_bytes"].as_u64().unwrap() > 2048);
    assert_eq!(rows[0]["image_bytes"], 2048 + 9);
}

#[test]
fn ls_never_follows_a_symlinked_entry() {
    let Some(f) = Fixture::new() else { return };
    std::os::unix::fs::symlink("/", f.root.join("evil")).unwrap();
    let (code, v) = f.json(&["ls", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v[0]["name"], "evil");
    assert_eq!(v[0]["size_bytes"], 0, "not walked");
    assert!(
        v[0]["reason"].as_str().unwrap().contains("is a symlink"),
        "{v}"
    );
    let out = f.vsnap(&["verify", "evil"]);
    assert_eq!(out.status.code(), Some(1));
    // Removing it removes the link, nothing behind it.
    assert_eq!(f.vsnap(&["rm", "evil"]).status.code(), Some(0));
    assert!(Path::new("/etc").exists() && !f.exists("evil"));
}

#[test]
fn ls_of_an_empty_or_missing_root_shows_the_header() {
    let Some(f) = Fixture::new() else { return };
    let (stdout, _) = text(&f.vsnap(&["ls"]));
    assert_eq!(stdout, "NAME    CREATED    SIZE    SOURCE    STATUS\n");
    let out = Command::new(env!("CARGO_BIN_EXE_vsnap"))
        .args(["--root", "/nonexistent/vsnap", "--config"])
        .arg(&f.config)
        .args(["ls", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn rm_refuses_an_artifact_in_use_and_removes_otherwise() {
    let Some(f) = Fixture::new() else { return };
    f.make("busy", Duration::ZERO, 100);
    f.make("idle", Duration::ZERO, 100);
    let lock = ArtifactLock::shared(&f.root, "busy").unwrap();
    let out = f.vsnap(&["rm", "busy"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rm busy: in use"), "{stderr}");
    assert!(f.exists("busy"));
    Manifest::load_verified(&f.root, "busy").expect("untouched");

    let out = f.vsnap(&["rm", "idle"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(text(&out).0, "idle\n");
    assert!(!f.exists("idle"));

    drop(lock);
    let (code, v) = f.json(&["rm", "busy", "nope", "--json"]);
    assert_eq!(code, 1, "one was missing");
    assert_eq!(
        v[0],
        json!({"name": "busy", "removed": true, "error": null})
    );
    assert_eq!(v[1]["removed"], false);
    assert_eq!(v[1]["error"], "no such artifact");
    assert!(!f.exists("busy"));
    assert!(
        !f.entries().iter().any(|e| e.starts_with(".trash-")),
        "{:?}",
        f.entries()
    );
    assert!(
        !f.root.join(".locks/nope.lock").exists(),
        "a missing name leaves no lock file"
    );

    let out = f.vsnap(&["rm", "ok-name", "../../etc"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "paths are refused before anything is removed"
    );
}

#[test]
fn gc_by_age_dry_run_first() {
    let Some(f) = Fixture::new() else { return };
    f.make("old", 10 * DAY, 100);
    f.make("old-busy", 9 * DAY, 100);
    f.make("new", DAY, 100);
    let _lock = ArtifactLock::shared(&f.root, "old-busy").unwrap();

    let out = f.vsnap(&["gc", "--older-than", "7d", "--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let old = stdout.lines().find(|l| l.starts_with("old ")).unwrap();
    assert!(
        old.contains("artifact")
            && old.contains("10d")
            && old.contains("older than 7d")
            && old.ends_with("would remove"),
        "{stdout}"
    );
    let busy = stdout.lines().find(|l| l.starts_with("old-busy")).unwrap();
    assert!(busy.ends_with("kept: in use"), "{stdout}");
    assert!(!stdout.contains("new "), "{stdout}");
    assert!(stdout.contains("dry run: nothing removed"), "{stdout}");
    assert!(f.exists("old") && f.exists("old-busy") && f.exists("new"));

    let (code, v) = f.json(&["gc", "--older-than", "7d", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["dry_run"], false);
    let results: Vec<(&str, &str)> = v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a["result"].as_str().unwrap()))
        .collect();
    assert_eq!(results, [("old", "removed"), ("old-busy", "in-use")]);
    assert!(v["actions"][0]["age_seconds"].as_u64().unwrap() >= 10 * 86_400);
    assert!(!f.exists("old") && f.exists("old-busy") && f.exists("new"));
    assert!(!f.entries().iter().any(|e| e.starts_with(".trash-")));
}

#[test]
fn gc_by_size_removes_the_oldest_until_the_total_fits() {
    let Some(f) = Fixture::new() else { return };
    f.make("a3", 3 * DAY, 100 << 10);
    f.make("b2", 2 * DAY, 100 << 10);
    f.make("c1", DAY, 100 << 10);
    // Manifests differ by a byte or two (names, times).
    let size = |name: &str| bytes_under(&f.root.join(name));
    let (a3, b2, c1) = (size("a3"), size("b2"), size("c1"));
    assert!(a3 > 100 << 10 && a3 < 110 << 10, "{a3}");

    // Fits two: the oldest goes.
    let (code, v) = f.json(&["gc", "--max-total-size", "250K", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["actions"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["actions"][0]["name"], "a3");
    assert_eq!(v["total_bytes_before"], a3 + b2 + c1);
    assert_eq!(v["total_bytes_after"], b2 + c1);
    assert!(f.exists("a3"), "a dry run removes nothing");

    let out = f.vsnap(&["gc", "--max-total-size", "250K"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("removed") && stdout.contains("is over 250.0 KiB"),
        "{stdout}"
    );
    assert!(!f.exists("a3") && f.exists("b2") && f.exists("c1"));

    // The newest is in use: what can go goes, and the total still does not fit.
    let _lock = ArtifactLock::shared(&f.root, "c1").unwrap();
    let (code, v) = f.json(&["gc", "--max-total-size", "1K", "--json"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["fits"], false);
    assert_eq!(v["total_bytes_after"], c1);
    assert!(!f.exists("b2") && f.exists("c1"));
}

#[test]
fn gc_removes_stale_leftovers_whose_writer_is_gone() {
    let Some(f) = Fixture::new() else { return };
    let mk = |name: &str, ago: Duration| {
        let dir = f.root.join(name);
        fs::create_dir(&dir).unwrap();
        write_private(&dir.join("pages-1.img"), b"half");
        set_mtime(&dir, ago);
    };
    let hours = |h: u64| Duration::from_secs(h * 3600);
    mk(&format!(".staging-crashed-{DEAD_PID}-0"), hours(2));
    mk(&format!(".trash-gone-{DEAD_PID}-3"), hours(5));
    mk(
        &format!(".staging-recent-{DEAD_PID}-1"),
        Duration::from_secs(600),
    );
    mk(
        &format!(".staging-alive-{}-2", std::process::id()),
        hours(2),
    );
    mk(&format!(".staging-locked-{DEAD_PID}-4"), hours(2));
    mk(".staging-odd", hours(2));
    let _lock = ArtifactLock::exclusive(&f.root, "locked").unwrap();

    let (code, v) = f.json(&["gc", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{v}");
    // The lock says whether a writer lives, not the folder's age or a pid.
    assert_eq!(v["actions"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(
        f.entries().len(),
        7,
        "six leftovers and .locks: {:?}",
        f.entries()
    );

    let out = f.vsnap(&["gc"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(".staging-crashed-{DEAD_PID}-0")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("writer (pid {DEAD_PID}) is gone")),
        "{stdout}"
    );
    let left = f.entries();
    for removed in ["crashed", "gone", "recent", "alive"] {
        assert!(!left.iter().any(|e| e.contains(removed)), "{left:?}");
    }
    for kept in ["locked", "odd"] {
        assert!(left.iter().any(|e| e.contains(kept)), "{kept}: {left:?}");
    }

    let (stdout, _) = text(&f.vsnap(&["gc"]));
    assert!(stdout.starts_with("nothing to remove\n"), "{stdout}");
}

#[test]
fn key_generate_makes_a_fleet_key_pair_and_never_overwrites_one() {
    let Some(f) = Fixture::new() else { return };
    let dir = f.root.parent().unwrap().to_path_buf();
    let (private, public) = (dir.join("fleet.key"), dir.join("fleet.pub"));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vsnap"))
            .args(args)
            .output()
            .unwrap()
    };
    let (p, q) = (private.to_str().unwrap(), public.to_str().unwrap());
    // No config or artifact root is needed to make keys.
    let out = run(&[
        "--config",
        "/nonexistent/vsnap.toml",
        "key",
        "generate",
        "--private",
        p,
        "--public",
        q,
        "--json",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let id = v["key_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ed25519:"), "{v}");
    assert_eq!(
        fs::metadata(&private).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The halves work together through the library's API.
    let signer = vsnap_artifact::FleetSigner::load(&private).unwrap();
    assert_eq!(signer.key_id(), id);
    let trusted = vsnap_artifact::TrustedKeys::load(std::slice::from_ref(&public)).unwrap();
    let sig = signer.sign(b"payload");
    assert_eq!(trusted.verify(b"payload", Some(&sig)).unwrap(), id);

    let before = fs::read(&private).unwrap();
    let out = run(&[
        "key",
        "generate",
        "--private",
        p,
        "--public",
        &format!("{q}.2"),
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("never overwritten"), "{stderr}");
    assert_eq!(fs::read(&private).unwrap(), before);
    let out = run(&["key", "generate", "--private", p]);
    assert_eq!(out.status.code(), Some(2), "--public is required");
}

#[test]
fn gc_removes_kept_criu_logs_older_than_its_age() {
    let Some(f) = Fixture::new() else { return };
    let logs = f.root.join(vsnap_artifact::criu_logs::DIR);
    fs::create_dir_all(&logs).unwrap();
    for (name, ago) in [
        ("old-m-c1-dump.log", 10 * DAY),
        ("new-m-c2-restore.log", DAY),
    ] {
        fs::write(
            logs.join(name),
            b"Error (criu/cr-dump.c:1): Dumping FAILED.\n",
        )
        .unwrap();
        set_mtime(&logs.join(name), ago);
    }
    // Without an age they stay.
    let (code, v) = f.json(&["gc", "--json"]);
    assert_eq!(
        (code, v["actions"].as_array().unwrap().len()),
        (0, 0),
        "{v}"
    );
    let (code, v) = f.json(&["gc", "--older-than", "7d", "--json"]);
    assert_eq!(code, 0, "{v}");
    let a = &v["actions"][0];
    assert_eq!(
        (a["name"].as_str(), a["kind"].as_str(), a["result"].as_str()),
        (
            Some(".criu-logs/old-m-c1-dump.log"),
            Some("criu-log"),
            Some("removed")
        ),
        "{v}"
    );
    assert_eq!(v["actions"].as_array().unwrap().len(), 1, "{v}");
    assert!(!logs.join("old-m-c1-dump.log").exists());
    assert!(logs.join("new-m-c2-restore.log").exists());
}
