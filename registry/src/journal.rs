//! Pulls and pushes in the metrics journal of the artifact root
//! (vsnap_artifact::journal), for `vsnap metrics`. A journal that cannot be
//! written never fails the transfer: it is said on stderr.

use std::path::Path;

use vsnap_artifact::journal::Record;

use crate::remote::Remote;

/// Appends `r` to the journal of `root` from a blocking thread.
pub async fn record(root: &Path, r: Record) {
    let root = root.to_path_buf();
    let written =
        tokio::task::spawn_blocking(move || vsnap_artifact::journal::record(&root, &r)).await;
    if let Ok(Err(e)) = written {
        eprintln!("vsnap: {e}");
    }
}

/// The label of a pull that failed before its artifact's name was known:
/// the last component of the reference's repository.
pub fn repository_name(remote: &Remote) -> String {
    let repo = remote.reference.repository();
    repo.rsplit('/').next().unwrap_or(repo).to_string()
}
