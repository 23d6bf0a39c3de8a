//! A private Docker Engine for one test: a dockerd of its own (data root,
//! exec root, pidfile and socket under the test's folder) against the
//! test's private containerd (`--containerd <socket>`), with the vsnap
//! runtime registered in its daemon.json and the host's networking left
//! alone (`--bridge=none`, no iptables: containers run with `--network
//! host` or `none`).
//!
//! Why the private containerd and not dockerd's managed one: the shim is
//! found on that containerd's PATH exactly as in every other test, its
//! bundles, runc root, shims and mounts are the ones [`Containerd`] already
//! checks and cleans up, and the snapshot plans' runtime config and
//! artifact root are [`Env`]'s. Docker's containers live in containerd's
//! `moby` namespace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::cmd::{run, wait_deadline, CmdOutput};
use crate::containerd::{CONTAINERD_BIN, SHIM_NAME};
use crate::snapshot_env::{self, Env};

/// Where `scripts/setup.sh` installs dockerd, docker-proxy and the CLI.
pub const DOCKER_BIN: &str = "/opt/vsnap/docker/bin";
/// The runtime's name in daemon.json (`docker run --runtime vsnap`).
pub const RUNTIME: &str = "vsnap";
/// containerd's namespace for dockerd's containers.
pub const MOBY: &str = "moby";

pub struct Docker {
    child: Option<Child>,
    pub dir: PathBuf,
    /// The private containerd, its runtime config and artifact root.
    pub env: Env,
}

/// The daemon.json of a test dockerd: the vsnap runtime, whose options
/// name the runtime config file (containerd's `runtimeoptions.v1.Options`).
pub fn daemon_json(config: &str) -> serde_json::Value {
    serde_json::json!({
        "runtimes": {
            RUNTIME: {"runtimeType": "io.vsnap.v1", "options": {"ConfigPath": config}}
        }
    })
}

impl Docker {
    /// A private containerd set up for snapshot plans ([`snapshot_env`]) and
    /// a dockerd against it.
    pub fn start(tag: &str) -> Self {
        let env = snapshot_env::setup(tag);
        let dir = env.c.dir.join("docker");
        std::fs::create_dir_all(&dir).unwrap();
        let json = serde_json::to_vec_pretty(&daemon_json(&env.config)).unwrap();
        std::fs::write(dir.join("daemon.json"), json).unwrap();
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        // The shim on PATH as containerd finds it (tests' containerd.rs).
        let path = format!(
            "{}:{CONTAINERD_BIN}:{DOCKER_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            env.c.dir.join("bin").display()
        );
        assert!(env.c.dir.join("bin").join(SHIM_NAME).exists());
        let child = Command::new(format!("{DOCKER_BIN}/dockerd"))
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("--host")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .arg("--containerd")
            .arg(env.c.socket())
            .args(["--bridge=none", "--iptables=false", "--ip6tables=false"])
            .env_clear()
            .env("PATH", path)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start dockerd (run scripts/setup.sh)");
        let d = Docker {
            child: Some(child),
            dir,
            env,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !d.docker(&["version"], None).ok() {
            assert!(
                Instant::now() < deadline,
                "dockerd did not come up: {}",
                d.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        d
    }

    /// The docker CLI against this dockerd.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(format!("{DOCKER_BIN}/docker"));
        cmd.env("DOCKER_CONFIG", self.dir.join("cli"))
            .arg("--host")
            .arg(format!("unix://{}", self.dir.join("docker.sock").display()))
            .args(args);
        cmd
    }

    pub fn docker(&self, args: &[&str], input: Option<&[u8]>) -> CmdOutput {
        run(self.command(args), input, Duration::from_secs(180))
    }

    /// `docker`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.docker(args, None);
        assert!(
            out.ok(),
            "docker {args:?} failed ({:?}): {}{}\n{}",
            out.code,
            out.stdout,
            out.stderr,
            self.log_tail()
        );
        out.stdout
    }

    /// Imports the folder `root` as image `name` (`docker import` of its
    /// tar, PATH=/bin), under `work`.
    pub fn import(&self, work: &Path, root: &Path, name: &str) {
        self.import_with(work, root, name, &["PATH=/bin"]);
    }

    /// As [`Docker::import`], with the image's environment `env`.
    pub fn import_with(&self, work: &Path, root: &Path, name: &str, env: &[&str]) {
        let tar = work.join(format!("{}.tar", name.replace([':', '/'], "_")));
        let out = run(
            {
                let mut c = Command::new("tar");
                c.arg("-C").arg(root).arg("-cf").arg(&tar).arg(".");
                c
            },
            None,
            Duration::from_secs(60),
        );
        assert!(out.ok(), "tar of {}: {out:?}", root.display());
        let changes: Vec<String> = env.iter().map(|kv| format!("ENV {kv}")).collect();
        let mut args = vec!["import"];
        for c in &changes {
            args.extend(["--change", c.as_str()]);
        }
        let tar = tar.display().to_string();
        args.extend([tar.as_str(), name]);
        self.ok(&args);
    }

    /// The container's full id.
    pub fn id(&self, name: &str) -> String {
        self.ok(&["inspect", "--format", "{{.Id}}", name])
            .trim()
            .to_string()
    }

    /// A `docker inspect --format` field of a container.
    pub fn inspect(&self, name: &str, format: &str) -> String {
        self.ok(&["inspect", "--format", format, name])
            .trim()
            .to_string()
    }

    /// The container's task bundle in containerd's state folder.
    pub fn bundle(&self, name: &str) -> PathBuf {
        self.env.c.bundle_in(MOBY, &self.id(name))
    }

    /// runc's state root for dockerd's containers (as the shim derives it).
    pub fn runc_root(&self) -> PathBuf {
        self.env.c.dir.join("state/vsnap-runc").join(MOBY)
    }

    /// After every container was removed: no shim, no runc container, no
    /// bundle in the moby namespace, no control dir, and nothing mounted
    /// under dockerd's overlay2 folder (a restore's remount of a container's
    /// overlay included).
    pub fn assert_nothing_left(&self) {
        let c = &self.env.c;
        crate::snapshot_env::poll(Duration::from_secs(30), "the shims to exit", || {
            c.shim_pids().is_empty()
        });
        assert_eq!(
            crate::containerd::runc_list(&self.runc_root()),
            Vec::<String>::new()
        );
        assert_eq!(
            c.bundles_left_in(MOBY, Duration::from_secs(30)),
            Vec::<String>::new(),
            "bundles"
        );
        assert_eq!(
            crate::snapshot_env::control_dirs(&self.env.artifacts),
            Vec::<String>::new()
        );
        let overlay2 = self.dir.join("data/overlay2").display().to_string();
        let left: Vec<String> = crate::containerd::mount_points()
            .into_iter()
            .filter(|m| m.starts_with(&overlay2))
            .collect();
        assert_eq!(left, Vec::<String>::new(), "overlay mounts");
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        // Every container this dockerd knows, then dockerd by its pid; the
        // containerd (and what is mounted under its folder) goes after.
        let ids = self.docker(&["ps", "-aq"], None).stdout;
        for id in ids.split_whitespace() {
            let _ = self.docker(&["rm", "-f", id], None);
        }
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if wait_deadline(&mut child, Duration::from_secs(20)).is_none() {
                let _ = child.kill();
            }
        }
        for id in crate::containerd::runc_list(&self.runc_root()) {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(self.runc_root())
                .args(["delete", "--force", &id])
                .status();
        }
    }
}
