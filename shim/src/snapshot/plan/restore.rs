//! A restore's plan: what the preflight found in the artifact and what
//! CRIU's restore, the verification and the activation use, and nothing a
//! capture needs.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use vsnap_artifact::{Contents, Memory, Tenant};
use vsnap_protocol::Oracle;

use super::capture::CapturePlan;
use super::common::Common;
use super::lock::ReadLock;
use crate::snapshot::rootfs::WritableLayer;

#[derive(Clone, Debug)]
pub struct RestorePlan {
    pub common: Common,
    /// The container's hold on the artifact's shared lock, from create
    /// until the restore no longer reads the artifact.
    pub lock: Option<ReadLock>,
    /// Whose artifact this is: the container's tenant, or for an artifact
    /// shared with it, the owner's (the fingerprint hook checks the
    /// manifest's owner against it).
    pub owner: Tenant,
    /// The fleet's shared fingerprint key (`fleet_fingerprint_key`), which
    /// keyed the workload's secret fingerprints instead of the host key.
    pub fingerprint_key: Option<PathBuf>,
    /// The canary answer from the MAC'd manifest, the only oracle a copy
    /// is held to (never a file of the control dir).
    pub oracle: Oracle,
    /// With `verify_contents`: the digests every file of the artifact is
    /// checked against while CRIU restores.
    pub contents: Option<Contents>,
    /// Files checked at create already (the carried layer, unpacked before
    /// Start): Start's verification skips them.
    pub verified_at_create: Vec<String>,
    /// Where vsnap's page server places the memory (CRIU in lazy-pages
    /// mode), what it does (criu/pages.rs makes it once, here); None:
    /// CRIU places it.
    pub pages: Option<vsnap_pages::PagePlan>,
    /// What the artifact's tree held in memory at capture (its manifest's,
    /// when recorded), named when the restore runs out of memory.
    pub memory: Option<Memory>,
    /// When the shim's Create of the container began.
    pub create_began: SystemTime,
    /// Time spent validating the artifact at create (the preflight).
    pub preflight: Duration,
    /// How long checking and unpacking the carried layer took.
    pub rootfs_unpack: Duration,
    /// The plan asked was `auto`: a restore that fails after CRIU started
    /// sets the artifact aside (and goes on as `cold`).
    pub auto: bool,
    /// Under `auto`, where the same Start can go on as a cold start of the
    /// container's own spec after the restore failed (None: it cannot,
    /// and Start fails once).
    pub cold: Option<ColdStart>,
    /// A root folder other containers may share (`ctr run --rootfs DIR`):
    /// the restore runs on a private bind mount of it at the bundle's
    /// `rootfs` (the spec's root names that). runc 1.1 prepares a restore
    /// by binding `/etc/hosts` and the like onto the root's host side and
    /// detaching them again, which raced with every other restore of the
    /// same folder; a bind of its own keeps each restore's mounts its own.
    pub shared_root: Option<PathBuf>,
    /// The spec's hostname where the container has a UTS namespace of its
    /// own: CRIU restored the donor's name into it, the restore sets this
    /// one before the tree runs (criu/pod.rs).
    pub hostname: Option<String>,
    /// The CRIU options its dump used, from the manifest (None: an
    /// artifact of format 5 or 6, which did not record them), repeated by
    /// the restore (criu/options.rs).
    pub criu: Option<vsnap_artifact::CriuOptions>,
    /// What opens its pages files, sealed at rest with this host's key
    /// (the manifest's `sealed`); None: in clear. The page server and the
    /// verification open what they read; CRIU gets a view of the images
    /// with the pages it reads itself in clear (vsnap_pages::CriuView).
    pub sealed: Option<vsnap_artifact::at_rest::Opener>,
}

/// What a cold start of the container needs after its restore failed at
/// Start: the spec as containerd gave it (saved before the plan edited
/// it), the writable layer the carried one was unpacked into, to be
/// emptied again, and the capture that replaces the artifact.
#[derive(Clone, Debug)]
pub struct ColdStart {
    pub spec: PathBuf,
    pub upper: Option<PathBuf>,
    /// The files the restore put back into the pod's `/dev/shm` (a host
    /// folder), which a cold start must not find.
    pub shm: Vec<PathBuf>,
    /// None where the tenant may create nothing: a cold start without a
    /// capture.
    pub capture: Option<ColdCapture>,
}

/// The capture a cold start after a failed restore runs, as a create
/// would have: its plan (its lock taken when the artifact is set aside)
/// and its spec and CRIU config, written at create beside the restore's.
#[derive(Clone, Debug)]
pub struct ColdCapture {
    pub plan: Box<CapturePlan>,
    pub spec: PathBuf,
    pub criu_config: PathBuf,
}

impl ColdStart {
    /// Where the container's own spec is kept in its bundle.
    pub const SPEC_FILE: &'static str = "vsnap-config-cold.json";
    /// Where the capture's spec and CRIU config are kept in the bundle.
    pub const CAPTURE_FILES: (&'static str, &'static str) =
        ("vsnap-config-capture.json", "vsnap-criu-capture.conf");

    /// Under `auto`: a cold start of a container whose layer is `layer`,
    /// `unpacked` into by the restore or not; None where what was
    /// unpacked cannot be taken out again (an overlay mounted by the caller).
    pub fn of(bundle: &Path, layer: &WritableLayer, unpacked: bool) -> Option<Self> {
        let upper = match (unpacked, layer) {
            (false, _) => None,
            (true, WritableLayer::Upper(upper)) => Some(upper.clone()),
            (true, _) => return None,
        };
        Some(ColdStart {
            spec: bundle.join(Self::SPEC_FILE),
            upper,
            shm: Vec::new(),
            capture: None,
        })
    }

    /// The capture's files in `bundle`, for its `plan`.
    pub fn with_capture(mut self, bundle: &Path, plan: Box<CapturePlan>) -> Self {
        let (spec, criu) = Self::CAPTURE_FILES;
        self.capture = Some(ColdCapture {
            plan,
            spec: bundle.join(spec),
            criu_config: bundle.join(criu),
        });
        self
    }
}

impl RestorePlan {
    /// Where in the bundle a shared root folder is bind-mounted for the
    /// restore ([`RestorePlan::shared_root`]): containerd's own rootfs
    /// folder, empty for a container created with `--rootfs DIR`.
    pub const SHARED_ROOT_MOUNT: &'static str = "rootfs";

    /// Whether a failure at Start can go on as a cold start in the same
    /// Start (`auto`, [`ColdStart`]).
    pub fn may_go_cold(&self) -> bool {
        self.cold.is_some()
    }

    /// Whether CRIU leaves the restored tree stopped (`leave-stopped`)
    /// until vsnap verified every byte beside it. Not with GPUs: CRIU stops
    /// the tasks before its late device hook, in which the CUDA plugin must
    /// run each process's restore thread; a GPU restore verifies first.
    pub fn holds_stopped(&self) -> bool {
        self.common.gpus.is_empty()
    }

    /// Where `runc restore` starts from.
    pub fn images(&self) -> PathBuf {
        self.common.artifact_dir().join("images")
    }
}
