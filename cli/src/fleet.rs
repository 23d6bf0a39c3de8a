//! `vsnap push NAME REF` and `vsnap pull REF [NAME]`: thin wrappers over
//! vsnap-registry (docs/fleet.md). Credentials come from the runtime
//! config's `[registries."host:port"]`, never from the command line; the
//! registry's mirrors from containerd's `hosts.toml` under the runtime
//! config's `registry_config_path`.

use vsnap_registry::{PullOptions, PushOptions, RegistryError, Remote};

use crate::units::human_size;
use crate::{emit, emit_json, Ctx, Outcome, FAILED, OK};

/// Threads hashing beside the transfers: every core but one.
fn hashing_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get().saturating_sub(1).max(1))
        .unwrap_or(1)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

pub fn push(ctx: &Ctx, name: &str, reference: &str, jobs: usize, json: bool) -> Outcome {
    crate::store::check_name(name)?;
    let remote = Remote::from_config(reference, &ctx.config).map_err(|e| format!("push: {e}"))?;
    let opts = PushOptions::from_config(&ctx.config, jobs, hashing_threads())?;
    if opts.encryption.is_none() {
        crate::warn(&format!(
            "push {name}: no fleet_encryption_key is configured: the artifact (the engine's memory, its secrets included) is sent to {reference} in clear"
        ));
    }
    let result = runtime()?.block_on(vsnap_registry::push(&ctx.root, name, &remote, &opts));
    match result {
        Ok(r) if json => {
            emit_json(&r);
            Ok(OK)
        }
        Ok(r) => {
            emit(&format!(
                "pushed {} to {}\ndigest:  {}\nsigned:  {}\nsealed:  {}\nfiles:   {} ({})\nchunks:  {} ({} distinct, {})\nsent:    {} chunks ({}); {} the registry had ({})\n",
                r.name,
                r.reference,
                r.digest,
                match (&r.signed_by, &r.signature_tag) {
                    (Some(key), Some(tag)) => format!("by {key} (tag {tag})"),
                    _ => "no (no fleet_signing_key configured)".to_string(),
                },
                match &r.encrypted_with {
                    Some(key) => format!("encrypted with {key}"),
                    None => "no: sent in clear (no fleet_encryption_key configured)".to_string(),
                },
                r.files,
                human_size(r.bytes),
                r.chunks,
                r.unique_chunks,
                human_size(r.unique_bytes),
                r.uploaded,
                human_size(r.uploaded_bytes),
                r.skipped,
                human_size(r.skipped_bytes),
            ));
            Ok(OK)
        }
        Err(e) => failed(format!("push {name}: {e}"), &e),
    }
}

pub fn pull(
    ctx: &Ctx,
    (reference, name): (&str, Option<&str>),
    jobs: usize,
    json: bool,
    stream_fd: Option<i32>,
) -> Outcome {
    if let Some(name) = name {
        crate::store::check_name(name)?;
    }
    let remote = Remote::from_config(reference, &ctx.config).map_err(|e| format!("pull: {e}"))?;
    let mut opts = PullOptions::from_config(&ctx.config, jobs, hashing_threads())?;
    opts.stream = stream_fd.map(stream).transpose()?;
    let result = runtime()?.block_on(vsnap_registry::pull(&ctx.root, name, &remote, &opts));
    match result {
        Ok(r) if json => {
            emit_json(&r);
            Ok(OK)
        }
        Ok(r) => {
            emit(&format!(
                "pulled {} as {} ({})\ndigest:  {}\nsigned:  by {} (trusted)\nsealed:  {}\nfiles:   {} ({})\nchunks:  {}: {} fetched ({}), {} landed by an interrupted pull ({})\ntime:    resolve {} ms, fetch {} ms, assemble {} ms, verify {} ms, publish {} ms\n",
                r.reference,
                r.name,
                r.path,
                r.digest,
                r.signed_by,
                match &r.decrypted_with {
                    Some(key) => format!("decrypted with {key}"),
                    None => "no: stored in clear".to_string(),
                },
                r.files,
                human_size(r.bytes),
                r.chunks,
                r.fetched,
                human_size(r.fetched_bytes),
                r.reused,
                human_size(r.reused_bytes),
                r.timings_ms.resolve,
                r.timings_ms.fetch,
                r.timings_ms.assemble,
                r.timings_ms.verify,
                r.timings_ms.publish,
            ));
            Ok(OK)
        }
        Err(e) => failed(format!("pull {reference}: {e}"), &e),
    }
}

/// A pull a restore follows: the head announced on stdout as a line
/// `{"head": TREE}`, the publish held until descriptor `fd` ends.
fn stream(fd: i32) -> Result<vsnap_registry::pull::Stream, String> {
    use std::io::Write;
    use std::os::fd::{FromRawFd, OwnedFd};
    // Only a descriptor this process holds: fcntl says whether it is one.
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!(
            "pull: --stream-fd {fd}: not an open descriptor of this process"
        ));
    }
    // SAFETY: an open descriptor (checked above) that nothing else in this
    // process owns: the caller handed it over for this purpose.
    let gate = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(vsnap_registry::pull::Stream {
        on_head: Box::new(|tree| {
            let line = serde_json::json!({ "head": tree });
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }),
        gate: Some(gate),
    })
}

/// A refused artifact (damaged, invalid, unsafe, in use) exits 1; a
/// registry, network, credentials or I/O failure ends the command (2).
fn failed(message: String, e: &RegistryError) -> Outcome {
    match e {
        RegistryError::Damaged(_)
        | RegistryError::Invalid(_)
        | RegistryError::Untrusted(_)
        | RegistryError::Key(_)
        | RegistryError::Artifact(_) => {
            crate::warn(&message);
            Ok(FAILED)
        }
        _ => Err(message),
    }
}
