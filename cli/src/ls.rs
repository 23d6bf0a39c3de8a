//! `vsnap ls`: every artifact under the root, with its status: `ok` (the
//! layout and MAC checks a restore makes pass), `invalid: REASON`, or
//! `in-use` (its lock is held by a restore, a capture or a removal); then
//! the quarantined copies (quarantined.rs), which `--quarantined` lists
//! alone (the `--json` array of artifacts stays as it was).

use serde::Serialize;
use vsnap_artifact::{ArtifactLock, Manifest};

use crate::table::{row, table};
use crate::units::human_size;
use crate::{emit, emit_json, Ctx, Outcome, OK};
use crate::{quarantined, store};

#[derive(Serialize)]
pub struct Entry {
    pub name: String,
    pub created_at: Option<String>,
    pub source_container: Option<String>,
    /// Bytes of the regular files under the artifact folder.
    pub size_bytes: u64,
    pub image_bytes: Option<u64>,
    /// `ok`, `invalid` or `in-use` (in use wins; `valid` still tells).
    pub status: &'static str,
    pub valid: bool,
    pub reason: Option<String>,
    /// Unknown (null) when /proc/locks cannot be read.
    pub in_use: Option<bool>,
}

pub fn entries(ctx: &Ctx) -> Result<Vec<Entry>, String> {
    let root = &ctx.root;
    let names = store::artifact_names(root)
        .map_err(|e| format!("read artifact root {}: {e}", root.display()))?;
    let mut out = Vec::new();
    for name in names {
        let (manifest, reason, in_use) = match store::check_name(&name) {
            // Not a name the shim makes or locks: a stray entry.
            Err(e) => (None, Some(e), Some(false)),
            Ok(()) => {
                let in_use = ArtifactLock::is_held(root, &name).ok();
                match Manifest::load_verified(root, &name) {
                    Ok(m) => (Some(m), None, in_use),
                    // Shown anyway when readable: the MAC or key is the problem.
                    Err(e) => (
                        Manifest::load_unverified(root, &name).ok(),
                        Some(e.to_string()),
                        in_use,
                    ),
                }
            }
        };
        let valid = reason.is_none();
        out.push(Entry {
            created_at: manifest.as_ref().map(|m| {
                store::created_at(m)
                    .map(store::format_utc)
                    .unwrap_or_else(|| m.created_at.clone())
            }),
            source_container: manifest.as_ref().map(|m| m.source_container.clone()),
            size_bytes: store::disk_bytes(root, &name),
            image_bytes: manifest.as_ref().map(|m| m.image_bytes),
            status: match (in_use, valid) {
                (Some(true), _) => "in-use",
                (_, true) => "ok",
                (_, false) => "invalid",
            },
            valid,
            reason,
            in_use,
            name,
        });
    }
    Ok(out)
}

pub fn run(ctx: &Ctx, json: bool, quarantined_only: bool) -> Outcome {
    if quarantined_only {
        let copies = quarantined::entries(&ctx.root)?;
        if json {
            emit_json(&copies);
        } else {
            emit(&quarantined::section(&copies, &ctx.root));
        }
        return Ok(OK);
    }
    let entries = entries(ctx)?;
    if json {
        emit_json(&entries);
        return Ok(OK);
    }
    let prefix = format!("{}/", ctx.root.display());
    let mut rows = vec![row(&["NAME", "CREATED", "SIZE", "SOURCE", "STATUS"])];
    for e in &entries {
        let mut status = Vec::new();
        match e.in_use {
            Some(true) => status.push("in-use".to_string()),
            None => status.push("lock unknown".to_string()),
            Some(false) => {}
        }
        match &e.reason {
            // Paths relative to the root keep the column readable.
            Some(r) => status.push(format!("invalid: {}", r.replace(&prefix, ""))),
            None if status.is_empty() => status.push("ok".into()),
            None => {}
        }
        rows.push(row(&[
            e.name.clone(),
            e.created_at.clone().unwrap_or_else(|| "-".into()),
            human_size(e.size_bytes),
            e.source_container.clone().unwrap_or_else(|| "-".into()),
            status.join(", "),
        ]));
    }
    let copies = quarantined::entries(&ctx.root)?;
    emit(&(table(&rows) + &quarantined::section(&copies, &ctx.root)));
    Ok(OK)
}
