//! `vsnap metrics`: the metrics journal's totals (restores, captures, pulls
//! and pushes; phases, bytes, failures) and the artifact store's size in
//! the Prometheus text format, printed once (for node_exporter's textfile
//! collector) or served at `GET /metrics` with `--listen ADDR:PORT`.
//! Computed from the journal at each read, so they survive restarts.

mod render;
mod serve;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use vsnap_artifact::journal::Journal;
use vsnap_artifact::layout::bytes_under;

pub use render::{render, Store};

use crate::{emit, Ctx, Outcome, OK};

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
    Ok(render(
        &totals,
        &Store { artifacts },
        env!("CARGO_PKG_VERSION"),
    ))
}

pub fn run(ctx: &Ctx, listen: Option<SocketAddr>) -> Outcome {
    match listen {
        None => {
            emit(&exposition(&ctx.root)?);
            Ok(OK)
        }
        Some(addr) => serve::serve(&ctx.root, addr),
    }
}
