//! The runtime configuration file (TOML). Unknown keys and bad values are
//! errors that name the key, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::tenants::TenantPolicy;

/// The default artifact root.
pub const DEFAULT_ARTIFACT_ROOT: &str = "/var/lib/vsnap/artifacts";

/// The default folder of the shims' host-wide runtime state.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/vsnap";

/// Read when containerd passes no runtime options and this file exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vsnap/config.toml";

/// Where containerd's registry host configuration (`hosts.toml`) usually
/// lives: what containerd's CRI `config_path` names on most nodes.
pub const DEFAULT_REGISTRY_CONFIG_PATH: &str = "/etc/containerd/certs.d";

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// The runc binary (a name on PATH or an absolute path).
    pub runc_binary: PathBuf,
    /// runc's state root. Unset: derived from containerd's state folder, so
    /// every containerd instance has its own.
    pub runc_root: Option<PathBuf>,
    /// Let runc manage cgroups through systemd.
    pub systemd_cgroup: bool,
    /// Pass `--no-pivot` to runc (rootfs on a ramdisk).
    pub no_pivot_root: bool,
    /// Shim log level: error, warn, info, debug, trace.
    pub log_level: LogLevel,
    /// Where snapshot artifacts live; annotations name artifacts under it.
    pub artifact_root: PathBuf,
    /// CRIU, as runc runs it (on the shim's PATH, or absolute): fingerprinted.
    pub criu_binary: PathBuf,
    /// CRIU's plugin folder holding cuda_plugin.so.
    pub cuda_plugin_dir: PathBuf,
    /// NVIDIA's cuda-checkpoint, which the CUDA plugin runs (its folder is
    /// put first on the PATH runc and CRIU get).
    pub cuda_checkpoint: PathBuf,
    /// The CRIU config runc reads when a spec names none. vsnap gives each
    /// snapshot container its own config (through `org.criu.config`) and
    /// copies this file's options into it, so they are not lost.
    pub criu_config: PathBuf,
    /// Read `vsnap.io/` settings from the container's and its image's labels
    /// (through containerd's API) when the annotations choose no plan.
    pub read_labels: bool,
    /// Require kernel.io_uring_disabled to forbid io_uring for snapshot
    /// containers (2 for root), checked by the io-uring OCI hook. Off by
    /// default: setting the sysctl takes io_uring away from the whole host.
    pub enforce_io_uring_sysctl: bool,
    /// Check every chunk of a restore's artifact against its content digest
    /// before anything runs (sizes are always checked). Off: for benchmarks,
    /// or a store trusted not to rot.
    pub verify_contents: bool,
    /// Let a create replace an artifact of another plain containerd
    /// namespace (a tenant without a Kubernetes namespace: the host's own
    /// operator's). Never across Kubernetes tenants. Off by default.
    pub allow_artifact_replace: bool,
    /// Who may create, whose artifacts a tenant may restore, and where a
    /// tenant's `vsnap.io/artifact-ref` may point (`[tenants]`).
    pub tenants: TenantPolicy,
    /// Default deadline for a cold start to reach capture-ready.
    pub capture_timeout_s: u64,
    /// Default deadline for a restored (or donor) engine to validate and listen.
    pub activation_timeout_s: u64,
    /// The same for a container with GPUs: CRIU's restore, the copy of GPU
    /// memory back to the device and the engine's wake-up.
    pub gpu_activation_timeout_s: u64,
    /// Deadline of `runc checkpoint` (CRIU's dump, the CUDA checkpoint
    /// inside it). Past it runc and CRIU are killed, the tree is thawed and
    /// the capture fails: a hung dump never leaves an engine frozen.
    pub checkpoint_timeout_s: u64,
    /// The most bytes of the container's writable layer a capture carries
    /// into the artifact; a larger layer fails the capture naming its
    /// largest paths (mount caches and scratch space as volumes instead).
    pub rootfs_diff_limit_bytes: u64,
    /// How long a donor stopped after its capture (`after-capture=exit`)
    /// gets at each step (the barrier's abort marker, then SIGTERM) before
    /// the next; past the last, SIGKILL.
    pub donor_stop_grace_s: u64,
    /// Who places a CPU restore's memory: `parallel` (vsnap's page server,
    /// one thread per core, CRIU in lazy-pages mode) or `criu` (CRIU alone,
    /// one thread). GPU restores always use `criu`.
    pub page_placement: PagePlacement,
    /// Where the shims of this host keep what they share (root-only): the
    /// page servers' filler budget (`fillers/`: one slot per core, at most
    /// 8, for every restore of the host together). Every shim of a host
    /// must name the same folder; a test names its own.
    pub runtime_dir: PathBuf,
    /// Restores of one artifact at once share reading and hashing its pages.
    pub share_pages: bool,
    /// Where the page server places memory eligible for huge pages (an
    /// `MADV_HUGEPAGE` VMA, or any under THP `always`) through the kernel's
    /// fault path: `when-free` (only while the host's free 2 MiB blocks
    /// cover it, so no fault waits on reclaim or compaction; the rest is
    /// placed in 4 KiB pages, for khugepaged to collapse later), `always`,
    /// or `never` (4 KiB pages, as CRIU places them).
    pub huge_pages: HugePages,
    /// Refuse a restore, in its preflight before CRIU runs, when the
    /// container's memory limit (or one of its parent cgroups') is below
    /// what the artifact's tree held at capture (its manifest's `memory`).
    /// Off: such a restore is tried, and ends out of memory when the
    /// restored tree does not fit (for a host whose swap takes the rest,
    /// or a need recorded larger than the tree uses now).
    pub memory_preflight: bool,
    /// Leave the all-zero 4 KiB pages of private anonymous memory out of a
    /// capture's page images (holes in CRIU's pagemap, which a restore
    /// leaves unmapped: they read as zeros). Off: every page CRIU dumped
    /// is stored, hashed and placed, as before.
    pub elide_zero_pages: bool,
    /// Keep an artifact's memory images (`images/pages-*.img`) sealed at
    /// rest with this host's key: a capture seals them before it publishes,
    /// a pull as each chunk lands, and the page server opens each piece as
    /// it places it. Off by default: opening every byte made a warm restore
    /// of this project's 2-core machines 0.47-0.57x as fast
    /// (docs/benchmarks.md), far below the 0.9 of the fill limit a restore is
    /// held to; off, they are stored in clear, as before format 8.
    pub seal_at_rest: bool,
    /// At capture, tell CRIU that runc's masked folders under `/proc` and
    /// `/sys` (an empty read-only tmpfs each) are external mounts: not
    /// stored, and bound from the host's one empty read-only tmpfs
    /// (`<runtime_dir>/empty`) at restore instead of unpacked with `tar`.
    /// Off: CRIU stores and unpacks them (an artifact as format 4 made it).
    pub external_masks: bool,
    /// Environment variables each pod or container is given as its own
    /// (`POD_NAME`, `POD_IP`, `POD_UID`, `NODE_NAME` from the downward API,
    /// say), beside `HOSTNAME`, which always is: their values are not part
    /// of the workload's identity, so a copy restores into another pod of
    /// the same Deployment and `auto` names one artifact for all of them. A
    /// pod's `vsnap.io/per-pod-env` annotation adds to this list.
    pub per_pod_env: Vec<String>,
    /// Deadline of the pull a restore with `vsnap.io/artifact-ref` makes
    /// when the artifact is not here (inside the container's create).
    pub pull_timeout_s: u64,
    /// That pull streams: the restore starts once the images CRIU reads
    /// itself are in (its preflight, CRIU and the verification read the
    /// pull's partial tree) and vsnap's page server places the tasks'
    /// memory as its chunks land; the artifact is published after the
    /// restore. Only with `page_placement = "parallel"`. Off: the whole
    /// pull, then the restore.
    pub stream_pulls: bool,
    /// After an `auto` plan with `vsnap.io/artifact-ref` created and
    /// published its artifact, push it to that reference (signed with
    /// `fleet_signing_key`), in the background. Off by default.
    pub push_created: bool,
    /// The fleet's ed25519 private key (`vsnap key generate`), with which
    /// this host signs the artifacts it pushes. Unset: it pushes none.
    pub fleet_signing_key: Option<PathBuf>,
    /// Public keys of the fleet: a pulled artifact (or a restore from a
    /// reference) is used only when one of them signed it.
    pub fleet_trusted_keys: Vec<PathBuf>,
    /// A secret shared by the fleet's hosts (32 random bytes, root-owned
    /// 0600) that keys the workload's environment and secret-flag
    /// fingerprints instead of the host key, so a workload captured on one
    /// host compares equal on another. Unset: the host key, as on one host.
    pub fleet_fingerprint_key: Option<PathBuf>,
    /// The fleet's current encryption key (`vsnap key generate-encryption`:
    /// 32 random bytes, root-owned 0600): what `vsnap push` sends is
    /// encrypted with it, and a pull decrypts with it. Unset: pushes are
    /// sent in clear (with a warning) and encrypted artifacts cannot be
    /// pulled.
    pub fleet_encryption_key: Option<PathBuf>,
    /// Previous fleet encryption keys, kept to decrypt what was pushed
    /// before a rotation; never used to encrypt.
    pub fleet_decryption_keys: Vec<PathBuf>,
    /// OCI registries `vsnap push`/`pull` talk to, by `host[:port]` as a
    /// reference names them: credentials and transport. A registry not
    /// listed is used anonymously over HTTPS.
    pub registries: BTreeMap<String, RegistryConfig>,
    /// containerd's registry host configuration, as its CRI registry's
    /// `config_path` names it: folders separated by `:`, each holding
    /// `<host[:port]>/hosts.toml` (and `_default/hosts.toml`), whose mirrors
    /// serve pulls before the registry itself. Empty: none read.
    pub registry_config_path: String,
    /// The `vsnap` CLI, which the shim runs for registry pulls and pushes
    /// (so their client never sits in every container's shim). A bare
    /// name is looked for beside the shim's binary, then on PATH.
    pub vsnap_cli: PathBuf,
    /// Where this config came from (not a key): a helper the shim runs
    /// reads the same config.
    #[serde(skip)]
    pub source: ConfigSource,
}

/// Where a [`RuntimeConfig`] was read from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ConfigSource {
    /// No file: the defaults.
    #[default]
    Defaults,
    /// A file ([`RuntimeConfig::load`]).
    File(PathBuf),
    /// A body given inline (containerd's `ConfigBody`).
    Body(String),
}

/// One registry's settings (`[registries."host:port"]`). Credentials come
/// only from here, never from a reference or the command line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// User for HTTP basic authentication (with `password_file`).
    pub username: Option<String>,
    /// A root-owned file, not readable by group or others, whose content
    /// (one trailing newline stripped) is the password. Read at each use.
    pub password_file: Option<PathBuf>,
    /// Plain HTTP instead of HTTPS: for a registry on loopback or a
    /// private link only.
    pub plain_http: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PagePlacement {
    #[default]
    Parallel,
    Criu,
}

/// How eligible memory is placed at restore (`huge_pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum HugePages {
    #[default]
    WhenFree,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// As the `log` crate's level filter.
    pub fn filter(self) -> log::LevelFilter {
        match self {
            LogLevel::Error => log::LevelFilter::Error,
            LogLevel::Warn => log::LevelFilter::Warn,
            LogLevel::Info => log::LevelFilter::Info,
            LogLevel::Debug => log::LevelFilter::Debug,
            LogLevel::Trace => log::LevelFilter::Trace,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            runc_binary: PathBuf::from("runc"),
            runc_root: None,
            systemd_cgroup: false,
            no_pivot_root: false,
            log_level: LogLevel::Info,
            artifact_root: PathBuf::from(DEFAULT_ARTIFACT_ROOT),
            criu_binary: PathBuf::from("criu"),
            cuda_plugin_dir: PathBuf::from("/usr/lib/criu"),
            cuda_checkpoint: PathBuf::from("cuda-checkpoint"),
            criu_config: PathBuf::from("/etc/criu/runc.conf"),
            read_labels: true,
            enforce_io_uring_sysctl: false,
            verify_contents: true,
            allow_artifact_replace: false,
            tenants: TenantPolicy::default(),
            capture_timeout_s: 900,
            activation_timeout_s: 120,
            gpu_activation_timeout_s: 600,
            checkpoint_timeout_s: 600,
            rootfs_diff_limit_bytes: 4 << 30,
            donor_stop_grace_s: 10,
            page_placement: PagePlacement::Parallel,
            runtime_dir: PathBuf::from(DEFAULT_RUNTIME_DIR),
            share_pages: true,
            huge_pages: HugePages::WhenFree,
            memory_preflight: true,
            elide_zero_pages: true,
            seal_at_rest: false,
            external_masks: true,
            per_pod_env: Vec::new(),
            pull_timeout_s: 900,
            stream_pulls: true,
            push_created: false,
            fleet_signing_key: None,
            fleet_trusted_keys: Vec::new(),
            fleet_fingerprint_key: None,
            fleet_encryption_key: None,
            fleet_decryption_keys: Vec::new(),
            registries: BTreeMap::new(),
            registry_config_path: DEFAULT_REGISTRY_CONFIG_PATH.to_string(),
            vsnap_cli: PathBuf::from("vsnap"),
            source: ConfigSource::Defaults,
        }
    }
}

/// Each name of `per_pod_env` is a variable's name.
fn check_per_pod_env(names: &[String]) -> Result<(), String> {
    match names
        .iter()
        .find(|n| n.is_empty() || n.contains(['=', ',', ' ']))
    {
        Some(bad) => Err(format!(
            "per_pod_env: {bad:?} is not an environment variable name"
        )),
        None => Ok(()),
    }
}

/// Each folder of `registry_config_path` is absolute (a relative one would
/// depend on the reader's working folder).
fn check_registry_config_path(path: &str) -> Result<(), String> {
    match path
        .split(':')
        .find(|d| !d.is_empty() && !Path::new(d).is_absolute())
    {
        Some(dir) => Err(format!(
            "registry_config_path: {dir} is not an absolute path"
        )),
        None => Ok(()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("runtime config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("runtime config {origin}: {message}")]
    Invalid { origin: String, message: String },
}

impl RuntimeConfig {
    /// Parses a config body; `origin` names it in errors (a path or "inline").
    pub fn parse(body: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: RuntimeConfig = toml::from_str(body).map_err(|e| ConfigError::Invalid {
            origin: origin.to_string(),
            message: e.message().to_string(),
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let body = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let mut config = Self::parse(&body, &path.display().to_string())?;
        config.source = ConfigSource::File(path.to_path_buf());
        Ok(config)
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            origin: origin.to_string(),
            message,
        };
        if self.runc_binary.as_os_str().is_empty() {
            return Err(invalid("runc_binary: must not be empty".into()));
        }
        if self.vsnap_cli.as_os_str().is_empty() {
            return Err(invalid("vsnap_cli: must not be empty".into()));
        }
        check_per_pod_env(&self.per_pod_env).map_err(invalid)?;
        check_registry_config_path(&self.registry_config_path).map_err(invalid)?;
        if let Some(root) = &self.runc_root {
            if !root.is_absolute() {
                return Err(invalid(format!(
                    "runc_root: {} is not an absolute path",
                    root.display()
                )));
            }
        }
        if !self.runtime_dir.is_absolute() {
            return Err(invalid(format!(
                "runtime_dir: {} is not an absolute path",
                self.runtime_dir.display()
            )));
        }
        if !self.artifact_root.is_absolute() {
            return Err(invalid(format!(
                "artifact_root: {} is not an absolute path",
                self.artifact_root.display()
            )));
        }
        let fleet_paths = [
            ("fleet_signing_key", self.fleet_signing_key.as_ref()),
            ("fleet_fingerprint_key", self.fleet_fingerprint_key.as_ref()),
            ("fleet_encryption_key", self.fleet_encryption_key.as_ref()),
        ]
        .into_iter()
        .chain(
            self.fleet_trusted_keys
                .iter()
                .map(|p| ("fleet_trusted_keys", Some(p))),
        )
        .chain(
            self.fleet_decryption_keys
                .iter()
                .map(|p| ("fleet_decryption_keys", Some(p))),
        );
        for (key, path) in fleet_paths {
            if let Some(path) = path.filter(|p| !p.is_absolute()) {
                return Err(invalid(format!(
                    "{key}: {} is not an absolute path",
                    path.display()
                )));
            }
        }
        for (key, value) in [
            ("capture_timeout_s", self.capture_timeout_s),
            ("activation_timeout_s", self.activation_timeout_s),
            ("gpu_activation_timeout_s", self.gpu_activation_timeout_s),
            ("checkpoint_timeout_s", self.checkpoint_timeout_s),
            ("donor_stop_grace_s", self.donor_stop_grace_s),
        ] {
            if value == 0 {
                return Err(invalid(format!("{key}: must be at least 1 second")));
            }
        }
        for (host, registry) in &self.registries {
            registry
                .validate(host)
                .map_err(|m| invalid(format!("registries.\"{host}\": {m}")))?;
        }
        self.tenants.validate().map_err(invalid)?;
        Ok(())
    }
}

impl RegistryConfig {
    fn validate(&self, host: &str) -> Result<(), String> {
        let ok_char =
            |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
        if host.is_empty() || !host.chars().all(ok_char) {
            return Err("not a registry host[:port] (no scheme, no path)".into());
        }
        match (&self.username, &self.password_file) {
            (Some(u), _) if u.is_empty() => Err("username: must not be empty".into()),
            (Some(_), None) => Err("username without password_file".into()),
            (None, Some(_)) => Err("password_file without username".into()),
            (Some(_), Some(p)) if !p.is_absolute() => Err(format!(
                "password_file: {} is not an absolute path",
                p.display()
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;

#[cfg(test)]
mod example {
    /// The documented example must parse: it is what operators copy.
    #[test]
    fn the_shipped_example_parses() {
        let body = include_str!("../examples/vsnap.toml");
        super::RuntimeConfig::parse(body, "config/examples/vsnap.toml").unwrap();
    }

    /// The commented `[tenants]` block of the example, and the example of
    /// docs/configuration.md, parse as written.
    #[test]
    fn the_tenant_examples_parse() {
        let example = include_str!("../examples/vsnap.toml");
        let start = example.find("# [tenants]").expect("a [tenants] block");
        let block: String = example[start..]
            .lines()
            .map_while(|l| l.strip_prefix("# "))
            .map(|l| format!("{l}\n"))
            .collect();
        let c = super::RuntimeConfig::parse(&block, "the example's [tenants]").unwrap();
        assert!(c.tenants.may_create("k8s.io/models"), "{block}");
        let docs = include_str!("../../docs/configuration.md");
        let at = docs.find("### Tenants").expect("docs: a Tenants section");
        let toml_start = at + docs[at..].find("```toml\n").expect("a toml example") + 8;
        let toml_end = toml_start + docs[toml_start..].find("```").unwrap();
        let c = super::RuntimeConfig::parse(&docs[toml_start..toml_end], "docs").unwrap();
        assert!(c
            .tenants
            .share_for("k8s.io/team-b", "k8s.io/models", "llama-8b")
            .is_some());
    }
}
