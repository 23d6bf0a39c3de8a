//! Restoring straight from a registry (`vsnap.io/artifact-ref`): at create,
//! before the preflight, a restore (or `auto`) whose artifact the artifact
//! root does not hold pulls it from the reference by running `vsnap pull`
//! (vsnap_cli.rs; vsnap-registry: signed by a trusted fleet key before
//! anything is fetched, every chunk and every file checked, sealed with
//! this host's key, published atomically). The preflight then treats it as any local
//! artifact. An artifact already here is used as it is: the reference is
//! only where to get it from.
//!
//! Credentials come from the runtime config's `[registries."host:port"]`,
//! never from the annotation; nothing of them is logged. The registry's
//! mirrors are the node's containerd `hosts.toml` ones (the config's
//! `registry_config_path`), which the CLI reads as containerd does; the
//! tenant policy is held to the reference, whichever host serves it.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use serde_json::Value;
use vsnap_artifact::{ArtifactError, ArtifactLock, ArtifactName, Manifest};
use vsnap_config::{PagePlacement, RuntimeConfig};

use super::stream::{self, Start, Streamed};
use crate::error::{Error, Result};
use crate::exits::Exits;
use crate::vsnap_cli::{self, CliError};

/// An artifact a plan names with a registry reference (`vsnap.io/artifact`
/// and `vsnap.io/artifact-ref`), and whether the plan is `auto`.
#[derive(Clone, Debug)]
pub struct Wanted {
    pub reference: String,
    pub name: ArtifactName,
    pub auto: bool,
}

/// Pulls the plan's artifact when it has a reference and the root lacks
/// the artifact, through the `vsnap` CLI (`vsnap pull`, vsnap_cli.rs).
/// Another container pulling the same artifact meanwhile is waited for.
/// `auto` falls back to a cold start (and a capture) when the pull fails;
/// `restore` fails naming the reference and why. With `stream_pulls`, it
/// returns once a restore can start from the pull (stream.rs), which goes
/// on meanwhile.
pub async fn ensure_local(
    id: &str,
    config: &RuntimeConfig,
    exits: &Exits,
    wanted: Option<Wanted>,
) -> Result<Option<Streamed>> {
    let Some(Wanted {
        reference,
        name,
        auto,
    }) = wanted
    else {
        return Ok(None);
    };
    let timeout = Duration::from_secs(config.pull_timeout_s);
    let pulled = tokio::time::timeout(
        timeout,
        pull_if_missing(config, exits, &reference, name.as_str(), timeout),
    )
    .await;
    match pulled {
        Ok(Ok(streamed)) => Ok(streamed),
        Ok(Err(e)) if auto && !matches!(e, Error::DeadlineExceeded(_)) => {
            log::warn!("{id}: auto: {e}: starting cold");
            Ok(None)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(pull_deadline(&reference, timeout)),
    }
}

fn pull_deadline(reference: &str, timeout: Duration) -> Error {
    Error::DeadlineExceeded(format!(
        "restore: pull {reference}: not done within pull_timeout_s ({}s); an interrupted pull resumes from the chunks it landed",
        timeout.as_secs()
    ))
}

async fn pull_if_missing(
    config: &RuntimeConfig,
    exits: &Exits,
    reference: &str,
    name: &str,
    timeout: Duration,
) -> Result<Option<Streamed>> {
    let root = &config.artifact_root;
    let fail = |e: String| Error::FailedPrecondition(format!("restore: pull {reference}: {e}"));
    let stream = config.stream_pulls && config.page_placement == PagePlacement::Parallel;
    loop {
        if local(root, name).map_err(fail)? {
            return Ok(None);
        }
        // Another container (or `vsnap pull`) is pulling or writing it:
        // wait for it (a streamed pull publishes once its restore let go).
        let busy = ArtifactLock::is_held(root, name)
            .and_then(|w| Ok(w || ArtifactLock::pull_under_way(root, name)?))
            .map_err(|e| fail(e.to_string()))?;
        if busy {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if stream {
            let started = Instant::now();
            match stream::start(config, exits, (reference, name), timeout).await {
                Ok(Start::Head(s)) => {
                    log::info!(
                        "streaming {reference} as {name}: a restore can start after {} ms; the pull goes on",
                        started.elapsed().as_millis()
                    );
                    return Ok(Some(s));
                }
                Ok(Start::TimedOut) => return Err(pull_deadline(reference, timeout)),
                Ok(Start::Failed(reason)) => {
                    if ArtifactLock::is_held(root, name).unwrap_or(false)
                        || local(root, name).unwrap_or(false)
                    {
                        continue;
                    }
                    let prefix = format!("pull {reference}: ");
                    let reason = reason.strip_prefix(&prefix).unwrap_or(&reason).to_string();
                    return Err(fail(reason));
                }
                Err(e) => return Err(fail(e)),
            }
        }
        let args: Vec<OsString> = ["pull", reference, name, "--jobs", stream::JOBS, "--json"]
            .iter()
            .map(OsString::from)
            .collect();
        let started = Instant::now();
        let ran = match vsnap_cli::run(config, exits, &args, timeout).await {
            Ok(ran) => ran,
            Err(CliError::TimedOut(_)) => return Err(pull_deadline(reference, timeout)),
            Err(CliError::Failed(e)) => return Err(fail(e)),
        };
        if ran.code == 0 {
            log_pulled(reference, name, &ran.stdout, started);
            return Ok(None);
        }
        // Another pull took the lock between the look and the pull.
        if ArtifactLock::is_held(root, name).unwrap_or(false) || local(root, name).unwrap_or(false)
        {
            continue;
        }
        let reason = ran.reason();
        let prefix = format!("pull {reference}: ");
        return Err(fail(
            reason.strip_prefix(&prefix).unwrap_or(&reason).to_string(),
        ));
    }
}

/// Whether the root holds `name` (unverified: the preflight verifies).
fn local(root: &std::path::Path, name: &str) -> std::result::Result<bool, String> {
    match Manifest::load_unverified(root, name) {
        Ok(_) => Ok(true),
        Err(ArtifactError::NotFound(_)) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

fn log_pulled(reference: &str, name: &str, report: &[u8], started: Instant) {
    let r: Value = serde_json::from_slice(report).unwrap_or_default();
    log::info!(
        "pulled {reference} ({}) as {name}: {} bytes, {} chunks fetched, {} landed by an interrupted pull, signed by {}, in {} ms",
        r["digest"].as_str().unwrap_or("?"),
        r["bytes"],
        r["fetched"],
        r["reused"],
        r["signed_by"].as_str().unwrap_or("?"),
        started.elapsed().as_millis()
    );
}

/// Where an `auto` create pushes what it published (the runtime config's
/// `push_created`, the plan's reference), with the config it pushes by
/// (registries, `fleet_signing_key`).
#[derive(Clone, Debug)]
pub struct PushTarget {
    pub reference: String,
    pub name: String,
    config: RuntimeConfig,
}

impl PushTarget {
    /// For an `auto` plan that creates, with a reference, when the
    /// runtime config asks for it.
    pub fn of(config: &RuntimeConfig, wanted: Option<Wanted>) -> Option<Self> {
        let wanted = wanted.filter(|w| w.auto && config.push_created)?;
        Some(PushTarget {
            reference: wanted.reference,
            name: wanted.name.to_string(),
            config: config.clone(),
        })
    }

    /// Pushes in the background through the `vsnap` CLI (`vsnap push`),
    /// once the capture let go of the artifact's lock; the outcome is
    /// logged (the artifact stays here either way).
    pub fn push_in_background(self, id: String, exits: Exits) {
        tokio::spawn(async move {
            match self.push(&exits).await {
                Ok(r) => log::info!(
                    "{id}: pushed {} to {} ({}): {} chunks uploaded, {} already there, signed by {}, sealed with {}",
                    self.name,
                    self.reference,
                    r["digest"].as_str().unwrap_or("?"),
                    r["uploaded"],
                    r["skipped"],
                    r["signed_by"]
                        .as_str()
                        .unwrap_or("nobody (no fleet_signing_key)"),
                    r["encrypted_with"]
                        .as_str()
                        .unwrap_or("nothing: sent in clear (no fleet_encryption_key)")
                ),
                Err(e) => log::warn!("{id}: push {} to {}: {e}", self.name, self.reference),
            }
        });
    }

    async fn push(&self, exits: &Exits) -> std::result::Result<Value, String> {
        let args: Vec<OsString> = [
            "push",
            &self.name,
            &self.reference,
            "--jobs",
            stream::JOBS,
            "--json",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let root = &self.config.artifact_root;
        // The capture's exclusive lock may still be held for a moment.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ArtifactLock::is_held(root, &self.name).unwrap_or(false) && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            let ran = vsnap_cli::run(&self.config, exits, &args, Duration::from_secs(24 * 3600))
                .await
                .map_err(|e| e.to_string())?;
            if ran.code == 0 {
                return Ok(serde_json::from_slice(&ran.stdout).unwrap_or_default());
            }
            if !ArtifactLock::is_held(root, &self.name).unwrap_or(false)
                || Instant::now() >= deadline
            {
                let reason = ran.reason();
                let prefix = format!("push {}: ", self.name);
                return Err(reason.strip_prefix(&prefix).unwrap_or(&reason).to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(auto: bool) -> Wanted {
        Wanted {
            reference: "registry.test:5000/fleet/a:1".into(),
            name: ArtifactName::new("a").unwrap(),
            auto,
        }
    }

    #[test]
    fn only_an_auto_create_pushes_and_only_where_the_config_asks() {
        let mut config = RuntimeConfig {
            push_created: true,
            ..Default::default()
        };
        let target = PushTarget::of(&config, Some(wanted(true))).expect("pushes");
        assert_eq!(
            (target.reference.as_str(), target.name.as_str()),
            ("registry.test:5000/fleet/a:1", "a")
        );
        assert!(
            PushTarget::of(&config, Some(wanted(false))).is_none(),
            "restore"
        );
        assert!(PushTarget::of(&config, None).is_none(), "no reference");
        config.push_created = false;
        assert!(
            PushTarget::of(&config, Some(wanted(true))).is_none(),
            "not asked"
        );
    }

    #[test]
    fn an_artifact_is_here_when_its_manifest_is_and_a_damaged_one_is_named() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(local(root.path(), "a"), Ok(false));
        let dir = vsnap_artifact::path(root.path(), "a");
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(dir.join("manifest.json"), b"{").unwrap();
        let e = local(root.path(), "a").unwrap_err();
        assert!(e.contains("manifest.json"), "{e}");
    }

    #[tokio::test]
    async fn a_plan_without_a_reference_pulls_nothing_and_a_pull_past_its_bound_says_it_resumes() {
        let config = RuntimeConfig::default();
        ensure_local("c1", &config, &Exits::default(), None)
            .await
            .unwrap();
        let e = pull_deadline("r/a:1", Duration::from_secs(30)).to_string();
        assert!(
            e.contains("pull r/a:1") && e.contains("pull_timeout_s (30s)"),
            "{e}"
        );
        assert!(e.contains("resumes from the chunks it landed"), "{e}");
    }
}
