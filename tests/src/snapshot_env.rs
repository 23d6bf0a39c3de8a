//! A private containerd set up for the snapshot plans: a runtime config with
//! an artifact root, the reference engine's root filesystem, `ctr run` with a
//! plan, and the checks that a plan left nothing behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cmd::CmdOutput;
use crate::containerd::{list, Containerd, NAMESPACE};
use crate::engine::{answer, engine_rootfs};

pub const RT: &str = "io.vsnap.v1";
pub const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Once upon a time",
    "vsnap restores",
];

pub struct Env {
    pub c: Containerd,
    pub rootfs: String,
    pub config: String,
    pub artifacts: PathBuf,
}

/// A private containerd whose runtime config puts artifacts under its folder.
pub fn setup(tag: &str) -> Env {
    setup_on(Containerd::start(tag))
}

/// As [`setup`], on an instance already started (one with CRI, say): the
/// runtime config is `<dir>/vsnap.toml`, artifacts go to `<dir>/artifacts`.
pub fn setup_on(c: Containerd) -> Env {
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

/// Polls `done` every 50 ms until it holds; panics with `what` at `timeout`.
pub fn poll(timeout: Duration, what: &str, done: impl FnMut() -> bool) {
    poll_every(Duration::from_millis(50), timeout, what, done)
}

/// Polls `done` every `interval` (short, to catch a brief moment) until it
/// holds; panics with `what` at `timeout`.
pub fn poll_every(
    interval: Duration,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(interval);
    }
}

impl Env {
    /// `ctr run -d` of the engine with a plan; returns ctr's result.
    pub fn run(
        &self,
        id: &str,
        plan: &str,
        artifact: &str,
        port: u16,
        extra: &[&str],
    ) -> CmdOutput {
        self.run_args(id, plan, artifact, port, extra, &[])
    }

    /// As [`Env::run`], with arguments for the engine.
    pub fn run_args(
        &self,
        id: &str,
        plan: &str,
        artifact: &str,
        port: u16,
        extra: &[&str],
        engine_args: &[&str],
    ) -> CmdOutput {
        let cmd = self.run_command(id, plan, artifact, port, extra, engine_args);
        crate::cmd::run(cmd, None, Duration::from_secs(180))
    }

    /// The `ctr run -d` command of [`Env::run_args`], to run elsewhere (a
    /// thread that waits while the test acts on the shim).
    pub fn run_command(
        &self,
        id: &str,
        plan: &str,
        artifact: &str,
        port: u16,
        extra: &[&str],
        engine_args: &[&str],
    ) -> std::process::Command {
        let mut argv = vec!["/vsnap-ref-engine"];
        argv.extend_from_slice(engine_args);
        self.plan_command(
            id,
            plan,
            artifact,
            port,
            extra,
            &["--rootfs", &self.rootfs],
            &argv,
        )
    }

    /// `ctr run -d --net-host` of `argv` as `id` under vsnap with a plan
    /// (`vsnap.io/plan`, `vsnap.io/artifact`, `vsnap.io/listen` on
    /// 127.0.0.1:`port`), then `extra`, then `workload`: an image reference,
    /// or `--rootfs DIR`.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_command(
        &self,
        id: &str,
        plan: &str,
        artifact: &str,
        port: u16,
        extra: &[&str],
        workload: &[&str],
        argv: &[&str],
    ) -> std::process::Command {
        let mut args = self.plan_args(plan, artifact, port, true);
        args.extend(extra.iter().chain(workload).map(|a| a.to_string()));
        self.plan_run(id, args, argv)
    }

    /// `ctr run -d`'s arguments for a plan: the runtime, its config and the
    /// plan's annotations (listening on 127.0.0.1:`port`); with `net_host`,
    /// the host's network namespace, else one of the container's own.
    pub fn plan_args(&self, plan: &str, artifact: &str, port: u16, net_host: bool) -> Vec<String> {
        let mut args: Vec<String> = vec!["run".into(), "-d".into()];
        if net_host {
            args.push("--net-host".into());
        }
        for a in [
            "--runtime",
            RT,
            "--runtime-config-path",
            &self.config,
            "--annotation",
            &format!("vsnap.io/plan={plan}"),
            "--annotation",
            &format!("vsnap.io/artifact={artifact}"),
            "--annotation",
            &format!("vsnap.io/listen=127.0.0.1:{port}"),
        ] {
            args.push(a.to_string());
        }
        args
    }

    /// The `ctr` command of `args` (from [`Env::plan_args`], with the
    /// workload) for container `id` running `argv`.
    pub fn plan_run(
        &self,
        id: &str,
        mut args: Vec<String>,
        argv: &[&str],
    ) -> std::process::Command {
        crate::ids::claim(id);
        args.push(id.to_string());
        args.extend(argv.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.c.ctr_command(&args)
    }

    /// Creates a good artifact `name` from container `id` and removes the
    /// donor; returns the manifest. With `after-capture=exit` the donor is
    /// never activated, so switches aimed at the recovery phases act only on
    /// restored copies (which must be run with the same `env`).
    pub fn create_good(&self, id: &str, name: &str, env: &[&str]) -> Vec<u8> {
        let mut extra = vec!["--annotation", "vsnap.io/after-capture=exit"];
        for kv in env {
            extra.extend_from_slice(&["--env", kv]);
        }
        let out = self.run(id, "create", name, crate::engine::free_port(), &extra);
        assert!(out.ok(), "{out:?}");
        self.wait_manifest(name);
        // The donor is stopped (SIGTERM, exit 0) once the artifact is published.
        self.wait_stopped(id);
        let deleted = self.remove(id);
        assert!(
            !deleted.contains("non-zero"),
            "{id} exits cleanly after capture: {deleted}"
        );
        std::fs::read(self.manifest(name)).unwrap()
    }

    /// Gives the shared root filesystem the mount points `ctr --net-host`
    /// binds (`/etc/hosts`, `/etc/resolv.conf`), for restores started at
    /// once from this one folder: where they are missing, runc makes them
    /// around its restore, and one restore of the folder failed its bind
    /// ("mount /etc/hosts:/etc/hosts ...: no such file or directory") while
    /// seven others restored from it. A snapshotter gives each container a
    /// root of its own; before the capture, so the copies see what it saw.
    pub fn mount_points_in_rootfs(&self) {
        let etc = Path::new(&self.rootfs).join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        for f in ["hosts", "resolv.conf"] {
            if !etc.join(f).exists() {
                std::fs::write(etc.join(f), "").unwrap();
            }
        }
    }

    /// The node's `tool` (runc or CRIU) upgraded: the runtime config's
    /// `key` now names the same binary behind a wrapper whose `--version`
    /// prints `version` instead (a host whose fingerprint changed).
    pub fn upgrade(&self, tool: &str, key: &str, version: &str) {
        let real = crate::cmd::which(tool);
        let wrapper = self.c.dir.join(format!("{tool}-upgraded"));
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nif [ \"$1\" = \"--version\" ]; then printf '%s\\n' '{version}'; exit 0; fi\nexec {} \"$@\"\n",
                real.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        self.prepend_config(&format!("{key} = \"{}\"\n", wrapper.display()));
    }

    /// Puts top-level keys first in the runtime config: a key after a
    /// `[table]` header would be the table's.
    pub fn prepend_config(&self, lines: &str) {
        let config = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(&self.config, format!("{lines}{config}")).unwrap();
    }

    /// A copy of the runtime config with `lines` first, as `<tag>.toml` in
    /// this instance's folder: its path.
    pub fn config_variant(&self, tag: &str, lines: &str) -> String {
        let path = self.c.dir.join(format!("{tag}.toml"));
        let config = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(&path, format!("{lines}{config}")).unwrap();
        path.display().to_string()
    }

    /// Lets the runtime config reach the registry `host` over plain HTTP
    /// (a loopback registry); once per host.
    pub fn allow_registry(&self, host: &str) {
        let mut config = std::fs::read_to_string(&self.config).unwrap();
        let table = format!("[registries.\"{host}\"]\n");
        if !config.contains(&table) {
            config.push_str(&format!("{table}plain_http = true\n"));
            std::fs::write(&self.config, config).unwrap();
        }
    }

    /// A fleet signing key pair made with `vsnap key generate` in this
    /// instance's folder: (private, public).
    pub fn fleet_key_pair(&self, tag: &str) -> (String, String) {
        let private = self.c.dir.join(format!("{tag}.key")).display().to_string();
        let public = self.c.dir.join(format!("{tag}.pub")).display().to_string();
        let args = [
            "key",
            "generate",
            "--private",
            &private,
            "--public",
            &public,
        ];
        let out = self.vsnap_configured(&args);
        assert!(out.ok(), "{out:?}");
        (private, public)
    }

    /// A fleet encryption key made with `vsnap key generate-encryption` in
    /// this instance's folder: (path, key id).
    pub fn fleet_encryption_key(&self, tag: &str) -> (String, String) {
        let path = self.c.dir.join(format!("{tag}.key")).display().to_string();
        let out = self.vsnap_configured(&["key", "generate-encryption", &path, "--json"]);
        assert!(out.ok(), "{out:?}");
        let made: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        (path, made["key_id"].as_str().unwrap().to_string())
    }

    /// `vsnap --config <this runtime config> ARGS`.
    pub fn vsnap_configured(&self, args: &[&str]) -> crate::cmd::CmdOutput {
        let bin = crate::containerd::shim_binary().with_file_name("vsnap");
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--config").arg(&self.config).args(args);
        crate::cmd::run(cmd, None, Duration::from_secs(300))
    }

    /// The operator CLI (`vsnap --root <this test's artifact root> ARGS`).
    pub fn vsnap(&self, args: &[&str]) -> crate::cmd::CmdOutput {
        let bin = crate::containerd::shim_binary().with_file_name("vsnap");
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("--root").arg(&self.artifacts).args(args);
        crate::cmd::run(cmd, None, Duration::from_secs(60))
    }

    pub fn artifact(&self, name: &str) -> PathBuf {
        self.artifacts.join(name)
    }

    pub fn manifest(&self, name: &str) -> PathBuf {
        self.artifact(name).join("manifest.json")
    }

    pub fn wait_manifest(&self, name: &str) -> serde_json::Value {
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

    /// The task's status in `ctr task ls` (None: no such task).
    pub fn task_status(&self, id: &str) -> Option<String> {
        self.c.ctr_ok(&["task", "ls"]).lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&id)).then(|| f.last().unwrap_or(&"").to_string())
        })
    }

    /// Waits until the task is not running any more (stopped, or gone).
    pub fn wait_stopped(&self, id: &str) {
        poll(Duration::from_secs(30), &format!("{id} to stop"), || {
            self.task_status(id)
                .is_none_or(|s| s != "RUNNING" && s != "PAUSED")
        });
    }

    /// Kills a task, deletes it and its container; returns the delete output.
    pub fn remove(&self, id: &str) -> String {
        let _ = self.c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self
            .task_status(id)
            .is_some_and(|s| s != "STOPPED" && s != "CREATED")
        {
            assert!(Instant::now() < deadline, "{id} never stopped");
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = self.c.ctr(&["task", "delete", id]);
        self.c.ctr_ok(&["c", "rm", id]);
        format!("{}{}", out.stdout, out.stderr)
    }

    /// The task's bundle in containerd's state folder.
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.c.bundle_in(NAMESPACE, id)
    }

    /// Waits for a background capture of `id` to fail: the shim's error
    /// record in the bundle, then the task stopped. Returns the record's error.
    pub fn wait_capture_failed(&self, id: &str) -> String {
        let record = self.bundle(id).join("vsnap-error.json");
        poll(
            Duration::from_secs(120),
            &format!("{}: {}", record.display(), self.c.log_tail()),
            || record.exists(),
        );
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(v["container"], id, "{v}");
        self.wait_stopped(id);
        v["error"].as_str().expect("an error string").to_string()
    }

    /// Runs a `create` of `id` whose capture must fail (ctr run succeeds,
    /// the capture fails later); returns the error record, after checking
    /// the task's exit `code`.
    pub fn failed_capture(&self, id: &str, name: &str, code: u8, extra: &[&str]) -> String {
        let out = self.run(id, "create", name, crate::engine::free_port(), extra);
        assert!(out.ok(), "create starts, the capture fails later: {out:?}");
        // Read before the task is deleted: the record lives in its bundle.
        let error = self.wait_capture_failed(id);
        eprintln!("{id}: {error}");
        let deleted = self.remove(id);
        assert_eq!(
            exit_code(&deleted),
            Some(code),
            "the task's exit after a failed capture: {deleted}"
        );
        error
    }

    /// A failed capture published nothing: no artifact under the root.
    pub fn assert_nothing_published(&self) {
        assert_eq!(
            self.artifact_names(),
            Vec::<String>::new(),
            "nothing published"
        );
    }

    /// Leftover staging folders under the artifact root.
    pub fn staging_dirs(&self) -> Vec<String> {
        list(&self.artifacts)
            .into_iter()
            .filter(|n| n.starts_with(".staging-"))
            .collect()
    }

    /// The artifacts under the root (hidden folders left out).
    pub fn artifact_names(&self) -> Vec<String> {
        let mut names: Vec<String> = list(&self.artifacts)
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// The cgroups (cgroupfs, v1 or v2) of container `id` that exist.
    pub fn cgroups(&self, id: &str) -> Vec<String> {
        self.c.cgroups(id)
    }

    /// After every container was removed: no shim, no runc container or
    /// state, no bundle, no mount, no control dir, no staging folder.
    ///
    /// containerd removes a dead shim's bundle (renamed to `.<id>`, then
    /// deleted) only after the shim binary's `delete` exited, so the
    /// leftovers are waited for together; what is still there at the
    /// deadline is a leak and named.
    pub fn assert_nothing_left(&self) {
        poll(Duration::from_secs(20), "the shims to exit", || {
            self.c.shim_pids().is_empty()
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut left = self.leftovers();
        while left.iter().any(|(_, l)| !l.is_empty()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            left = self.leftovers();
        }
        for (what, l) in left {
            assert_eq!(l, Vec::<String>::new(), "{what}\n{}", self.c.log_tail());
        }
    }

    /// What of this instance and artifact root should be gone once every
    /// container was removed, by kind.
    fn leftovers(&self) -> [(&'static str, Vec<String>); 6] {
        [
            ("runc", self.c.runc_containers()),
            ("runc state", list(&self.c.runc_root())),
            ("mounts", self.c.mounts()),
            ("bundles", self.c.bundles()),
            ("control dirs", control_dirs(&self.artifacts)),
            ("staging", self.staging_dirs()),
        ]
    }
}

/// Every one of `parts` is in `text` (an error message).
pub fn assert_has(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "{p:?} missing from: {text}");
    }
}

/// The exit code in `ctr task delete`'s output.
pub fn exit_code(deleted: &str) -> Option<u8> {
    let (_, rest) = deleted.split_once("non-zero exit code ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The prompts' answers from an engine listening on `port`.
pub fn answers(port: u16) -> Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> {
    answers_at(([127, 0, 0, 1], port).into())
}

/// [`answers`] from an engine at `addr`.
pub fn answers_at(
    addr: std::net::SocketAddr,
) -> Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> {
    PROMPTS
        .iter()
        .map(|p| answer(&crate::engine::complete_at(addr, p, 8)))
        .collect()
}

pub fn control_dirs(artifacts: &Path) -> Vec<String> {
    list(&artifacts.join(".control"))
}

/// The artifact's largest CRIU image: a memory image (`pages-*.img`)
/// when `pages`, else one of the process tree's own state.
pub fn largest_image(artifact: &Path, pages: bool) -> PathBuf {
    let images = artifact.join("images");
    crate::containerd::list(&images)
        .into_iter()
        .filter(|n| n.ends_with(".img") && n.starts_with("pages-") == pages)
        .max_by_key(|n| std::fs::metadata(images.join(n)).unwrap().len())
        .map(|n| images.join(n))
        .expect("an image")
}

/// Flips one bit of the byte in the middle of `path`.
pub fn flip_middle_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

/// Cuts the last page (4 KiB) off `path`.
pub fn truncate_a_page(path: &Path) {
    let len = std::fs::metadata(path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(len - 4096).unwrap();
}
