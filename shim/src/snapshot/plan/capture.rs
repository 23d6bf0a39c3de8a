//! A capture's plan: what the cold start, the capture, the publish and the
//! donor's end use, and nothing a restore needs.

use std::time::Duration;

use super::annotations::AfterCapture;
use super::common::Common;
use super::lock::WriteLock;
use crate::snapshot::{registry::fetch, rootfs};

#[derive(Clone, Debug)]
pub struct CapturePlan {
    pub common: Common,
    /// The container's hold on the artifact's exclusive lock, from create
    /// until the capture has published or failed.
    pub lock: Option<WriteLock>,
    /// How long the engine may take to become capture-ready.
    pub capture_timeout: Duration,
    /// Bound on `runc checkpoint` (checkpoint_timeout_s).
    pub checkpoint_timeout: Duration,
    /// What becomes of the original process once the artifact is published.
    pub after_capture: AfterCapture,
    /// `donor_stop_grace_s`.
    pub donor_stop_grace: Duration,
    /// The container's writable layer (rootfs/): what a capture carries.
    pub layer: rootfs::WritableLayer,
    /// `rootfs_diff_limit_bytes`.
    pub layer_limit: u64,
    /// `elide_zero_pages`: all-zero pages left out of the page images.
    pub elide_zero_pages: bool,
    /// `seal_at_rest`: the pages files sealed with the host key before
    /// the artifact is published.
    pub seal_at_rest: bool,
    /// Where an `auto` create pushes its artifact once published
    /// (`push_created` and `vsnap.io/artifact-ref`; fetch.rs).
    pub push_to: Option<fetch::PushTarget>,
    /// The spec as read at create (its mounts: the volumes the inventory
    /// records).
    pub spec: serde_json::Value,
    /// The CRIU options the dump uses (criu/options.rs), recorded in the
    /// manifest for its restores.
    pub criu: vsnap_artifact::CriuOptions,
}
