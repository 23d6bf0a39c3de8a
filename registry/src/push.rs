//! `vsnap push NAME REF`: an artifact of this host into a registry.
//!
//! Under the artifact's shared lock (no writer replaces or removes it
//! meanwhile): the manifest must verify with this host's key and every file
//! its content digests (a damaged artifact is never spread); the files are
//! cut by content, the chunks the registry lacks (HEAD) are uploaded a few
//! at a time, then the config blob and the manifest, tagged as REF says.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use vsnap_artifact::journal::{Op, Record};

use futures_util::{StreamExt, TryStreamExt};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::Serialize;
use vsnap_artifact::at_rest::FileCipher;
use vsnap_artifact::signature::FleetSigner;
use vsnap_artifact::{content, ArtifactLock, HostKey, Manifest};

use crate::blobs::{blob_exists, send_blob};
use crate::chunking::{chunk_file, PARAMS};
use crate::crypt::{FleetKeys, Sealer};
use crate::error::{RegistryError, Result};
use crate::index::{ArtifactConfig, FileEntry};
use crate::remote::Remote;
use crate::{
    sha256_digest, ARTIFACT_TYPE, CHUNK_MEDIA_TYPE, CHUNK_MEDIA_TYPE_ENCRYPTED, CONFIG_MEDIA_TYPE,
    CONFIG_MEDIA_TYPE_ENCRYPTED, ENCRYPTION_KEY_ANNOTATION, OCI_MANIFEST,
};

pub struct PushOptions {
    /// Uploads in flight at once.
    pub jobs: usize,
    /// Threads hashing the artifact's files before anything is sent.
    pub verify_threads: usize,
    /// The fleet key that signs the pushed manifest (`fleet_signing_key`);
    /// None pushes it unsigned (hosts that require a signature refuse it).
    pub signer: Option<FleetSigner>,
    /// The fleet encryption key (`fleet_encryption_key`) that seals every
    /// chunk and the config blob; None sends them in clear.
    pub encryption: Option<Sealer>,
}

impl PushOptions {
    /// Signed with the runtime config's `fleet_signing_key`, when it has one.
    pub fn from_config(
        config: &vsnap_config::RuntimeConfig,
        jobs: usize,
        verify_threads: usize,
    ) -> std::result::Result<Self, String> {
        let signer = match &config.fleet_signing_key {
            Some(path) => {
                Some(FleetSigner::load(path).map_err(|e| format!("fleet_signing_key: {e}"))?)
            }
            None => None,
        };
        let encryption = FleetKeys::from_config(config)?.current;
        Ok(PushOptions {
            jobs,
            verify_threads,
            signer,
            encryption,
        })
    }
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            jobs: 4,
            verify_threads: 2,
            signer: None,
            encryption: None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    pub name: String,
    pub reference: String,
    /// The OCI manifest's digest: `REPO@DIGEST` pulls exactly this.
    pub digest: String,
    pub files: usize,
    /// Bytes of the artifact's files.
    pub bytes: u64,
    /// Chunks of all files, and the distinct ones (the layers).
    pub chunks: usize,
    pub unique_chunks: usize,
    pub unique_bytes: u64,
    /// Layers sent, and those the registry already had.
    pub uploaded: usize,
    pub uploaded_bytes: u64,
    pub skipped: usize,
    pub skipped_bytes: u64,
    /// The fleet key id that signed it, and the tag holding the signature.
    pub signed_by: Option<String>,
    pub signature_tag: Option<String>,
    /// The fleet encryption key id everything was sealed with; None: sent
    /// in clear.
    pub encrypted_with: Option<String>,
}

/// Where one layer's bytes are read from (`len` bytes of the file), and
/// the layer's size (sealed: larger by the envelope).
#[derive(Clone)]
struct Source {
    path: PathBuf,
    offset: u64,
    len: u64,
    size: u64,
    /// The file's cipher where it is sealed at rest: a registry's chunks
    /// are of the plaintext (the fleet's dedupe and encryption work on it).
    sealed: Option<FileCipher>,
}

/// Pushes the artifact `name` of `root` to `remote`; the outcome and the
/// bytes uploaded go to the metrics journal of `root`.
pub async fn push(
    root: &Path,
    name: &str,
    remote: &Remote,
    opts: &PushOptions,
) -> Result<PushReport> {
    let started = std::time::Instant::now();
    let pushed = push_unrecorded(root, name, remote, opts).await;
    let seconds = started.elapsed().as_secs_f64();
    let record = match &pushed {
        Ok(r) => Record::now(Op::Push, name, true, seconds).bytes(r.uploaded_bytes),
        Err(_) => Record::now(Op::Push, name, false, seconds).failed_in("push"),
    };
    crate::journal::record(root, record).await;
    pushed
}

async fn push_unrecorded(
    root: &Path,
    name: &str,
    remote: &Remote,
    opts: &PushOptions,
) -> Result<PushReport> {
    check_target(name, remote)?;
    let _lock = ArtifactLock::shared(root, name)?;
    let (manifest, files, layers) = {
        let (root, name, threads) = (root.to_path_buf(), name.to_string(), opts.verify_threads);
        let sealer = opts.encryption.clone();
        tokio::task::spawn_blocking(move || describe(&root, &name, threads, sealer.as_ref()))
            .await
            .expect("the describing thread does not panic")?
    };
    let config = ArtifactConfig::new(&manifest, PARAMS, files);
    let mut report = new_report(name, remote, &config, &layers);
    report.encrypted_with = opts.encryption.as_ref().map(|s| s.key_id().to_string());
    remote.login(oci_client::RegistryOperation::Push).await?;

    let sealer = opts.encryption.as_ref();
    upload_layers(remote, &layers, opts.jobs, sealer, &mut report).await?;
    let config_descriptor = send_config(remote, &config, sealer).await?;
    let oci = oci_manifest(config_descriptor, &layers, &manifest.name, sealer);
    let body = serde_json::to_vec(&oci).expect("a manifest serializes");
    let size = body.len();
    report.digest = sha256_digest(&body);
    // The signature goes first: a host that pulls the tag the moment it
    // moves finds the signature already there.
    if let Some(signer) = &opts.signer {
        let signature = signer.sign(&crate::signature::payload(&report.digest));
        crate::signature::attach(remote, &report.digest, size, &signature).await?;
        report.signed_by = Some(signature.key_id);
        report.signature_tag = Some(crate::signature::tag(&report.digest));
    }
    let tag = remote.reference.tag().unwrap_or("latest");
    remote
        .client
        .push_manifest(tag, body, OCI_MANIFEST)
        .await
        .map_err(|e| RegistryError::registry(format!("push: manifest {}", remote.name()), e))?;
    Ok(report)
}

/// A valid artifact name, and a reference that names a tag to move.
fn check_target(name: &str, remote: &Remote) -> Result<()> {
    vsnap_artifact::layout::check_name(name).map_err(RegistryError::Invalid)?;
    if remote.reference.digest().is_some() {
        return Err(RegistryError::Invalid(format!(
            "push: {}: name a tag, not a digest",
            remote.name()
        )));
    }
    Ok(())
}

/// The report's sizes and counts, before anything is sent.
fn new_report(
    name: &str,
    remote: &Remote,
    config: &ArtifactConfig,
    layers: &BTreeMap<String, Source>,
) -> PushReport {
    PushReport {
        name: name.to_string(),
        reference: remote.name(),
        digest: String::new(),
        files: config.files.len(),
        bytes: config.files.iter().map(|f| f.size).sum(),
        chunks: config.files.iter().map(|f| f.chunks.len()).sum(),
        unique_chunks: layers.len(),
        unique_bytes: layers.values().map(|s| s.size).sum(),
        uploaded: 0,
        uploaded_bytes: 0,
        skipped: 0,
        skipped_bytes: 0,
        signed_by: None,
        signature_tag: None,
        encrypted_with: None,
    }
}

/// Sends the chunks the registry lacks, `jobs` at a time, counting those
/// sent and those skipped in `report`.
async fn upload_layers(
    remote: &Remote,
    layers: &BTreeMap<String, Source>,
    jobs: usize,
    sealer: Option<&Sealer>,
    report: &mut PushReport,
) -> Result<()> {
    let uploads: Vec<(bool, u64)> = futures_util::stream::iter(layers.iter())
        .map(|(digest, source)| upload(remote, digest, source, sealer))
        .buffer_unordered(jobs.max(1))
        .try_collect()
        .await?;
    for (sent, len) in uploads {
        if sent {
            report.uploaded += 1;
            report.uploaded_bytes += len;
        } else {
            report.skipped += 1;
            report.skipped_bytes += len;
        }
    }
    Ok(())
}

/// Sends the artifact config blob (sealed with `sealer` when given) unless
/// the registry has it; returns its descriptor.
async fn send_config(
    remote: &Remote,
    config: &ArtifactConfig,
    sealer: Option<&Sealer>,
) -> Result<OciDescriptor> {
    let config_bytes = match sealer {
        Some(s) => s.seal(&config.to_bytes()),
        None => config.to_bytes(),
    };
    let config_digest = sha256_digest(&config_bytes);
    if !blob_exists(remote, &config_digest).await? {
        send_blob(
            remote,
            &config_digest,
            config_bytes.clone(),
            "the artifact config",
        )
        .await?;
    }
    Ok(OciDescriptor {
        media_type: match sealer {
            Some(_) => CONFIG_MEDIA_TYPE_ENCRYPTED,
            None => CONFIG_MEDIA_TYPE,
        }
        .into(),
        digest: config_digest,
        size: config_bytes.len() as i64,
        ..Default::default()
    })
}

/// The OCI manifest: the config, one layer per distinct chunk, titled by
/// the artifact's name; sealed, the media types say so, the annotations
/// name the encryption key's id and not the artifact (its name is in the
/// sealed config).
fn oci_manifest(
    config: OciDescriptor,
    layers: &BTreeMap<String, Source>,
    title: &str,
    sealer: Option<&Sealer>,
) -> OciImageManifest {
    let (chunk_type, annotation) = match sealer {
        Some(s) => (
            CHUNK_MEDIA_TYPE_ENCRYPTED,
            (ENCRYPTION_KEY_ANNOTATION, s.key_id()),
        ),
        None => (CHUNK_MEDIA_TYPE, ("org.opencontainers.image.title", title)),
    };
    OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.into()),
        artifact_type: Some(ARTIFACT_TYPE.into()),
        config,
        layers: layers
            .iter()
            .map(|(digest, s)| OciDescriptor {
                media_type: chunk_type.into(),
                digest: digest.clone(),
                size: s.size as i64,
                ..Default::default()
            })
            .collect(),
        subject: None,
        annotations: Some([(annotation.0.to_string(), annotation.1.to_string())].into()),
    }
}

/// Checks the artifact and cuts its files: the manifest, the file index and
/// every distinct chunk with where to read it (first occurrence), in order.
fn describe(
    root: &Path,
    name: &str,
    threads: usize,
    sealer: Option<&Sealer>,
) -> Result<(Manifest, Vec<FileEntry>, BTreeMap<String, Source>)> {
    let manifest = Manifest::load_verified(root, name)?;
    let dir = vsnap_artifact::path(root, name);
    let opener = match &manifest.sealed {
        Some(s) => Some(s.opener(&HostKey::load(root)?)?),
        None => None,
    };
    content::verify_opened(&dir, &manifest.contents, threads, opener.as_ref())?;
    let mut files = Vec::new();
    let mut layers: BTreeMap<String, Source> = BTreeMap::new();
    for (rel, recorded) in &manifest.contents {
        let path = dir.join(rel);
        let opened = opener.as_ref().and_then(|o| o.file(rel));
        let (pieces, size) = chunk_file(&path, PARAMS, sealer, opened.as_ref())
            .map_err(|e| RegistryError::io(format!("push: read {}", path.display()), e))?;
        if size != recorded.size {
            return Err(RegistryError::Damaged(format!(
                "{}: {rel} changed while it was read",
                dir.display()
            )));
        }
        let mode = std::fs::symlink_metadata(&path)
            .map_err(|e| RegistryError::io(format!("push: stat {}", path.display()), e))?
            .mode()
            & 0o777;
        let mut chunks = Vec::with_capacity(pieces.len());
        for p in pieces {
            layers.entry(p.digest.clone()).or_insert(Source {
                path: path.clone(),
                offset: p.offset,
                len: p.len,
                size: p.size,
                sealed: opened.clone(),
            });
            chunks.push(p.digest);
        }
        files.push(FileEntry {
            path: rel.clone(),
            mode,
            size,
            chunks,
        });
    }
    Ok((manifest, files, layers))
}

/// Sends one chunk (sealed with `sealer` when given) unless the registry
/// has it; returns (sent, layer bytes).
async fn upload(
    remote: &Remote,
    digest: &str,
    source: &Source,
    sealer: Option<&Sealer>,
) -> Result<(bool, u64)> {
    if blob_exists(remote, digest).await? {
        return Ok((false, source.size));
    }
    let s = source.clone();
    let sealer = sealer.cloned();
    let bytes = tokio::task::spawn_blocking(move || {
        let plain = read_range(&s)?;
        Ok::<_, RegistryError>(match sealer {
            Some(sealer) => sealer.seal(&plain),
            None => plain,
        })
    })
    .await
    .expect("the reading thread does not panic")?;
    send_blob(remote, digest, bytes, &source.path.display().to_string()).await?;
    Ok((true, source.size))
}

fn read_range(s: &Source) -> Result<Vec<u8>> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&s.path)
        .map_err(|e| RegistryError::io(format!("push: open {}", s.path.display()), e))?;
    let mut buf = vec![0u8; s.len as usize];
    file.read_exact_at(&mut buf, s.offset)
        .map_err(|e| RegistryError::io(format!("push: read {}", s.path.display()), e))?;
    if let Some(c) = &s.sealed {
        c.apply(s.offset, &mut buf);
    }
    Ok(buf)
}
