//! The barrier profile's wake-up (released vLLM): write the release file,
//! wait for the listener, then check the canary over HTTP. A copy that must
//! not run gets the abort marker, so it never binds.

use std::path::Path;

use vsnap_protocol::{abort_release_for, read_json, release_for, Oracle, ReadyFile};

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::snapshot::activation::canary::{self, ApiKey};
use crate::snapshot::activation::target::Target;
use crate::snapshot::activation::wake::{in_netns, probe_listener};

/// Releases the engine waiting behind `ready`/`release_file` and returns once
/// it listens and reproduced its canary (asked with `api_key` when its API
/// requires one). On failure the abort marker is left behind (for an engine
/// still waiting) and the error names `phase`.
pub fn release_and_check(
    phase: &str,
    ready: &Path,
    release_file: &Path,
    t: &Target,
    deadline: &Deadline,
    trusted: Option<Oracle>,
    api_key: Option<ApiKey>,
) -> Result<()> {
    let (host, port, pid) = (t.host.clone(), t.port, t.pid);
    let fail = |m: String| deadline.fail(format!("{phase}: {m}"));
    let oracle = match read_json::<ReadyFile>(ready) {
        // A restore holds the copy to the manifest's oracle; the ready file
        // only has to be there (the engine waits behind it).
        Ok(Some(r)) => trusted.unwrap_or_else(|| r.value.oracle()),
        Ok(None) => {
            return Err(abort(
                release_file,
                fail(format!("{} is missing", ready.display())),
            ))
        }
        Err(e) => return Err(abort(release_file, fail(e.to_string()))),
    };
    let identity = super::identity::of_process(pid).map_err(&fail)?;
    release_for(
        release_file,
        host.clone(),
        port,
        Some(identity),
        reader(release_file),
    )
    .map_err(|e| fail(format!("release: {e}")))?;
    let addr = probe_listener(pid, host.as_deref(), port, deadline.at)
        .map_err(|e| fail(format!("listener: {e}")))?;
    in_netns(pid, move || {
        canary::check(addr, &oracle, api_key.as_ref().map(ApiKey::expose))
    })
    .map_err(|e| fail(format!("canary: {e}")))
}

/// Writes the abort marker (best effort) and passes `e` on.
pub fn abort(release_file: &Path, e: Error) -> Error {
    if !release_file.exists() {
        let _ = abort_release_for(release_file, reader(release_file));
    }
    e
}

/// Who reads the release file: the engine, whose user owns the control dir
/// the file is in (mod.rs `control_owner`); `None` when that is vsnap's own.
fn reader(release_file: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let dir = release_file.parent()?;
    let owner = std::fs::symlink_metadata(dir).ok()?.uid();
    (owner != vsnap_protocol::euid()).then_some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_ready_file_leaves_the_abort_marker() {
        let dir = tempfile::tempdir().unwrap();
        let deadline = Deadline::new(
            std::time::Instant::now() + std::time::Duration::from_secs(1),
            "a test deadline",
        );
        let release_file = dir.path().join("release.json");
        let err = release_and_check(
            "restore",
            &dir.path().join("ready.json"),
            &release_file,
            &Target {
                container: "c1".into(),
                pid: 1,
                control_dir: dir.path().to_path_buf(),
                owner: 0,
                host: None,
                port: 80,
            },
            &deadline,
            None,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("restore: ") && err.contains("ready.json is missing"),
            "{err}"
        );
        let marker: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&release_file).unwrap()).unwrap();
        assert_eq!(marker, serde_json::json!({"release": false}));
    }

    /// An engine that runs as another user must be able to read the marker.
    #[test]
    fn the_abort_marker_belongs_to_the_control_dirs_user() {
        use std::os::unix::fs::MetadataExt;
        if vsnap_protocol::euid() != 0 {
            eprintln!("skipped: needs root to hand files to another uid");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let control = vsnap_protocol::ControlDir::create_owned_by(
            dir.path().join("control"),
            54321,
            Some(54321),
        )
        .unwrap();
        let release_file = control.file("release.json");
        let e = abort(&release_file, Error::Other("x".into()));
        assert_eq!(e.to_string(), Error::Other("x".into()).to_string());
        assert_eq!(std::fs::metadata(&release_file).unwrap().uid(), 54321);
        // In vsnap's own folder, vsnap's own file.
        let mine = dir.path().join("release.json");
        abort(&mine, Error::Other("x".into()));
        assert_eq!(std::fs::metadata(&mine).unwrap().uid(), 0);
    }
}
