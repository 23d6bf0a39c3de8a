//! The artifact made whole: the control dir copied in, the all-zero pages
//! left out of the page images (vsnap_pages::zero_pages), every file's digest
//! taken (of the plaintext), the pages files sealed at rest with the host
//! key (vsnap_artifact::at_rest), then the manifest (timings, host and workload identity, clocks,
//! the carried layer, the tree's memory) sealed with the host key and the staging dir
//! published in one rename.

use std::time::Instant;

use async_trait::async_trait;
use log::info;
use vsnap_artifact::at_rest::{self, Sealed};
use vsnap_artifact::rootfs as artifact_rootfs;
use vsnap_artifact::{
    layout, ArtifactError, Contents, HostIdentity, HostKey, Manifest, Timings, SCHEMA_VERSION,
};
use vsnap_pages::zero_pages;

use super::context::CaptureRun;
use crate::error::{Error, Result};
use crate::lifecycle::phase::blocking;
use crate::lifecycle::phase::{Phase, PhaseName, Stop};
use crate::snapshot::criu::memory;
use crate::snapshot::{artifact_error, rootfs::shm, DIGEST_THREADS};

/// The images folder of an artifact, as its content digests name it.
const IMAGES: &str = "images";

pub struct Digest;

#[async_trait]
impl Phase<CaptureRun> for Digest {
    fn name(&self) -> PhaseName {
        PhaseName::Digest
    }

    async fn run(&self, run: &mut CaptureRun, _: &Stop) -> Result<()> {
        let t = Instant::now();
        let staging = run.staging();
        layout::copy_files(&run.plan.common.control_dir, &staging.control())
            .map_err(|e| artifact_error("capture", e))?;
        // Digests the elision took of the pages files as it wrote them:
        // the digest pass does not read those again.
        let mut written = Contents::new();
        if run.plan.elide_zero_pages {
            let images = staging.images();
            let elided = blocking(PhaseName::Digest, move || {
                // The error names the phase (zero pages) and the folder.
                zero_pages::elide(&images).map_err(|e| Error::Other(format!("capture: {e}")))
            })
            .await?;
            info!(
                "{}: {} zero pages ({} bytes) elided, {} pages files hashed, in {:?}",
                run.id,
                elided.zero_pages.elided_pages,
                elided.zero_pages.elided_bytes,
                elided.digests.len(),
                t.elapsed()
            );
            run.zero_pages = Some(elided.zero_pages);
            let digests = elided.digests.into_iter();
            written.extend(digests.map(|(name, d)| (format!("{IMAGES}/{name}"), d)));
        }
        let dir = run.staging().dir.clone();
        let contents = blocking(PhaseName::Digest, move || {
            vsnap_artifact::content::digest_with(&dir, DIGEST_THREADS, written)
                .map_err(|e| artifact_error("capture: content digests", e))
        })
        .await?;
        info!("{}: content digests in {:?}", run.id, t.elapsed());
        run.contents = Some(contents);
        if run.plan.seal_at_rest {
            run.sealed = Some(seal(run).await?);
        }
        Ok(())
    }
}

/// The staged pages files sealed in place with a key of their own derived
/// from the host key: until here they were in clear in the staging folder
/// (root-only, never published so).
async fn seal(run: &CaptureRun) -> Result<Sealed> {
    let t = Instant::now();
    let root = run.plan.common.root.clone();
    let dir = run.staging().dir.clone();
    let (sealed, (files, bytes)) = blocking(PhaseName::Digest, move || {
        let seal = || -> vsnap_artifact::Result<_> {
            let key = HostKey::load_or_create(&root)?;
            let sealed = Sealed::fresh()?;
            let done = at_rest::seal_tree(&dir, &sealed.opener(&key)?)?;
            Ok((sealed, done))
        };
        seal().map_err(|e| artifact_error("capture: seal at rest", e))
    })
    .await?;
    info!(
        "{}: {} pages files ({bytes} bytes) sealed at rest ({}) in {:?}",
        run.id,
        files.len(),
        sealed.cipher,
        t.elapsed()
    );
    Ok(sealed)
}

pub struct Publish;

#[async_trait]
impl Phase<CaptureRun> for Publish {
    fn name(&self) -> PhaseName {
        PhaseName::Publish
    }

    async fn run(&self, run: &mut CaptureRun, stop: &Stop) -> Result<()> {
        let t = Instant::now();
        let root = run.plan.common.root.clone();
        let key =
            HostKey::load_or_create(&root).map_err(|e| artifact_error("capture: host key", e))?;
        let mut manifest = manifest(run);
        manifest.seal(&key);
        let staging = run.staging.take().expect("the checkpoint phase ran");
        // A kill or delete of the task before the rename: nothing published.
        let commit = run.commit.clone();
        let published = blocking(PhaseName::Publish, move || {
            Ok(staging.publish_if(&root, &manifest.to_bytes(), || commit.begin_publish()))
        })
        .await?
        .map_err(|e| match e {
            ArtifactError::Stopped(_) => stop.error(self.name()),
            e => artifact_error("capture: publish", e),
        })?;
        info!("{}: published in {:?}", run.id, t.elapsed());
        run.published = Some(published);
        Ok(())
    }
}

/// The manifest of what the phases made, not yet sealed.
fn manifest(run: &mut CaptureRun) -> Manifest {
    let (contents, clocks) = (run.contents.take(), run.clocks.take());
    let layer = run.layer.take().expect("the carry phase ran");
    let sealed = run.sealed.take();
    let open_files = std::mem::take(&mut run.volume_files);
    let s = &run.plan;
    let staging = run.staging();
    let ready = run.ready();
    Manifest {
        schema_version: SCHEMA_VERSION,
        name: s.common.artifact.to_string(),
        created_at: time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        capture_id: ready.capture_id.clone(),
        oracle: ready.oracle.clone(),
        source_container: run.id.clone(),
        image_bytes: layout::bytes_under(&staging.images()),
        contents: contents.expect("the digest phase ran"),
        timings_ms: Timings {
            cold_start_to_capture_ready: ms(ready.cold_start),
            inventory: ms(run.ran.of(PhaseName::Inventory)),
            // The checkpoint's time includes what it carries.
            checkpoint: ms(run.ran.of(PhaseName::Checkpoint) + run.ran.of(PhaseName::Carry)),
            rootfs: ms(run.rootfs_packing),
        },
        host: HostIdentity {
            gpus: vsnap_artifact::gpu::entries(&s.common.gpus),
            ..HostIdentity::probe_cached(
                &s.common.tools,
                env!("CARGO_PKG_VERSION"),
                Some(&s.common.root),
            )
        },
        workload: s.common.workload.clone(),
        clocks,
        origin: None,
        rootfs: Some(artifact_rootfs::Rootfs { layer, open_files }),
        // The donor still runs: its /dev/shm is there to be read.
        zero_pages: run.zero_pages,
        criu: Some(run.plan.criu.clone()),
        sealed,
        memory: Some(memory::at_capture(
            &staging.images(),
            &staging.dir.join(shm::ARTIFACT_DIR),
            s.common.host_shm.as_deref(),
            run.pid,
        )),
        mac: String::new(),
    }
}

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}
