//! Quarantined copies as the CLI shows them: artifacts a start under
//! `vsnap.io/plan=auto` set aside under `<root>/.quarantine/<name>/`
//! because this host could not restore them (vsnap_artifact::quarantine).
//! `vsnap ls` lists them after the artifacts, `vsnap inspect --quarantined`
//! reads one, `vsnap gc --older-than` removes them by their reason's age.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use vsnap_artifact::layout::bytes_under;
use vsnap_artifact::quarantine::{self, Reason};

use crate::store;
use crate::table::{row, table};
use crate::units::{human_age, human_size};

/// One quarantined copy (`vsnap ls --quarantined --json`).
#[derive(Serialize)]
pub struct Entry {
    pub name: String,
    pub path: String,
    /// `host`, `damaged`, `restore`, or `unknown` (no readable reason).
    pub cause: String,
    /// The refusal or failure, whole.
    pub message: String,
    /// When it was set aside: seconds since the epoch, and as UTC.
    pub at: u64,
    pub set_aside_at: String,
    pub age_seconds: u64,
    /// The container whose start set it aside.
    pub container: String,
    pub size_bytes: u64,
}

/// Every quarantined copy under `root`, sorted by name.
pub fn entries(root: &Path) -> Result<Vec<Entry>, String> {
    let copies = quarantine::list(root).map_err(|e| format!("quarantine: {e}"))?;
    Ok(copies
        .into_iter()
        .map(|(name, reason, path)| Entry {
            size_bytes: bytes_under(&path),
            path: path.display().to_string(),
            set_aside_at: utc(reason.at),
            age_seconds: age(&reason).as_secs(),
            cause: reason.cause,
            message: reason.message,
            at: reason.at,
            container: reason.container,
            name,
        })
        .collect())
}

/// How long ago `reason` set its copy aside (zero for a time ahead).
pub fn age(reason: &Reason) -> Duration {
    store::age_since(UNIX_EPOCH + Duration::from_secs(reason.at))
}

fn utc(at: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp(at as i64)
        .map(store::format_utc)
        .unwrap_or_else(|_| at.to_string())
}

/// The first line of a message, paths relative to the root (as `ls`
/// shows reasons), control characters shown as `?`.
pub fn first_line(message: &str, root: &Path) -> String {
    let prefix = format!("{}/", root.display());
    message
        .lines()
        .next()
        .unwrap_or("")
        .replace(&prefix, "")
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The section `vsnap ls` prints after the artifacts; empty without copies.
pub fn section(entries: &[Entry], root: &Path) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let mut rows = vec![row(&[
        "QUARANTINED",
        "CAUSE",
        "AGE",
        "SIZE",
        "CONTAINER",
        "REASON",
    ])];
    for e in entries {
        rows.push(row(&[
            e.name.clone(),
            e.cause.clone(),
            human_age(Duration::from_secs(e.age_seconds)),
            human_size(e.size_bytes),
            if e.container.is_empty() {
                "-".into()
            } else {
                e.container.clone()
            },
            first_line(&e.message, root),
        ]));
    }
    format!(
        "\nset aside under {}/ (never restored; `vsnap inspect --quarantined NAME` reads one, `vsnap gc --older-than` removes them):\n{}",
        root.join(quarantine::DIR).display(),
        table(&rows)
    )
}

/// The reason's rows for `vsnap inspect --quarantined`.
pub fn reason_rows(reason: &Reason) -> String {
    let at = format!("{} ({} ago)", utc(reason.at), human_age(age(reason)));
    table(&[
        row(&[
            "Quarantined:",
            "yes (set aside: never restored, never used by a start)",
        ]),
        row(&["Cause:", &reason.cause]),
        row(&["Set aside:", &at]),
        row(&[
            "By container:",
            if reason.container.is_empty() {
                "-"
            } else {
                &reason.container
            },
        ]),
    ])
}
