//! What a scrape reads: the journal's totals, the artifact store's sizes
//! and its quarantined copies, rendered.

use std::collections::BTreeMap;
use std::path::Path;

use vsnap_artifact::journal::Journal;
use vsnap_artifact::layout::bytes_under;

use super::render::{render, Store};

/// The exposition of the journal and the store under `root`.
pub fn exposition(root: &Path) -> Result<String, String> {
    let totals = Journal::at(root)
        .totals()
        .map_err(|e| format!("metrics: journal {}: {e}", root.display()))?;
    let names = crate::store::artifact_names(root)
        .map_err(|e| format!("metrics: artifact root {}: {e}", root.display()))?;
    let artifacts: BTreeMap<String, u64> = names
        .into_iter()
        .map(|n| {
            let bytes = bytes_under(&root.join(&n));
            (n, bytes)
        })
        .collect();
    let quarantined = vsnap_artifact::quarantine::list(root)
        .map_err(|e| format!("metrics: quarantine: {e}"))?
        .len() as u64;
    Ok(render(
        &totals,
        &Store {
            artifacts,
            quarantined,
        },
        env!("CARGO_PKG_VERSION"),
    ))
}
