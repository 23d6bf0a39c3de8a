//! Restoring straight from a registry (`vsnap.io/artifact-ref`): at create,
//! before the preflight, a restore (or `auto`) whose artifact the artifact
//! root does not hold pulls it from the reference, exactly as `vsnap pull`
//! does (vsnap-registry: signed by a trusted fleet key before anything is
//! fetched, every chunk and every file checked, sealed with this host's
//! key, published atomically). The preflight then treats it as any local
//! artifact. An artifact already here is used as it is: the reference is
//! only where to get it from.
//!
//! Credentials come from the runtime config's `[registries."host:port"]`,
//! never from the annotation; nothing of them is logged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vsnap_artifact::{ArtifactError, ArtifactLock, Manifest};
use vsnap_config::RuntimeConfig;
use vsnap_registry::{PullOptions, PushOptions, RegistryError, Remote};

use super::plan::{self, Mode, Plan};
use crate::error::{Error, Result};

/// Pulls the plan's artifact when it has a reference and the root lacks
/// the artifact. Another container pulling the same artifact meanwhile is
/// waited for. `auto` falls back to a cold start (and a capture) when the
/// pull fails; `restore` fails naming the reference and why.
pub async fn ensure_local(
    id: &str,
    config: &RuntimeConfig,
    settings: &HashMap<String, String>,
) -> Result<()> {
    let Some(plan) = plan::from_annotations(settings)? else {
        return Ok(());
    };
    let (Some(reference), Some(name)) = (plan.artifact_ref.clone(), plan.artifact.clone()) else {
        return Ok(());
    };
    let timeout = Duration::from_secs(config.pull_timeout_s);
    // On a thread and runtime of its own: the registry client's futures are
    // not Send for every lifetime, which the shim's task API requires.
    let pulling = {
        let (config, reference) = (config.clone(), reference.clone());
        tokio::task::spawn_blocking(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Other(format!("restore: pull {reference}: runtime: {e}")))?;
            Ok::<_, Error>(rt.block_on(tokio::time::timeout(
                timeout,
                pull_if_missing(&config, &reference, name.as_str()),
            )))
        })
    };
    let pulled: std::result::Result<Result<()>, _> = pulling
        .await
        .map_err(|e| Error::Other(format!("restore: pull {reference}: {e}")))??;
    match pulled {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if plan.mode == Mode::Auto => {
            log::warn!("{id}: auto: {e}: starting cold");
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::DeadlineExceeded(format!(
            "restore: pull {reference}: not done within pull_timeout_s ({}s); an interrupted pull resumes from its download cache",
            timeout.as_secs()
        ))),
    }
}

async fn pull_if_missing(config: &RuntimeConfig, reference: &str, name: &str) -> Result<()> {
    let root = &config.artifact_root;
    let fail = |e: String| Error::FailedPrecondition(format!("restore: pull {reference}: {e}"));
    loop {
        match Manifest::load_unverified(root, name) {
            Ok(_) => return Ok(()),
            Err(ArtifactError::NotFound(_)) => {}
            Err(e) => return Err(fail(e.to_string())),
        }
        // Another container (or `vsnap pull`) is writing it: wait for it.
        if ArtifactLock::is_held(root, name).map_err(|e| fail(e.to_string()))? {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let remote = Remote::new(reference, &config.registries).map_err(|e| fail(e.to_string()))?;
        let opts = PullOptions::from_config(config, 4, cores()).map_err(fail)?;
        let started = Instant::now();
        match vsnap_registry::pull(root, Some(name), &remote, &opts).await {
            Ok(r) => {
                log::info!(
                    "pulled {reference} ({}) as {name}: {} bytes, {} chunks fetched, {} from the download cache, signed by {}, in {} ms",
                    r.digest,
                    r.bytes,
                    r.fetched,
                    r.reused,
                    r.signed_by,
                    started.elapsed().as_millis()
                );
                return Ok(());
            }
            // Another pull took the lock between the look and the pull.
            Err(RegistryError::Artifact(ArtifactError::Locked(_))) => continue,
            Err(e) => return Err(fail(e.to_string())),
        }
    }
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
    /// For an `auto` plan resolved to create, with a reference, when the
    /// runtime config asks for it.
    pub fn of(config: &RuntimeConfig, plan: &Plan, mode: Mode) -> Option<Self> {
        if !config.push_created || plan.mode != Mode::Auto || mode != Mode::Create {
            return None;
        }
        Some(PushTarget {
            reference: plan.artifact_ref.clone()?,
            name: plan.artifact.clone()?.to_string(),
            config: config.clone(),
        })
    }

    /// Pushes in the background, once the capture let go of the artifact's
    /// lock; the outcome is logged (the artifact stays here either way).
    pub fn push_in_background(self, id: String) {
        std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return log::warn!("{id}: push {}: runtime: {e}", self.reference),
            };
            match rt.block_on(self.push()) {
                Ok(r) => log::info!(
                    "{id}: pushed {} to {} ({}): {} chunks uploaded, {} already there, signed by {}, sealed with {}",
                    self.name,
                    self.reference,
                    r.digest,
                    r.uploaded,
                    r.skipped,
                    r.signed_by.as_deref().unwrap_or("nobody (no fleet_signing_key)"),
                    r.encrypted_with
                        .as_deref()
                        .unwrap_or("nothing: sent in clear (no fleet_encryption_key)")
                ),
                Err(e) => log::warn!("{id}: push {} to {}: {e}", self.name, self.reference),
            }
        });
    }

    async fn push(&self) -> std::result::Result<vsnap_registry::PushReport, String> {
        let remote =
            Remote::new(&self.reference, &self.config.registries).map_err(|e| e.to_string())?;
        let opts = PushOptions::from_config(&self.config, 4, cores())?;
        // The capture's exclusive lock may still be held for a moment.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match vsnap_registry::push(&self.config.artifact_root, &self.name, &remote, &opts).await
            {
                Err(RegistryError::Artifact(ArtifactError::Locked(_)))
                    if Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                r => return r.map_err(|e| e.to_string()),
            }
        }
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
