//! The engine-side snapshot protocol, as spoken by stock vLLM.
//!
//! Two interfaces are covered:
//!
//! * the *control-dir* protocol of vLLM's external startup capture: the engine and the
//!   capturer (vsnap's shim) exchange small JSON files in a private directory
//!   ([`ControlDir`], [`activate`], messages such as [`CaptureReady`] and [`Activation`]);
//! * the *barrier* of released vLLM: a ready file and a release file
//!   ([`ReadyFile`], [`ReleaseFile`]).
//!
//! Everything that touches the file system follows the same rules on both sides: files are
//! written atomically, read strictly (regular file, at most [`MAX_FILE_BYTES`], one JSON
//! object, known keys only), and the directory is re-validated before every read.
//! See `docs/protocol.md` for the protocol in prose.

mod barrier;
mod dir;
mod error;
mod file;
mod handshake;
mod identity;
mod ids;
mod messages;
mod oracle;
mod wait;

pub use barrier::{
    abort_release, abort_release_for, release, release_for, wait_ready, ReadyFile, ReleaseFile,
};
pub use dir::{euid, ControlDir, Expect};
pub use error::{ProtocolError, Result};
pub use file::{
    parse, read_bytes, read_json, to_canonical_json, write_atomic, write_atomic_for, Received,
    MAX_FILE_BYTES,
};
pub use handshake::{activate, Activated};
pub use identity::{Identity, SEED_BYTES};
pub use ids::{is_activation_id, is_uuid4_hex, new_uuid4_hex};
pub use messages::{
    Activation, ActivationKind, CaptureReady, Challenge, ErrorRecord, Message, Oracle, Schema,
    Status, StatusPhase, PROTOCOL_VERSION,
};
pub use oracle::LOGPROB_TOLERANCE;
pub use wait::{wait_for, wait_for_capturer, wait_for_path, AwakeTimer, POLL_INTERVAL};

/// Names of the files in a control dir.
/// Where the control dir appears inside the container.
pub const CONTROL_MOUNT: &str = "/run/vsnap/control";
/// How an engine learns the control dir from its environment: the same
/// JSON as vLLM's `--snapshot-config`.
pub const SNAPSHOT_CONFIG_ENV: &str = "VSNAP_SNAPSHOT_CONFIG";

pub mod files {
    /// Written once by the engine when it is ready to be captured.
    pub const CAPTURE_READY: &str = "capture-ready.json";
    /// Written by the capturer to wake one process (the donor or a restored copy).
    pub const ACTIVATION: &str = "activation.json";
    /// Written by the engine after it accepted an activation; carries a fresh nonce.
    pub const CHALLENGE: &str = "challenge.json";
    /// Written by the capturer: a byte-identical copy of the challenge.
    pub const RELEASE: &str = "release.json";
    /// Written (and overwritten) by the engine during recovery.
    pub const STATUS: &str = "status.json";
    /// Written by the engine, best effort, when it fails.
    pub const ERROR: &str = "error.json";
    /// Written by the capturer before the activation: the activated process's own
    /// hostname, addresses and random seed, applied after its canary (identity.rs).
    pub const IDENTITY: &str = "identity.json";

    /// Files that must not exist when an activation is written: their presence means the
    /// directory was already used by another process (a stale copy of the control dir).
    pub const STALE_BEFORE_ACTIVATION: [&str; 5] = [ACTIVATION, CHALLENGE, RELEASE, STATUS, ERROR];
}
