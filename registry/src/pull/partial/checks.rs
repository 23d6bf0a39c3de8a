//! The tree checked while it lands: each content chunk of the manifest
//! (`vsnap_artifact::content::CHUNK` bytes of a covered file) is hashed
//! and checked against its digest as soon as the last of its bytes landed,
//! on the landing thread, while the other chunks are still on their way.
//! The publish then hashes only what was not checked so (the chunks a
//! resumed pull found landed), instead of every byte once the fetch ended.
//!
//! Bytes are written once and nothing writes a landed place again (a
//! resumed pull's own rewrite of a chunk is of the same bytes), so a chunk
//! checked here is the chunk the publish would have read.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;

use vsnap_artifact::at_rest::FileCipher;
use vsnap_artifact::content::{self, Contents, CHUNK};

use crate::error::Result;

/// What of a tree is still to land and what was checked.
pub(super) struct Checks {
    contents: Contents,
    /// Each file of the tree as the artifact names it (the config's order).
    names: Vec<String>,
    state: Mutex<State>,
}

struct State {
    /// Per file (the config's order), per content chunk: bytes not landed.
    /// Empty for a file the manifest does not cover.
    left: Vec<Vec<u64>>,
    /// The layers counted already (a layer lands once).
    counted: BTreeSet<String>,
    /// (file, chunk) checked against its digest.
    checked: BTreeSet<(usize, usize)>,
}

impl Checks {
    /// Nothing landed of the files `names` (the config's order), checked
    /// against `contents`.
    pub(super) fn new(contents: Contents, names: Vec<String>) -> Self {
        let left = names
            .iter()
            .map(|n| match contents.get(n) {
                Some(d) => (0..d.size.div_ceil(CHUNK))
                    .map(|c| (d.size - c * CHUNK).min(CHUNK))
                    .collect(),
                None => Vec::new(),
            })
            .collect();
        Checks {
            contents,
            names,
            state: Mutex::new(State {
                left,
                counted: BTreeSet::new(),
                checked: BTreeSet::new(),
            }),
        }
    }

    /// Layer `digest` landed at `places` (file, offset, length): the
    /// content chunks it made whole.
    pub(super) fn landed(
        &self,
        digest: &str,
        places: impl IntoIterator<Item = (usize, u64, u64)>,
    ) -> Vec<(usize, usize)> {
        let mut s = self.state.lock().expect("not poisoned");
        if !s.counted.insert(digest.to_string()) {
            return Vec::new();
        }
        let mut whole = Vec::new();
        for (file, offset, len) in places {
            let Some(chunks) = s.left.get_mut(file).filter(|c| !c.is_empty()) else {
                continue;
            };
            let end = offset + len;
            let first = (offset / CHUNK) as usize;
            for (c, left) in chunks.iter_mut().enumerate().skip(first) {
                let (start, stop) = (c as u64 * CHUNK, (c as u64 + 1) * CHUNK);
                if start >= end {
                    break;
                }
                let overlap = end.min(stop) - offset.max(start);
                *left = left.saturating_sub(overlap);
                if *left == 0 && overlap > 0 {
                    whole.push((file, c));
                }
            }
        }
        whole
    }

    /// Chunk `chunk` of file `file` of `tree` checked against its digest
    /// (opened with `cipher` where sealed at rest); recorded when it holds.
    pub(super) fn check(
        &self,
        tree: &Path,
        (file, chunk): (usize, usize),
        cipher: Option<&FileCipher>,
    ) -> Result<()> {
        let rel = &self.names[file];
        content::verify_chunk(tree, rel, &self.contents[rel], chunk, cipher)?;
        let mut s = self.state.lock().expect("not poisoned");
        s.checked.insert((file, chunk));
        Ok(())
    }

    /// Whether chunk `chunk` of the file the artifact names `rel` was
    /// checked.
    pub(super) fn checked(&self, rel: &str, chunk: usize) -> bool {
        let Some(file) = self.names.iter().position(|n| n == rel) else {
            return false;
        };
        let s = self.state.lock().expect("not poisoned");
        s.checked.contains(&(file, chunk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vsnap_artifact::content::FileDigest;

    fn digest(size: u64) -> FileDigest {
        FileDigest {
            size,
            chunks: vec![String::new(); size.div_ceil(CHUNK) as usize],
        }
    }

    fn place(file: usize, offset: u64, len: u64) -> [(usize, u64, u64); 1] {
        [(file, offset, len)]
    }

    #[test]
    fn a_content_chunk_is_whole_when_its_last_byte_landed() {
        let contents: Contents = [
            ("images/pages-1.img".to_string(), digest(CHUNK + 10)),
            ("control/ready.json".to_string(), digest(5)),
        ]
        .into();
        let names = vec![
            "images/pages-1.img".to_string(),
            "work/out.log".to_string(),
            "control/ready.json".to_string(),
        ];
        let c = Checks::new(contents, names);
        let half = CHUNK / 2;
        assert!(c.landed("a", place(0, 0, half)).is_empty());
        // Across the chunks' border: chunk 0 whole, chunk 1 not yet.
        assert_eq!(c.landed("b", place(0, half, half + 4)), [(0, 0)]);
        // A layer counted once, whatever it is landed again.
        assert!(c.landed("b", place(0, half, half + 4)).is_empty());
        // A file the manifest does not cover is never checked.
        assert_eq!(c.landed("c", [(1, 0, 6), (0, CHUNK + 4, 6)]), [(0, 1)]);
        assert_eq!(c.landed("d", place(2, 0, 5)), [(2, 0)]);
    }
}
