//! Snapshot plans: a container annotated for `create` is cold-started, captured
//! with runc + CRIU once its engine is capture-ready, and published as an
//! artifact; a container annotated for `restore` is restored from one and
//! becomes visible only after its engine validated its canary and listens.

pub mod artifact;
pub mod capture;
pub mod inventory;
pub mod plan;
pub mod restore;
pub mod spec;

/// Where the control dir appears inside the container.
pub const CONTROL_MOUNT: &str = "/run/vsnap/control";
/// How the engine learns about it (same JSON as vLLM's `--snapshot-config`).
pub const SNAPSHOT_CONFIG_ENV: &str = "VSNAP_SNAPSHOT_CONFIG";

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vsnap_config::RuntimeConfig;
use vsnap_protocol::ControlDir;

use crate::error::{Error, Result};
use crate::runc::Deadline;
use plan::{Mode, Plan};

/// A container's snapshot plan, resolved at create.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub plan: Plan,
    /// Create or Restore (Auto is resolved at create).
    pub mode: Mode,
    pub root: PathBuf,
    pub control_dir: PathBuf,
    pub capture_timeout: Duration,
    pub activation_timeout: Duration,
}

impl Snapshot {
    /// Reads the plan from the bundle's annotations and prepares the
    /// container for it: the control dir, the spec edits and, for a restore,
    /// the validated artifact. `None`: the container runs plain.
    pub fn prepare(
        bundle: &Path,
        id: &str,
        namespace: &str,
        config: &RuntimeConfig,
    ) -> Result<Option<Self>> {
        let Some(plan) = plan::from_annotations(&spec::annotations(bundle)?)? else {
            return Ok(None);
        };
        let root = config.artifact_root.clone();
        let mode = match plan.mode {
            Mode::Auto => match artifact::validate(&root, &plan.artifact) {
                Ok(_) => Mode::Restore,
                Err(Error::NotFound(_)) => Mode::Create,
                Err(e) => return Err(e),
            },
            m => m,
        };
        if mode == Mode::Restore {
            artifact::validate(&root, &plan.artifact)?;
        }
        artifact::ensure_root(&root)?;
        let control_dir = root.join(".control").join(format!("{namespace}-{id}"));
        remove_control_dir(&control_dir);
        ControlDir::create(&control_dir)
            .map_err(|e| Error::FailedPrecondition(format!("create: control dir: {e}")))?;
        let s = Snapshot {
            capture_timeout: plan
                .capture_timeout
                .unwrap_or(Duration::from_secs(config.capture_timeout_s)),
            activation_timeout: plan
                .activation_timeout
                .unwrap_or(Duration::from_secs(config.activation_timeout_s)),
            plan,
            mode,
            root,
            control_dir,
        };
        let prepared = (|| {
            if s.mode == Mode::Restore {
                // The copy sees only what was there at capture time.
                artifact::copy_files(&s.artifact_dir().join("control"), &s.control_dir)?;
            }
            spec::add_control_dir(bundle, &s.control_dir, s.capture_timeout.as_secs())
        })();
        if let Err(e) = prepared {
            remove_control_dir(&s.control_dir);
            return Err(e);
        }
        Ok(Some(s))
    }

    /// The activation deadline, from now. A restore's Start runs CRIU's
    /// restore and then the activation within this one deadline.
    pub fn activation_deadline(&self) -> Deadline {
        let source = if self.plan.activation_timeout.is_some() {
            plan::ACTIVATION_TIMEOUT
        } else {
            "activation_timeout_s"
        };
        Deadline {
            at: Instant::now() + self.activation_timeout,
            what: format!(
                "the activation timeout of {}s ({source})",
                self.activation_timeout.as_secs()
            ),
        }
    }

    pub fn artifact_dir(&self) -> PathBuf {
        artifact::path(&self.root, &self.plan.artifact)
    }

    /// The CRIU images a restore starts from.
    pub fn images(&self) -> Option<PathBuf> {
        (self.mode == Mode::Restore).then(|| self.artifact_dir().join("images"))
    }

    pub fn cleanup(&self) {
        remove_control_dir(&self.control_dir);
    }
}

fn remove_control_dir(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}
