//! The metrics journal: every restore, capture, pull and push outcome,
//! kept on the host under `<artifact root>/.journal/` (0700, root's; its
//! files 0600) so that counters survive restarts of the shim and of
//! `vsnap metrics`.
//!
//! Layout: `records-<seq>.log` segments, appended to (the highest `seq` is
//! the active one), and `totals.json`, the checkpoint of every record
//! rotated out. Why appended lines and not a file per record: one small
//! `write` per outcome, no directory of thousands of files to list at each
//! scrape, and a torn record (a writer killed mid-write) is confined to its
//! own line: each line carries its length and a checksum and is skipped
//! alone when either does not match, and a writer that finds the segment
//! not ending in a newline ends the torn line first, so no earlier or later
//! record is lost.
//!
//! Bounded: when the active segment passes its size limit, its records are
//! folded into `totals.json` (written whole to a temporary file, fsynced,
//! renamed), which names the last segment it holds (`folded_through`);
//! only then are the folded segments removed. A crash between the two
//! leaves segments the totals already hold: readers skip them and the next
//! rotation removes them, so nothing is counted twice and no counter goes
//! backwards. Writers hold an exclusive `flock` on `.journal/lock`, readers
//! a shared one, so a reader never sees a rotation half done.

mod record;
mod totals;

use std::fs::{self, DirBuilder, File};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

pub use record::{parse, Op, Record};
pub use totals::{Histogram, Last, Outcomes, Totals, BUCKETS};

use crate::error::{ArtifactError, Result};

/// The journal's folder under an artifact root.
pub const DIR: &str = ".journal";
/// The size past which the active segment is folded into the totals.
pub const MAX_SEGMENT_BYTES: u64 = 256 * 1024;
const TOTALS: &str = "totals.json";

pub struct Journal {
    dir: PathBuf,
    max_segment: u64,
}

impl Journal {
    /// The journal of the artifact root `root`.
    pub fn at(root: &Path) -> Self {
        Journal {
            dir: root.join(DIR),
            max_segment: MAX_SEGMENT_BYTES,
        }
    }

    pub fn with_max_segment(mut self, bytes: u64) -> Self {
        self.max_segment = bytes;
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `r`, whole and fsynced, rotating first when the active
    /// segment is full.
    pub fn append(&self, r: &Record) -> Result<()> {
        self.make_dir()?;
        let _lock = self.lock(FlockArg::LockExclusive)?;
        let totals = self.read_totals()?;
        let mut seq = self.active_seq(&totals)?;
        let path = self.segment(seq);
        let size = fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0);
        if size >= self.max_segment {
            self.rotate(totals, seq)?;
            seq += 1;
        }
        self.append_line(&self.segment(seq), &r.encode())
    }

    /// The totals of every record: the checkpoint's and the live segments'.
    /// A journal not yet made has none.
    pub fn totals(&self) -> Result<Totals> {
        if !self.dir.exists() {
            return Ok(Totals::default());
        }
        let _lock = self.lock(FlockArg::LockShared)?;
        let mut totals = self.read_totals()?;
        for seq in self.live_segments(&totals)? {
            self.fold(&mut totals, seq)?;
        }
        Ok(totals)
    }

    fn append_line(&self, path: &Path, line: &[u8]) -> Result<()> {
        let mut f = File::options()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| ArtifactError::io(path, "open", e))?;
        let size = f
            .metadata()
            .map_err(|e| ArtifactError::io(path, "stat", e))?
            .len();
        let mut bytes = Vec::with_capacity(line.len() + 1);
        // A writer killed mid-write left a torn line: end it, so that it
        // is skipped alone and this record stays whole.
        let mut last = [0u8; 1];
        if size > 0 && f.read_exact_at(&mut last, size - 1).is_ok() && last[0] != b'\n' {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(line);
        f.write_all(&bytes)
            .and_then(|_| f.sync_data())
            .map_err(|e| ArtifactError::io(path, "append", e))
    }

    /// Folds the segments up to `through` into the totals, writes them
    /// atomically, then removes those segments.
    fn rotate(&self, mut totals: Totals, through: u64) -> Result<()> {
        for seq in self.live_segments(&totals)? {
            if seq <= through {
                self.fold(&mut totals, seq)?;
            }
        }
        totals.folded_through = through;
        let json = serde_json::to_vec(&totals).expect("totals serialize");
        let (tmp, path) = (self.dir.join(".totals.json.tmp"), self.dir.join(TOTALS));
        let _ = fs::remove_file(&tmp);
        crate::durable::write_synced(&tmp, &json)?;
        fs::rename(&tmp, &path).map_err(|e| ArtifactError::io(&path, "rename", e))?;
        crate::layout::sync_dir(&self.dir)?;
        for seq in self.segments()? {
            if seq <= through {
                let p = self.segment(seq);
                fs::remove_file(&p).map_err(|e| ArtifactError::io(&p, "remove", e))?;
            }
        }
        Ok(())
    }

    fn fold(&self, totals: &mut Totals, seq: u64) -> Result<()> {
        let path = self.segment(seq);
        let mut bytes = Vec::new();
        match File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(mut f) => f
                .read_to_end(&mut bytes)
                .map_err(|e| ArtifactError::io(&path, "read", e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ArtifactError::io(&path, "open", e)),
        };
        let (records, skipped) = parse(&bytes);
        totals.skipped += skipped;
        records.iter().for_each(|r| totals.add(r));
        Ok(())
    }

    fn read_totals(&self) -> Result<Totals> {
        let path = self.dir.join(TOTALS);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| ArtifactError::Invalid(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Totals::default()),
            Err(e) => Err(ArtifactError::io(&path, "read", e)),
        }
    }

    /// The segments the totals do not hold yet, oldest first.
    fn live_segments(&self, totals: &Totals) -> Result<Vec<u64>> {
        let mut live: Vec<u64> = self
            .segments()?
            .into_iter()
            .filter(|s| *s > totals.folded_through)
            .collect();
        live.sort_unstable();
        Ok(live)
    }

    fn active_seq(&self, totals: &Totals) -> Result<u64> {
        Ok(self
            .live_segments(totals)?
            .last()
            .copied()
            .unwrap_or(totals.folded_through + 1))
    }

    fn segments(&self) -> Result<Vec<u64>> {
        let entries =
            fs::read_dir(&self.dir).map_err(|e| ArtifactError::io(&self.dir, "list", e))?;
        Ok(entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let seq = name
                    .to_str()?
                    .strip_prefix("records-")?
                    .strip_suffix(".log")?;
                seq.parse().ok()
            })
            .collect())
    }

    fn segment(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("records-{seq:020}.log"))
    }

    fn make_dir(&self) -> Result<()> {
        let dir = &self.dir;
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ArtifactError::io(dir, "create", e))?;
        let md = fs::symlink_metadata(dir).map_err(|e| ArtifactError::io(dir, "stat", e))?;
        if !md.is_dir() {
            return Err(ArtifactError::Unsafe(format!(
                "{} is not a folder",
                dir.display()
            )));
        }
        if md.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| ArtifactError::io(dir, "chmod", e))?;
        }
        Ok(())
    }

    fn lock(&self, how: FlockArg) -> Result<Flock<File>> {
        let path = self.dir.join("lock");
        let file = crate::lock::open_lock_file(&path)?;
        Flock::lock(file, how).map_err(|(_, e)| ArtifactError::io(&path, "lock", e.into()))
    }
}

/// Appends `r` to the journal of `root`; the error names the journal.
pub fn record(root: &Path, r: &Record) -> std::result::Result<(), String> {
    Journal::at(root)
        .append(r)
        .map_err(|e| format!("metrics journal {}: {e}", root.join(DIR).display()))
}

#[cfg(test)]
mod tests;
