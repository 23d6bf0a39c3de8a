//! The harness of `vsnap-hook`'s tests: the binary run as a runtime runs
//! it ([`hook`], [`Out`]), and a [`Host`] with an artifact made as the shim
//! makes it and stand-ins for runc, CRIU, the CUDA plugin and nvidia-smi.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use vsnap_artifact::{
    ensure_root, FingerprintKey, HostIdentity, HostKey, Manifest, Staging, Tools, Workload,
};
use vsnap_oci_hooks::fingerprint::SHIM_VERSION;
use vsnap_oci_hooks::CONTROL_MOUNT;
use vsnap_protocol::Oracle;

/// The binary under test.
pub const HOOK: &str = env!("CARGO_BIN_EXE_vsnap-hook");

/// What a run of the hook left: its exit code and its stderr.
pub struct Out {
    pub code: i32,
    pub stderr: String,
}

impl Out {
    /// Exactly one line naming the check.
    pub fn line(&self, check: &str) -> &str {
        let line = self.stderr.strip_suffix('\n').unwrap_or(&self.stderr);
        assert!(!line.contains('\n'), "one line: {:?}", self.stderr);
        assert!(
            line.starts_with(&format!("vsnap-hook {check}: ")),
            "{:?}",
            self.stderr
        );
        line
    }

    pub fn passed(&self) {
        assert_eq!((self.code, self.stderr.as_str()), (0, ""), "should pass");
    }
}

/// The hook run with `args`, `stdin` (if any) on its stdin.
pub fn hook(args: &[&str], stdin: Option<&str>) -> Out {
    hook_as(args, stdin, None)
}

/// [`hook`], run as `uid` (and its gid) when one is given.
pub fn hook_as(args: &[&str], stdin: Option<&str>, uid: Option<u32>) -> Out {
    let mut cmd = Command::new(HOOK);
    cmd.arg0("vsnap-hook")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A host with an artifact root, an artifact `a` captured from `spec`, the
/// bundle of a container about to be restored from it, and tool stand-ins.
pub struct Host {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub bundle: PathBuf,
    pub tools: Tools,
}

/// The spec the artifact `a` is captured from: an engine with secrets in
/// its argv and environment.
pub fn spec() -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "args": ["/engine", "--api-key", "s3cret", "--port", "8000"],
            "env": ["PATH=/bin", "HF_TOKEN=xyz", "MODEL_REV=1"],
            "user": {"uid": 0, "gid": 0},
            "cwd": "/",
            "capabilities": {"bounding": ["CAP_KILL"]},
            "noNewPrivileges": true,
        },
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": {"io.containerd.image.name": "localhost/engine:1"},
        "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]},
    })
}

impl Host {
    pub fn new(captured: &Value) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("vsnap-hook-test")
            .tempdir()
            .unwrap();
        let tools_dir = tmp.path().join("tools");
        std::fs::create_dir(&tools_dir).unwrap();
        for (name, body) in [
            ("runc", "#!/bin/sh\necho 'runc version 1.1.5-test'\n"),
            ("criu", "#!/bin/sh\necho 'Version: 4.2-test'\n"),
            ("cuda_plugin.so", "not really a plugin\n"),
            (
                "nvidia-smi",
                "#!/bin/sh\necho 'NVIDIA H200, GPU-00000000-test, 570.124.06'\n",
            ),
        ] {
            let p = tools_dir.join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let tools = Tools {
            runc: tools_dir.join("runc"),
            criu: tools_dir.join("criu"),
            cuda_plugin: tools_dir.join("cuda_plugin.so"),
            cuda_checkpoint: tools_dir.join("cuda-checkpoint"),
        };
        let root = tmp.path().join("artifacts");
        ensure_root(&root).unwrap();
        let bundle = tmp.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let h = Host {
            tmp,
            root,
            bundle,
            tools,
        };
        h.write_spec(captured);
        h.capture(captured);
        h
    }

    pub fn write_spec(&self, spec: &Value) {
        std::fs::write(self.bundle.join("config.json"), spec.to_string()).unwrap();
    }

    /// Publishes artifact `a` as the shim does after a capture of `spec`.
    pub fn capture(&self, spec: &Value) {
        let key = HostKey::load_or_create(&self.root).unwrap();
        let staging = Staging::new(&self.root, "a").unwrap();
        std::fs::write(staging.images().join("pages-1.img"), b"pages").unwrap();
        let mut m = Manifest {
            schema_version: vsnap_artifact::SCHEMA_VERSION,
            name: "a".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            capture_id: "cap-1".into(),
            oracle: Oracle {
                sampled_token_logprob: -0.5,
                text: " Paris".into(),
                token_ids: vec![1, 2],
            },
            source_container: "donor".into(),
            image_bytes: 5,
            contents: vsnap_artifact::content::digest(&staging.dir, 1).unwrap(),
            timings_ms: Default::default(),
            host: HostIdentity::probe(&self.tools, SHIM_VERSION),
            workload: Workload::from_spec(
                spec,
                CONTROL_MOUNT,
                &FingerprintKey::host(HostKey::load(&self.root).unwrap()),
            ),
            clocks: None,
            origin: None,
            rootfs: None,
            memory: None,
            zero_pages: None,
            criu: None,
            sealed: None,
            mac: String::new(),
        };
        m.seal(&key);
        staging.publish(&self.root, &m.to_bytes()).unwrap();
    }

    pub fn nvidia_smi(&self) -> PathBuf {
        self.tools.runc.with_file_name("nvidia-smi")
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.root.join("a/manifest.json")
    }

    pub fn manifest(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.manifest_path()).unwrap()).unwrap()
    }

    /// Writes `m` as the manifest, sealed with this host's key.
    pub fn reseal(&self, m: &Value) {
        let mut m: Manifest = serde_json::from_value(m.clone()).unwrap();
        m.seal(&HostKey::load(&self.root).unwrap());
        std::fs::write(self.manifest_path(), m.to_bytes()).unwrap();
    }

    pub fn state(&self) -> String {
        self.state_with(json!({}))
    }

    pub fn state_with(&self, annotations: Value) -> String {
        json!({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1,
               "bundle": self.bundle, "annotations": annotations})
        .to_string()
    }

    pub fn fingerprint(&self) -> Out {
        self.fingerprint_with(&[])
    }

    pub fn fingerprint_with(&self, extra: &[&str]) -> Out {
        let root = self.root.display().to_string();
        let (runc, criu, plugin) = (
            self.tools.runc.display().to_string(),
            self.tools.criu.display().to_string(),
            self.tools.cuda_plugin.display().to_string(),
        );
        let smi = self.nvidia_smi().display().to_string();
        let mut args = vec![
            "fingerprint",
            "--artifact-root",
            &root,
            "--artifact",
            "a",
            "--runc",
            &runc,
            "--criu",
            &criu,
            "--cuda-plugin",
            &plugin,
            "--nvidia-smi",
            &smi,
        ];
        args.extend_from_slice(extra);
        hook(&args, Some(&self.state()))
    }

    pub fn ownership(&self, extra: &[&str]) -> Out {
        let root = self.root.display().to_string();
        let mut args = vec!["ownership", "--artifact-root", &root, "--artifact", "a"];
        args.extend_from_slice(extra);
        hook(&args, None)
    }

    /// `s` with this host's temporary paths left out (they are random).
    pub fn without_paths(&self, s: &str) -> String {
        s.replace(&self.tmp.path().display().to_string(), "<tmp>")
    }
}
