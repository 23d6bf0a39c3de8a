//! Helpers shared by the protocol tests.
#![allow(dead_code)]

use std::fs::{self, DirBuilder};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use vsnap_protocol::{CaptureReady, Oracle, PROTOCOL_VERSION};

/// A fresh 0700 directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = std::env::temp_dir().join(format!(
            "vsnap-protocol-{tag}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        DirBuilder::new().mode(0o700).create(&path).unwrap();
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub const CAPTURE_ID: &str = "0123456789abcdef4123456789abcdef";
pub const OTHER_CAPTURE_ID: &str = "fedcba98765432104edcba9876543210";
pub const NONCE: &str = "aaaaaaaaaaaaaaaa4aaaaaaaaaaaaaaa";

pub fn capture_ready() -> CaptureReady {
    CaptureReady {
        capture_id: CAPTURE_ID.into(),
        oracle: Oracle {
            sampled_token_logprob: -1.5,
            text: " P".into(),
            token_ids: vec![48],
        },
        pid: 1,
        version: PROTOCOL_VERSION,
    }
}
