//! The assemble, verify and publish phases: the files rebuilt from the
//! cache in a staging folder, checked against the manifest's content
//! digests, sealed with this host's key and published atomically.

use std::collections::BTreeMap;
use std::fs::{DirBuilder, File};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use vsnap_artifact::layout::Staging;
use vsnap_artifact::{content, ArtifactLock, HostKey, Manifest};

use super::fetch::remove_opened;
use super::report::{ms, PullTimings};
use crate::cache::BlobCache;
use crate::error::{RegistryError, Result};
use crate::index::ArtifactConfig;

/// What the files are assembled from: the cached layers, the file index,
/// the key that opens sealed layers, and the threads that verify.
pub(super) struct Assembly {
    pub(super) cache: BlobCache,
    pub(super) config: ArtifactConfig,
    /// The opened plaintexts of a sealed artifact's layers, by digest.
    pub(super) opened: BTreeMap<String, PathBuf>,
    pub(super) threads: usize,
}

/// Assembles and publishes off the async threads, then empties the cache of
/// the artifact's chunks; returns the timings with those phases filled.
pub(super) async fn publish_from_cache(
    root: &Path,
    assembly: Assembly,
    manifest: Manifest,
    mut timings: PullTimings,
) -> Result<PullTimings> {
    let root = root.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let assembled = assemble_and_publish(&root, &assembly, manifest, &mut timings);
        remove_opened(&assembly.opened);
        assembled?;
        // The artifact holds every byte now: the cache gives them back.
        for f in &assembly.config.files {
            for c in &f.chunks {
                let _ = std::fs::remove_file(assembly.cache.path(c));
            }
        }
        Ok::<_, RegistryError>(timings)
    })
    .await
    .expect("the assembling thread does not panic")
}
/// Reassembles the files from the cache into a staging folder, checks them
/// against the manifest's content digests, seals and publishes.
fn assemble_and_publish(
    root: &Path,
    assembly: &Assembly,
    mut manifest: Manifest,
    timings: &mut PullTimings,
) -> Result<()> {
    let Assembly {
        cache,
        config,
        opened,
        threads,
    } = assembly;
    let phase = std::time::Instant::now();
    let name = manifest.name.clone();
    let _lock = ArtifactLock::exclusive(root, &name)?;
    let staging = Staging::new(root, &name)?;
    for f in &config.files {
        let dest = staging.dir.join(&f.path);
        let parent = dest.parent().expect("a checked path has a folder");
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| RegistryError::io(format!("pull: create {}", parent.display()), e))?;
        let mut out = File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)
            .map_err(|e| RegistryError::io(format!("pull: create {}", dest.display()), e))?;
        for c in &f.chunks {
            // A sealed artifact's chunk as it was opened; one in clear as
            // the cache holds it.
            let src = opened.get(c).cloned().unwrap_or_else(|| cache.path(c));
            copy_chunk(&src, &mut out, &dest)?;
        }
        chmod(&dest, f.mode)?;
    }
    timings.assemble = ms(phase);
    let phase = std::time::Instant::now();
    content::verify(&staging.dir, &manifest.contents, *threads)?;
    timings.verify = ms(phase);
    let phase = std::time::Instant::now();
    let key = HostKey::load_or_create(root)?;
    manifest.seal(&key);
    staging.publish(root, &manifest.to_bytes())?;
    timings.publish = ms(phase);
    Ok(())
}

fn chmod(dest: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(mode & 0o755))
        .map_err(|e| RegistryError::io(format!("pull: chmod {}", dest.display()), e))
}

/// Appends the cached chunk `src` to `out` as it is (an artifact in clear).
fn copy_chunk(src: &Path, out: &mut File, dest: &Path) -> Result<()> {
    let mut input = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)
        .map_err(|e| RegistryError::io(format!("pull: open {}", src.display()), e))?;
    std::io::copy(&mut input, out)
        .map_err(|e| RegistryError::io(format!("pull: write {}", dest.display()), e))?;
    Ok(())
}
