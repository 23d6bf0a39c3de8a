//! What a restore's page server is to do, decided once before CRIU
//! starts (the shim makes it in its restore preflight) and handed whole
//! to [`crate::PageServer::start`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use vsnap_config::HugePages;

use crate::arrivals::Arrivals;
use crate::budget::MAX_SLOTS;
use crate::share::Sharing;
use crate::verify::Verification;

/// One restore's page placement.
#[derive(Debug, Clone)]
pub struct PagePlan {
    /// The image folder CRIU restores from: each task's pagemap, VMAs
    /// (`mm-<pid>.img`) and pages file.
    pub images: PathBuf,
    /// The fillers this restore runs (at least one).
    pub threads: usize,
    /// The host's filler budget, shared by every restore's server: a
    /// filler places a chunk only while it holds one of its slots. None:
    /// the fillers place at will.
    pub budget: Option<FillerBudget>,
    /// Where the restores of this artifact under way at once share the
    /// reading and hashing of its pages (only with `verification`). None:
    /// this one reads them alone.
    pub share: Option<Sharing>,
    /// Which memory eligible for huge pages is placed so.
    pub huge: HugePages,
    /// The pages files checked against their digests as they are placed.
    /// None: placed unchecked (the restore checks them some other way, or
    /// not at all).
    pub verification: Option<Verification>,
    /// Where the images still arrive (a restore streamed from a
    /// registry): each span of a pages file is read once it arrived.
    /// None: every byte is in place.
    pub arrivals: Option<Arc<Arrivals>>,
    /// What opens the pages files sealed at rest (the manifest's `sealed`
    /// with this host's key): each piece is opened in the filler's buffer
    /// as it is read, before it is hashed and placed. None: in clear.
    pub sealed: Option<vsnap_artifact::at_rest::Opener>,
}

/// The host's filler budget: `slots` slots (at most
/// [`MAX_FILLERS`](crate::MAX_FILLERS)) in the folder `dir`, made
/// root-only when the server starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FillerBudget {
    pub dir: PathBuf,
    pub slots: usize,
}

impl PagePlan {
    /// The restore of `images` by `threads` fillers: no budget, alone,
    /// unchecked, huge pages as the default policy says.
    pub fn new(images: impl Into<PathBuf>, threads: usize) -> Self {
        PagePlan {
            images: images.into(),
            threads,
            budget: None,
            share: None,
            huge: HugePages::default(),
            verification: None,
            arrivals: None,
            sealed: None,
        }
    }

    /// The restore of `images` on this host: a filler per core (at most
    /// [`MAX_FILLERS`](crate::MAX_FILLERS)), each taking its slots of the
    /// host's budget under `runtime_dir` (`fillers/`, one slot per core
    /// for the whole host: eight restores at once run as many fillers
    /// together as one alone).
    pub fn on_host(images: impl Into<PathBuf>, runtime_dir: &Path) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = cores.min(MAX_SLOTS);
        PagePlan {
            budget: Some(FillerBudget {
                dir: runtime_dir.join("fillers"),
                slots: threads,
            }),
            ..PagePlan::new(images, threads)
        }
    }

    /// The pages files the server checks itself (the artifact's names):
    /// the restore's other verification leaves them to it.
    pub fn verified_files(&self) -> Vec<String> {
        let v = self.verification.iter();
        v.flat_map(|v| v.names().map(str::to_string)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_plan_runs_a_filler_per_core_under_the_hosts_budget() {
        let p = PagePlan::on_host("/a/images", Path::new("/run/vsnap"));
        assert!((1..=MAX_SLOTS).contains(&p.threads), "{p:?}");
        let budget = p.budget.as_ref().expect("a budget");
        assert_eq!(budget.dir, Path::new("/run/vsnap/fillers"));
        assert_eq!(budget.slots, p.threads, "a slot per core for the host");
        assert!(p.share.is_none() && p.verification.is_none());
        assert!(p.verified_files().is_empty());
    }
}
