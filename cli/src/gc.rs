//! `vsnap gc`: removes stale writer leftovers, CRIU logs and quarantined
//! copies older than `--older-than`, the partial folders of interrupted
//! pulls untouched for longer than `--partial-older-than` (24h by
//! default), then artifacts older than `--older-than`, then the oldest
//! artifacts until the total is at most `--max-total-size` (which counts
//! artifacts only). Never an artifact in use (its lock is held): each
//! removal takes the exclusive lock, as `vsnap rm` does; nor a partial
//! folder a pull holds (its pull lock, taken likewise).
//!
//! An artifact's age comes from its manifest's `created_at` (the capture
//! time, MAC-covered), or from its folder's mtime when the manifest cannot
//! be read. Sizes are the bytes of the regular files under each artifact.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use vsnap_artifact::layout::bytes_under;
use vsnap_artifact::quarantine;
use vsnap_artifact::{check_path_safe, ArtifactError, ArtifactLock, Manifest};

use crate::partial;
use crate::quarantined;
use crate::store::{self, RemoveError};
use crate::table::{row, table};
use crate::units::{format_duration, human_age, human_size};
use crate::{emit, emit_json, warn, Ctx, Outcome, ERROR, FAILED, OK};

pub struct Policy {
    pub older_than: Option<Duration>,
    pub max_total_size: Option<u64>,
    /// Partial folders of interrupted pulls untouched for longer than this
    /// are removed.
    pub partial_older_than: Duration,
    pub dry_run: bool,
}

#[derive(Serialize)]
struct Action {
    name: String,
    /// `artifact`, `staging`, `trash`, `criu-log`, `quarantined` or
    /// `partial` (an interrupted pull's folder).
    kind: &'static str,
    age_seconds: u64,
    size_bytes: u64,
    reason: String,
    /// `removed`, `would-remove`, `in-use` (kept), `gone` (removed by
    /// someone else meanwhile), `left-alone` (not gc's to remove: see
    /// the reason) or `failed`.
    result: &'static str,
    error: Option<String>,
}

#[derive(Serialize)]
struct Report {
    dry_run: bool,
    actions: Vec<Action>,
    /// Bytes of all artifacts (not leftovers) before and after.
    total_bytes_before: u64,
    total_bytes_after: u64,
    max_total_bytes: Option<u64>,
    /// Whether the total after is within `max_total_bytes` (true without one).
    fits: bool,
    /// Allocated bytes of the partial folders removed (in a dry run: that
    /// would be); not in the totals.
    partial_bytes_freed: u64,
}

struct Candidate {
    name: String,
    age: Duration,
    size: u64,
}

pub fn run(ctx: &Ctx, policy: Policy, json: bool) -> Outcome {
    let root = &ctx.root;
    check_root(root)?;
    let mut actions = leftover_actions(root, &policy)?;
    actions.extend(criu_log_actions(root, &policy));
    actions.extend(quarantine_actions(root, &policy)?);
    actions.extend(partial_actions(root, &policy)?);
    let candidates = candidates(root)?;
    let total_before: u64 = candidates.iter().map(|c| c.size).sum();
    let kept = remove_older(ctx, &policy, candidates, &mut actions);
    let total = trim_to_size(ctx, &policy, &kept, &mut actions);
    let report = Report {
        dry_run: policy.dry_run,
        total_bytes_before: total_before,
        total_bytes_after: total,
        max_total_bytes: policy.max_total_size,
        fits: policy.max_total_size.is_none_or(|l| total <= l),
        partial_bytes_freed: actions
            .iter()
            .filter(|a| a.kind == "partial" && matches!(a.result, "removed" | "would-remove"))
            .map(|a| a.size_bytes)
            .sum(),
        actions,
    };
    let code = exit_code(&report, json);
    if json {
        emit_json(&report);
    } else {
        emit(&human(&report));
    }
    Ok(code)
}

/// A missing root is an empty store; an existing one must be safe to walk.
fn check_root(root: &Path) -> Result<(), String> {
    let exists = match fs::symlink_metadata(root) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(format!("artifact root {}: {e}", root.display())),
    };
    if exists {
        check_path_safe(root).map_err(|e| format!("artifact root: {e}"))?;
    }
    Ok(())
}

fn read_err(root: &Path) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("read artifact root {}: {e}", root.display())
}

/// Staging and trash folders of dead writers: removed (or, in a dry run,
/// listed) whatever their age.
fn leftover_actions(root: &Path, policy: &Policy) -> Result<Vec<Action>, String> {
    let mut actions = Vec::new();
    for l in store::leftovers(root).map_err(read_err(root))? {
        let path = root.join(&l.file_name);
        let age = store::mtime(&path)
            .map(store::age_since)
            .unwrap_or_default();
        // A writer holds `<name>`'s exclusive lock from before it makes its
        // folder until it is done: a free lock means a dead writer, however
        // young its folder.
        if ArtifactLock::is_held(root, &l.name).unwrap_or(true) {
            continue;
        }
        let mut action = Action {
            size_bytes: bytes_under(&path),
            name: l.file_name.clone(),
            kind: l.kind,
            age_seconds: age.as_secs(),
            reason: format!(
                "{} folder whose writer (pid {}) is gone: {}'s lock is free",
                l.kind, l.pid, l.name
            ),
            result: "would-remove",
            error: None,
        };
        if !policy.dry_run {
            settle(&mut action, store::remove_leftover(root, &l));
        }
        actions.push(action);
    }
    Ok(actions)
}

/// CRIU's logs of failed captures and restores kept under the root
/// (vsnap_artifact::criu_logs) older than `--older-than`: removed (or, in a
/// dry run, listed). Without `--older-than` they stay (their number is
/// bounded where they are written).
fn criu_log_actions(root: &Path, policy: &Policy) -> Vec<Action> {
    let Some(limit) = policy.older_than else {
        return Vec::new();
    };
    let mut actions = Vec::new();
    for (path, modified) in vsnap_artifact::criu_logs::list(root) {
        let age = store::age_since(modified);
        if age <= limit {
            continue;
        }
        let mut action = Action {
            name: format!(
                "{}/{}",
                vsnap_artifact::criu_logs::DIR,
                path.file_name().unwrap_or_default().to_string_lossy()
            ),
            kind: "criu-log",
            age_seconds: age.as_secs(),
            size_bytes: fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            reason: format!("CRIU log older than {}", format_duration(limit)),
            result: "would-remove",
            error: None,
        };
        if !policy.dry_run {
            match fs::remove_file(&path) {
                Ok(()) => action.result = "removed",
                Err(e) if e.kind() == io::ErrorKind::NotFound => action.result = "gone",
                Err(e) => {
                    action.result = "failed";
                    action.error = Some(e.to_string());
                }
            }
        }
        actions.push(action);
    }
    actions
}

/// Quarantined copies (vsnap_artifact::quarantine) set aside longer ago
/// than `--older-than` (their reason's `at`; the folder's mtime without a
/// readable reason): removed (or, in a dry run, listed), each under its
/// name's exclusive lock, so that a start setting a newer copy aside
/// meanwhile is never undone: a held lock keeps the copy until the next
/// gc, and the age is read again under the lock. Without `--older-than`
/// they stay.
fn quarantine_actions(root: &Path, policy: &Policy) -> Result<Vec<Action>, String> {
    let Some(limit) = policy.older_than else {
        return Ok(Vec::new());
    };
    let copies = quarantine::list(root).map_err(|e| format!("quarantine: {e}"))?;
    let mut actions = Vec::new();
    for (name, reason, path) in copies {
        let age = quarantined::age(&reason);
        if age <= limit {
            continue;
        }
        let mut action = Action {
            name: format!("{}/{name}", quarantine::DIR),
            kind: "quarantined",
            age_seconds: age.as_secs(),
            size_bytes: bytes_under(&path),
            reason: format!(
                "set aside ({}) longer ago than {}",
                reason.cause,
                format_duration(limit)
            ),
            result: "would-remove",
            error: None,
        };
        if !policy.dry_run {
            settle(&mut action, remove_quarantined(root, &name, limit));
        }
        actions.push(action);
    }
    Ok(actions)
}

/// Removes the quarantined copy of `name` if it is still older than
/// `limit`, holding `name`'s exclusive lock.
fn remove_quarantined(root: &Path, name: &str, limit: Duration) -> Result<(), RemoveError> {
    let _lock = match ArtifactLock::exclusive(root, name) {
        Ok(lock) => lock,
        Err(ArtifactError::Locked(_)) => return Err(RemoveError::InUse),
        Err(e) => return Err(RemoveError::Failed(e.to_string())),
    };
    let copies = quarantine::list(root).map_err(|e| RemoveError::Failed(e.to_string()))?;
    match copies.iter().find(|(n, _, _)| n == name) {
        None => Err(RemoveError::NotFound),
        // Replaced by a newer copy since it was listed: kept.
        Some((_, reason, _)) if quarantined::age(reason) <= limit => Err(RemoveError::NotFound),
        Some(_) => quarantine::remove(root, name).map_err(|e| RemoveError::Failed(e.to_string())),
    }
}

/// The partial folders of interrupted pulls (partial.rs) untouched for
/// longer than `--partial-older-than`: removed (or, in a dry run, listed),
/// each under its name's pull lock, taken without waiting: one a pull holds
/// (under way, or a restore streaming from it) is kept (`in-use`), and a
/// pull that starts meanwhile waits for the removal. Entries that are not
/// the folder of an artifact name (a symlink, a file, another name) are
/// left alone and listed, whatever their age.
fn partial_actions(root: &Path, policy: &Policy) -> Result<Vec<Action>, String> {
    let limit = policy.partial_older_than;
    let mut actions = Vec::new();
    for p in partial::list(root).map_err(|e| format!("partial pulls: {e}"))? {
        let mut action = Action {
            name: p.shown,
            kind: "partial",
            age_seconds: p.age.as_secs(),
            size_bytes: p.bytes,
            reason: format!(
                "partial pull untouched for longer than {}",
                format_duration(limit)
            ),
            result: "would-remove",
            error: None,
        };
        let name = match p.name {
            Ok(name) if p.age > limit => name,
            Ok(_) => continue,
            Err(why) => {
                action.reason = why;
                action.result = "left-alone";
                actions.push(action);
                continue;
            }
        };
        if policy.dry_run {
            // Looking only: a dry run takes no lock.
            if ArtifactLock::pull_under_way(root, &name).unwrap_or(false) {
                action.result = "in-use";
            }
        } else {
            let removed = partial::remove(root, &name, limit);
            if let Ok(bytes) = removed {
                action.size_bytes = bytes;
            }
            settle(&mut action, removed.map(drop));
        }
        actions.push(action);
    }
    Ok(actions)
}

/// The artifacts with their ages and sizes, oldest first.
fn candidates(root: &Path) -> Result<Vec<Candidate>, String> {
    let mut candidates = Vec::new();
    for name in store::artifact_names(root).map_err(read_err(root))? {
        // Entries the shim never makes are not artifacts: not counted, not removed.
        if store::check_name(&name).is_err() {
            continue;
        }
        let manifest = Manifest::load_unverified(root, &name).ok();
        candidates.push(Candidate {
            age: store::artifact_age(root, &name, manifest.as_ref()),
            size: store::disk_bytes(root, &name),
            name,
        });
    }
    // Oldest first; equal ages by name, so that runs are repeatable.
    candidates.sort_by(|a, b| b.age.cmp(&a.age).then_with(|| a.name.cmp(&b.name)));
    Ok(candidates)
}

/// Removes the artifacts older than `--older-than`; returns the rest (and
/// those that could not be removed), still oldest first.
fn remove_older(
    ctx: &Ctx,
    policy: &Policy,
    candidates: Vec<Candidate>,
    actions: &mut Vec<Action>,
) -> Vec<Candidate> {
    let mut kept = Vec::new();
    for c in candidates {
        match policy.older_than {
            Some(max_age) if c.age > max_age => {
                let action = remove(
                    ctx,
                    policy,
                    &c,
                    format!("older than {}", format_duration(max_age)),
                );
                let removed = action.frees();
                actions.push(action);
                if !removed {
                    kept.push(c);
                }
            }
            _ => kept.push(c),
        }
    }
    kept
}

/// Removes the oldest of `kept` until the total is within
/// `--max-total-size`; returns the total left.
fn trim_to_size(ctx: &Ctx, policy: &Policy, kept: &[Candidate], actions: &mut Vec<Action>) -> u64 {
    let mut total: u64 = kept.iter().map(|c| c.size).sum();
    if let Some(limit) = policy.max_total_size {
        for c in kept {
            if total <= limit {
                break;
            }
            let action = remove(
                ctx,
                policy,
                c,
                format!("total {} is over {}", human_size(total), human_size(limit)),
            );
            if action.frees() {
                total -= c.size;
            }
            actions.push(action);
        }
    }
    total
}

/// FAILED when the total is still over the limit (warned about unless
/// `json`), ERROR when a removal failed, OK otherwise.
fn exit_code(report: &Report, json: bool) -> u8 {
    let mut code = OK;
    if !report.fits {
        code = FAILED;
        if !json {
            warn(&format!(
                "the artifacts still hold {}, over --max-total-size {}: the rest are in use",
                human_size(report.total_bytes_after),
                human_size(report.max_total_bytes.unwrap_or_default())
            ));
        }
    }
    if report.actions.iter().any(|a| a.result == "failed") {
        code = ERROR;
    }
    code
}

impl Action {
    /// Whether its bytes are (or, in a dry run, would be) freed.
    fn frees(&self) -> bool {
        matches!(self.result, "removed" | "would-remove" | "gone")
    }
}

fn remove(ctx: &Ctx, policy: &Policy, c: &Candidate, reason: String) -> Action {
    let mut action = Action {
        name: c.name.clone(),
        kind: "artifact",
        age_seconds: c.age.as_secs(),
        size_bytes: c.size,
        reason,
        result: "would-remove",
        error: None,
    };
    if policy.dry_run {
        // Looking only: a dry run takes no lock.
        if ArtifactLock::is_held(&ctx.root, &c.name).unwrap_or(false) {
            action.result = "in-use";
        }
    } else {
        settle(&mut action, store::remove_artifact(&ctx.root, &c.name));
    }
    action
}

fn settle(action: &mut Action, result: Result<(), RemoveError>) {
    action.result = match result {
        Ok(()) => "removed",
        Err(RemoveError::InUse) => "in-use",
        Err(RemoveError::NotFound) => "gone",
        Err(RemoveError::Failed(e)) => {
            action.error = Some(e);
            "failed"
        }
    };
}

fn human(r: &Report) -> String {
    let mut out = String::new();
    if r.actions.is_empty() {
        out.push_str("nothing to remove\n");
    } else {
        let mut rows = vec![row(&["NAME", "KIND", "AGE", "SIZE", "REASON", "RESULT"])];
        for a in &r.actions {
            let result = match (a.result, &a.error) {
                ("in-use", _) => "kept: in use".to_string(),
                ("would-remove", _) => "would remove".to_string(),
                ("left-alone", _) => "left alone".to_string(),
                (_, Some(e)) => format!("failed: {e}"),
                (result, None) => result.to_string(),
            };
            rows.push(row(&[
                a.name.clone(),
                a.kind.to_string(),
                human_age(Duration::from_secs(a.age_seconds)),
                human_size(a.size_bytes),
                a.reason.clone(),
                result,
            ]));
        }
        out.push_str(&table(&rows));
    }
    let limit = r
        .max_total_bytes
        .map(|l| format!(" (max {})", human_size(l)))
        .unwrap_or_default();
    out.push_str(&format!(
        "artifacts: {} {} {}{limit}{}\n",
        human_size(r.total_bytes_before),
        if r.dry_run { "would become" } else { "->" },
        human_size(r.total_bytes_after),
        if r.dry_run {
            " (dry run: nothing removed)"
        } else {
            ""
        },
    ));
    if r.actions.iter().any(|a| a.kind == "partial") {
        out.push_str(&format!(
            "partial pulls: {} {}\n",
            human_size(r.partial_bytes_freed),
            if r.dry_run { "would be freed" } else { "freed" },
        ));
    }
    out
}
