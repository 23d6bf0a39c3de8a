//! `vsnap metrics`: the metrics journal's totals (restores, captures, pulls
//! and pushes; phases, bytes, failures; `auto` fallbacks) and the artifact
//! store's size and quarantined copies in the Prometheus text format,
//! printed once (for node_exporter's textfile collector) or served at
//! `GET /metrics` with `--listen ADDR:PORT`.
//! Computed from the journal at each read, so they survive restarts.

mod gather;
mod render;
mod serve;

use std::net::SocketAddr;

pub use gather::exposition;

use crate::{emit, Ctx, Outcome, OK};

pub fn run(ctx: &Ctx, listen: Option<SocketAddr>) -> Outcome {
    match listen {
        None => {
            emit(&exposition(&ctx.root)?);
            Ok(OK)
        }
        Some(addr) => serve::serve(&ctx.root, addr),
    }
}
