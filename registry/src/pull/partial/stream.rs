//! What a restore streaming from this pull needs of it: the record of
//! arrivals it follows, the chunks CRIU reads itself told apart from those
//! only vsnap's page server reads (which may land after CRIU started), and
//! the sealed manifest in the tree before the last chunk landed.

use std::collections::BTreeMap;
use std::path::Path;

use oci_client::manifest::OciDescriptor;
use vsnap_artifact::arrivals::{self, Arrival};
use vsnap_artifact::layout::{write_synced, MANIFEST};
use vsnap_artifact::{HostKey, Manifest};

use super::{io, Partial};
use crate::error::Result;

/// Per pages file, the merged `[start, end)` spans only the page server
/// reads (`vsnap_pages::lazy_spans`).
pub(crate) type LazySpans = BTreeMap<String, Vec<(u64, u64)>>;

impl Partial {
    /// Records each place of the landed chunk `digest` as arrived.
    pub(super) fn record_arrival(&self, digest: &str) -> Result<()> {
        let places = self.places.get(digest).map(Vec::as_slice).unwrap_or(&[]);
        let lines: Vec<Arrival> = places
            .iter()
            .map(|p| Arrival::now(&self.names[p.file], p.offset, p.len))
            .collect();
        let mut record = self.arrived.lock().expect("not poisoned");
        arrivals::append(&mut record, &lines).map_err(|e| {
            let path = self.at.dir.join(arrivals::FILE);
            io(format!("pull: write {}", path.display()), e)
        })
    }

    /// The tree being written: what a streamed restore reads.
    pub(crate) fn tree(&self) -> &Path {
        &self.at.tree
    }

    /// Writes `manifest` into the tree, as the publish will (with this
    /// host's sealing at rest, MAC'd with `key`), before the publish: for a
    /// restore that reads the tree while it is written. An earlier
    /// streamed pull that died left one: it goes first.
    pub(crate) fn put_manifest(&self, mut manifest: Manifest, key: &HostKey) -> Result<()> {
        manifest.sealed = self.at_rest.as_ref().map(|s| s.sealed.clone());
        manifest.seal(key);
        let sealed = manifest.to_bytes();
        let path = self.at.tree.join(MANIFEST);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("pull: remove {}", path.display()), e)),
        }
        write_synced(&path, &sealed).map_err(Into::into)
    }

    /// Whether a place of layer `digest` holds a byte `wanted` asks for.
    pub(crate) fn wanted(&self, digest: &str, wanted: &arrivals::Coverage) -> bool {
        let places = self.places.get(digest).map(Vec::as_slice).unwrap_or(&[]);
        places
            .iter()
            .any(|p| wanted.touches(&self.names[p.file], p.offset, p.offset + p.len))
    }

    /// Splits `layers` into those with a place CRIU reads and the rest,
    /// which only the page server reads: every place of them lies in the
    /// `lazy` spans of a pages file. Both keep their order.
    pub(crate) fn split_lazy<'l>(
        &self,
        layers: Vec<&'l OciDescriptor>,
        lazy: Option<&LazySpans>,
    ) -> (Vec<&'l OciDescriptor>, Vec<&'l OciDescriptor>) {
        layers.into_iter().partition(|l| {
            let places = self.places.get(&l.digest).map(Vec::as_slice).unwrap_or(&[]);
            !places.iter().all(|p| {
                let name = self.names[p.file].as_str();
                match lazy {
                    // Before the images are here: only a pages file's
                    // chunks can wait.
                    None => is_pages_file(name),
                    Some(spans) => spans
                        .get(name)
                        .is_some_and(|s| within(s, p.offset, p.offset + p.len)),
                }
            })
        })
    }
}

/// `images/pages-<id>.img`: a pages file CRIU's images name.
fn is_pages_file(name: &str) -> bool {
    name.strip_prefix("images/pages-")
        .and_then(|n| n.strip_suffix(".img"))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `[start, end)` lies inside one of `spans` (sorted, disjoint).
fn within(spans: &[(u64, u64)], start: u64, end: u64) -> bool {
    let i = spans.partition_point(|&(_, e)| e <= start);
    spans.get(i).is_some_and(|&(s, e)| s <= start && end <= e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_waits_only_inside_one_lazy_span() {
        let spans = [(0, 100), (200, 300)];
        assert!(within(&spans, 0, 100) && within(&spans, 210, 220));
        assert!(!within(&spans, 90, 110), "straddles the end of a span");
        assert!(!within(&spans, 100, 200) && !within(&spans, 350, 360));
        assert!(!within(&[], 0, 1));
    }

    #[test]
    fn only_pages_files_are_pages_files() {
        assert!(is_pages_file("images/pages-1.img"));
        assert!(is_pages_file("images/pages-12.img"));
        for n in [
            "images/pagemap-1.img",
            "images/pages-.img",
            "images/pages-1a.img",
            "pages-1.img",
            "images/mm-1.img",
        ] {
            assert!(!is_pages_file(n), "{n}");
        }
    }
}
