//! The shim's side of its page server (the `vsnap-pages` crate): the one
//! plan a restore's preflight makes of the runtime config and the
//! artifact, carried whole in the restore plan to the `runc restore` job,
//! which starts the server with it (`lifecycle/restore/job.rs` reports
//! the server's errors as the shim's).

use std::path::Path;

use vsnap_artifact::at_rest::Opener;
use vsnap_artifact::Contents;
use vsnap_config::RuntimeConfig;
use vsnap_pages::{PagePlan, Sharing, Verification};

/// The page placement of a restore of the artifact in `dir`: a filler
/// per core under the host's filler budget (`runtime_dir`), huge pages
/// as `huge_pages` says, every task's pages file checked against its
/// digest of `contents` (with `verify_contents`) as it is placed, and,
/// with `share_pages`, what is checked shared with the other restores
/// of the artifact under way (`mac`, the sealed manifest's, names its
/// bytes to them); the pages files opened with `sealed` where they are
/// sealed at rest.
pub fn plan(
    config: &RuntimeConfig,
    dir: &Path,
    contents: Option<&Contents>,
    mac: &str,
    sealed: Option<Opener>,
) -> PagePlan {
    let verification = contents.and_then(|c| match Verification::of_tasks(dir, c) {
        Ok(v) => Some(v),
        Err(e) => {
            // The restore's own verification then names a damaged pagemap.
            log::warn!("restore: page server: {e}: every file is verified apart");
            None
        }
    });
    // Only what is verified is shared: the leader hands on chunks it
    // checked against the digests.
    let share = (config.share_pages && verification.is_some())
        .then(|| Sharing::new(&config.runtime_dir, mac, dir));
    PagePlan {
        share,
        huge: config.huge_pages,
        verification,
        sealed,
        ..PagePlan::on_host(dir.join("images"), &config.runtime_dir)
    }
}
