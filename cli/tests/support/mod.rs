//! What the `vsnap` binary's tests share: a temporary artifact root with
//! sealed artifacts built through the vsnap-artifact API, the binary run
//! against it, and small file helpers. Each test file uses part of it.
#![allow(dead_code, unused_imports)]

pub use std::fs;
pub use std::os::unix::fs::{MetadataExt, PermissionsExt};
pub use std::path::{Path, PathBuf};
pub use std::process::{Command, Output};
pub use std::sync::OnceLock;
pub use std::time::{Duration, SystemTime};

pub use serde_json::{json, Value};
pub use time::OffsetDateTime;
pub use vsnap_artifact::layout::bytes_under;
pub use vsnap_artifact::{
    ensure_root, ArtifactLock, Clocks, FingerprintKey, HostIdentity, HostKey, Manifest, Origin,
    Staging, Timings, Tools, Workload, SCHEMA_VERSION,
};
pub use vsnap_protocol::Oracle;

/// Beyond any pid_max (at most 2^22): no process has it.
pub const DEAD_PID: u32 = 4_194_305;

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub config: PathBuf,
}

impl Fixture {
    /// None (the test skips) unless running as root.
    pub fn new() -> Option<Self> {
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

    pub fn vsnap(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_vsnap"))
            .arg("--root")
            .arg(&self.root)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap()
    }

    pub fn json(&self, args: &[&str]) -> (i32, Value) {
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
    pub fn make(&self, name: &str, age: Duration, image_len: usize) -> Manifest {
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
            zero_pages: Some(vsnap_artifact::ZeroPages::of_pages(5 << 8)),
            criu: None,
            sealed: None,
            mac: String::new(),
        };
        m.seal(&key);
        staging.publish(&self.root, &m.to_bytes()).unwrap();
        m
    }

    pub fn manifest_path(&self, name: &str) -> PathBuf {
        self.root.join(name).join("manifest.json")
    }

    /// Rewrites the manifest in place (mode and owner kept), without resealing.
    pub fn tamper(&self, name: &str) {
        let path = self.manifest_path(name);
        let text = fs::read_to_string(&path).unwrap();
        let edited = text.replace(&format!("src-{name}"), "someone-else");
        assert_ne!(text, edited);
        fs::write(&path, edited).unwrap();
    }

    pub fn exists(&self, name: &str) -> bool {
        self.root.join(name).exists()
    }

    pub fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

/// This host, probed once: hashing runc and CRIU in a debug build is slow.
pub fn host() -> &'static HostIdentity {
    static HOST: OnceLock<HostIdentity> = OnceLock::new();
    HOST.get_or_init(|| HostIdentity::probe(&Tools::default(), env!("CARGO_PKG_VERSION")))
}

pub fn write_private(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn set_mtime(path: &Path, ago: Duration) {
    fs::File::open(path)
        .unwrap()
        .set_modified(SystemTime::now() - ago)
        .unwrap();
}

pub const DAY: Duration = Duration::from_secs(86_400);
