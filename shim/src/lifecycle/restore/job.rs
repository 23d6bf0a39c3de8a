//! `runc restore` as a job that owns everything it needs, so that it runs
//! with no lock on the container: the images, CRIU's work dir and flags,
//! the stdio made ready for it, vsnap's page server where it places the
//! memory, the container's memory cgroup watched for the OOM killer, and
//! the undo of runc's and CRIU's leftovers on failure.

use std::path::PathBuf;
use std::sync::Arc;

use crate::cleanup::undo_runc_state;
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::prepared::Prepared;
use crate::runc::{CheckpointFlags, ChildStdio, RestoreFiles, RuncVerbs};
use crate::snapshot::artifact_error;
use crate::snapshot::criu;
use crate::snapshot::criu::memory::{self, Limit};
use crate::snapshot::criu::restore_oom::RestoreOom;
use vsnap_artifact::at_rest::Opener;
use vsnap_pages::{CriuView, PageError, PagePlan, PageServer, Phase, Placed};

/// A restore under way: everything `runc restore` needs, owned, so that it
/// runs with no lock on the container.
pub struct RestoreJob {
    pub id: String,
    pub bundle: PathBuf,
    pub runc: Arc<dyn RuncVerbs>,
    pub image: PathBuf,
    pub work: PathBuf,
    pub pid_file: PathBuf,
    pub flags: CheckpointFlags,
    pub cgroups_path: Option<PathBuf>,
    pub prepared: Option<Prepared>,
    /// Where a failed restore may go on as a cold start: the stdio pipes
    /// given to runc are kept open by the shim (`spare_stdio`) until the
    /// restore's outcome is known, so that their copies to containerd do
    /// not end with runc's.
    pub keep_stdio: bool,
    pub spare_stdio: Option<ChildStdio>,
    /// What vsnap's page server does, where it places the memory (CRIU
    /// runs in lazy-pages mode); taken when it starts.
    pub pages: Option<PagePlan>,
    /// What opens the artifact's pages files where they are sealed at
    /// rest: CRIU then restores from a view of the images with the pages
    /// it reads itself in clear (`criu_images`).
    pub sealed: Option<Opener>,
    /// What the page server placed, once the restore ran.
    pub placed: Option<Placed>,
    /// When `runc restore` (CRIU) started.
    pub criu_began: Option<std::time::SystemTime>,
    pub deadline: Deadline,
    /// What tells a restore the OOM killer ended from any other failure.
    pub memory: MemoryWatch,
}

/// The container's memory cgroup, watched while `runc restore` and the
/// page placement run, and what names an out-of-memory restore.
pub struct MemoryWatch {
    /// The container's cgroup, relative to a hierarchy's root.
    pub cgroup: Option<PathBuf>,
    /// The shim may make it ahead of runc (cgroupfs, not systemd's driver).
    pub may_make: bool,
    /// The lowest memory limit over the container.
    pub limit: Option<Limit>,
    /// What the artifact's tree held at capture.
    pub need: Option<vsnap_artifact::Memory>,
}

impl RestoreJob {
    /// Runs `runc restore` within the deadline (and until cancelled). On
    /// failure, runc's and CRIU's leftovers are undone: their mounts first,
    /// so that removing runc's state can never reach the rootfs.
    pub async fn run(&mut self) -> Result<()> {
        let child_stdio = self.prepared.as_mut().and_then(|p| p.child_stdio.take());
        if self.keep_stdio {
            self.spare_stdio = child_stdio.as_ref().and_then(|s| s.try_clone().ok());
        }
        let console = self.prepared.as_ref().and_then(|p| p.console_path.clone());
        // The view is kept until CRIU and the page server are done.
        let (view, image) = self.criu_images()?;
        // Listening before CRIU starts: it connects first thing.
        let pages = match self.pages.take() {
            Some(plan) => Some(
                PageServer::start(plan, &self.work)
                    .map_err(|e| Error::FailedPrecondition(format!("restore: page server: {e}")))?,
            ),
            None => None,
        };
        // Before runc makes the cgroup and anything is charged to it.
        let m = &self.memory;
        let oom = m
            .cgroup
            .as_deref()
            .map(|c| RestoreOom::before(&self.id, c, m.may_make));
        self.criu_began = Some(std::time::SystemTime::now());
        let restored = self
            .runc
            .restore(
                &self.id,
                &RestoreFiles {
                    bundle: &self.bundle,
                    image: &image,
                    work: &self.work,
                    pid_file: &self.pid_file,
                    console_socket: console.as_deref(),
                },
                &self.flags,
                child_stdio,
                Some(&self.deadline),
            )
            .await;
        // runc's message is generic; CRIU's log says what it could not restore.
        let restored = restored.map_err(|e| match e {
            Error::Runc {
                phase,
                verb,
                detail,
            } => Error::Runc {
                phase,
                verb,
                detail: format!(
                    "{detail}{}",
                    criu::log_errors(&self.work.join("restore.log"))
                ),
            },
            e => e,
        });
        // CRIU is done; the tree is stopped until every page is in.
        let restored = match (restored, pages) {
            (Ok(()), Some(server)) => self.place(server).await,
            (restored, _) => restored,
        };
        // Before the undo removes the cgroup's counts.
        let restored = match (restored, oom) {
            (Err(e), Some(oom)) if !matches!(e, Error::Cancelled(_)) => {
                Err(match oom.seen().await {
                    Some(seen) => {
                        let m = &self.memory;
                        memory::out_of_memory(m.limit.as_ref(), m.need.as_ref(), &seen, &e)
                    }
                    None => e,
                })
            }
            (restored, _) => restored,
        };
        if restored.is_err() {
            self.undo().await;
        }
        drop(view);
        restored
    }

    /// The images CRIU restores from: the artifact's, or where its pages
    /// files are sealed at rest a view of them in the bundle (the
    /// runtime's tmpfs) with the pages CRIU reads itself in clear, the rest
    /// left to the page server.
    fn criu_images(&self) -> Result<(Option<CriuView>, PathBuf)> {
        let Some(opener) = &self.sealed else {
            return Ok((None, self.image.clone()));
        };
        let t = std::time::Instant::now();
        let dir = self.bundle.join("criu-images");
        let view = CriuView::make(&self.image, &dir, opener, self.pages.is_some())
            .map_err(|e| Error::FailedPrecondition(format!("restore: sealed images: {e}")))?;
        log::info!(
            "{}: {} bytes of sealed pages opened for CRIU in {:?}",
            self.id,
            view.opened,
            t.elapsed()
        );
        let image = view.path().to_path_buf();
        Ok((Some(view), image))
    }

    /// Waits for the page server to place every page (within the deadline,
    /// until a kill cancels the restore).
    async fn place(&mut self, server: PageServer) -> Result<()> {
        let placed = tokio::select! {
            placed = server.finish(self.deadline.at) => placed,
            _ = self.deadline.cancel.cancelled() => {
                Err(PageError::Cancelled { phase: Phase::Finish })
            }
        };
        match placed {
            Ok(placed) => {
                log::info!("{}: pages placed: {placed:?}", self.id);
                self.placed = Some(placed);
                Ok(())
            }
            Err(PageError::Damaged(e)) => Err(artifact_error("restore: verify", e)),
            // The pull it streamed from failed: the registry's, the
            // network's doing, not the artifact's.
            Err(e @ PageError::Failed { .. }) if e.phase() == Phase::Stream => {
                Err(Error::Unavailable(format!("restore: page placement: {e}")))
            }
            Err(e) => Err(self.deadline.fail(format!("restore: page placement: {e}"))),
        }
    }

    /// Removes what a restore left (its tree, stopped or not, mounts, runc
    /// state, cgroups): after a failure, or when the restore succeeded but
    /// must not be used.
    pub async fn undo(&self) {
        let rootfs = crate::cleanup::rootfs_path(&self.bundle);
        undo_runc_state(
            self.runc.as_ref(),
            &self.id,
            &self.work,
            rootfs.as_deref(),
            self.cgroups_path.as_deref(),
        )
        .await;
    }
}
