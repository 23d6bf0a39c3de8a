//! What a capture or a restore leaves for people and benchmarks: a
//! restore's timings in the bundle (`vsnap-restore.json`), a failure's
//! record (`vsnap-error.json`), and CRIU's log of a failed dump or restore
//! kept under the artifact root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::Error;
use vsnap_pages as pages;

/// Where a restore's Start spent its time, written to the bundle as
/// `vsnap-restore.json` (for benchmarks and diagnosis) and logged.
#[derive(Debug)]
pub struct RestoreTimings {
    /// When the shim's Create began; the timings are recorded (now) just
    /// before Start answers. A benchmark places them against `ctr`'s own
    /// clock: what came before and after is ctr's and containerd's time.
    pub create_began: std::time::SystemTime,
    pub preflight: Duration,
    /// Hashing every file, alongside CRIU's restore.
    pub verify: Duration,
    pub criu_restore: Duration,
    pub activation: Duration,
    pub listener: Duration,
    /// Checking and unpacking the carried writable layer (at create).
    pub rootfs: Duration,
    /// What vsnap's page server placed (inside `criu_restore`).
    pub pages: Option<pages::Placed>,
    /// When CRIU started (`runc restore`).
    pub criu_began: Option<std::time::SystemTime>,
}

impl RestoreTimings {
    pub fn record(&self, bundle: &Path) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
        };
        let record = serde_json::json!({
            "create_began_unix_s": unix(self.create_began),
            "recorded_unix_s": unix(std::time::SystemTime::now()),
            "preflight_ms": ms(self.preflight),
            "verify_ms": ms(self.verify),
            "criu_restore_ms": ms(self.criu_restore),
            "activation_ms": ms(self.activation),
            "listener_ms": ms(self.listener),
            "rootfs_ms": ms(self.rootfs),
            "page_fill_ms": self.pages.map(|p| ms(p.fill)),
            "page_slot_wait_ms": self.pages.map(|p| ms(p.slot_wait)),
            "page_share_role": self.pages.and_then(|p| p.share_role),
            "page_chunks_from_share": self.pages.map(|p| p.chunks_from_share),
            "page_chunks_read": self.pages.map(|p| p.chunks_read),
            "page_chunks_shared_out": self.pages.map(|p| p.chunks_shared_out),
            "pages_placed_bytes": self.pages.map(|p| p.bytes),
            "pages_huge_eligible_bytes": self.pages.map(|p| p.huge_bytes + p.huge_declined_bytes),
            "pages_huge_bytes": self.pages.map(|p| p.huge_bytes),
            "pages_huge_declined_bytes": self.pages.map(|p| p.huge_declined_bytes),
            "pages_huge_free_blocks": self.pages.and_then(|p| p.huge_free_blocks),
            "page_faults_served": self.pages.map(|p| p.faults),
            "page_server_tasks": self.pages.map(|p| p.tasks),
            "criu_began_unix_s": self.criu_began.map(unix),
            // A restore streamed from a pull: when the last bytes it
            // waited for arrived (after CRIU began: the two overlapped).
            "pages_last_arrival_unix_s": self
                .pages
                .and_then(|p| p.last_arrival_ms)
                .map(|ms| ms as f64 / 1000.0),
        });
        let path = bundle.join("vsnap-restore.json");
        if let Err(e) = vsnap_protocol::write_atomic(&path, record.to_string().as_bytes()) {
            log::warn!("write {}: {e}", path.display());
        }
    }
}

/// Leaves `vsnap-error.json` in the bundle: the container, the phase that
/// failed (when known), the error of its failed capture or restore and,
/// when CRIU ran, where its log was kept ([`keep_criu_log`]).
/// Whole or absent: never half written.
pub fn record_error(
    bundle: &Path,
    id: &str,
    phase: Option<&str>,
    e: &Error,
    criu_log: Option<&Path>,
) {
    let mut record = serde_json::json!({"container": id, "error": e.to_string()});
    if let Some(phase) = phase {
        record["phase"] = phase.into();
    }
    if let Some(log) = criu_log {
        record["criu_log"] = log.display().to_string().into();
    }
    let path = bundle.join("vsnap-error.json");
    if let Err(e) = vsnap_protocol::write_atomic(&path, record.to_string().as_bytes()) {
        log::error!("{id}: write {}: {e}", path.display());
    }
}

/// Keeps CRIU's `log` of a failed `kind` ("dump" or "restore") of the
/// `artifact` by container `id` under the artifact `root`, where it
/// outlives the task (vsnap_artifact::criu_logs); the kept file, or `None`
/// (no log: CRIU never ran; a failure to keep it is logged).
pub fn keep_criu_log(
    root: &Path,
    artifact: &str,
    id: &str,
    kind: &str,
    log: &Path,
) -> Option<PathBuf> {
    if !log.exists() {
        return None;
    }
    let now = time::OffsetDateTime::now_utc();
    let stamp = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}.{:03}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.millisecond()
    );
    match vsnap_artifact::criu_logs::keep(root, &stamp, artifact, id, kind, log) {
        Ok(kept) => {
            log::warn!("{id}: CRIU's {kind} log kept as {}", kept.display());
            Some(kept)
        }
        Err(e) => {
            log::error!("{id}: keep CRIU's log {}: {e}", log.display());
            None
        }
    }
}
