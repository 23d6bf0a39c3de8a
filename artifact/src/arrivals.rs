//! Which bytes of an artifact have arrived, while a pull is still writing
//! it: the record a pull appends to (`<root>/.pull/partial/<name>/arrived`)
//! and a streamed restore follows, so that it reads a file's bytes only
//! once they are in place and checked.
//!
//! ```text
//! <unix ms>\t<offset>\t<len>\t<file, as the artifact names it>\n
//! ```
//!
//! A line is appended once the chunk's bytes were checked against its
//! digest and written at that place (a chunk at two places gets two
//! lines). Readers see the file's bytes through the page cache as soon as
//! the write returned; nothing is fsynced for them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The record's file name in a partial pull's folder.
pub const FILE: &str = "arrived";

/// Beside it, in the same format: the spans a restore's page server needs
/// ahead of the pull's order (a page a task touched before it arrived),
/// which the pull fetches next.
pub const WANTED: &str = "wanted";

/// What a streamed restore writes into the pull's gate (the pipe whose
/// end of file lets the pull publish) to abandon the pull: it refused the
/// artifact, or failed for a reason that is the artifact's. Any byte
/// written abandons it; the pull then publishes nothing.
pub const ABANDON: &[u8] = b"x";

/// One place of a landed chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    pub unix_ms: u64,
    pub file: String,
    pub offset: u64,
    pub len: u64,
}

impl Arrival {
    /// `len` bytes at `offset` of `file`, arrived now.
    pub fn now(file: &str, offset: u64, len: u64) -> Self {
        Arrival {
            unix_ms: unix_ms(),
            file: file.to_string(),
            offset,
            len,
        }
    }

    /// The record's line for it.
    pub fn line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\n",
            self.unix_ms, self.offset, self.len, self.file
        )
    }

    /// A line of the record (without its newline).
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut f = line.splitn(4, '\t');
        let mut num = |what: &str| -> Result<u64, String> {
            f.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("arrival record: no {what} in {line:?}"))
        };
        let (unix_ms, offset, len) = (num("time")?, num("offset")?, num("length")?);
        let file = f
            .next()
            .filter(|p| !p.is_empty())
            .ok_or_else(|| format!("arrival record: no file in {line:?}"))?;
        Ok(Arrival {
            unix_ms,
            file: file.to_string(),
            offset,
            len,
        })
    }
}

/// Milliseconds since the epoch, now.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Appends `arrivals` to the record `file` in one write (whole lines only:
/// a reader never sees half of one unless the writer died mid-write).
pub fn append(file: &mut File, arrivals: &[Arrival]) -> std::io::Result<()> {
    let text: String = arrivals.iter().map(Arrival::line).collect();
    file.write_all(text.as_bytes())
}

/// Byte ranges of files known to be in place: per file, disjoint
/// `[start, end)` ranges keyed by start.
#[derive(Debug, Default, Clone)]
pub struct Coverage {
    files: BTreeMap<String, BTreeMap<u64, u64>>,
    /// When the newest arrival was recorded.
    last_ms: u64,
}

impl Coverage {
    pub fn add(&mut self, a: &Arrival) {
        self.last_ms = self.last_ms.max(a.unix_ms);
        if a.len == 0 {
            return;
        }
        let ranges = self.files.entry(a.file.clone()).or_default();
        let (mut start, mut end) = (a.offset, a.offset + a.len);
        // Merge with every range that touches [start, end).
        let touching: Vec<(u64, u64)> = ranges
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            ranges.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        ranges.insert(start, end);
    }

    /// Whether every byte of `[start, end)` of `file` is in place.
    pub fn covers(&self, file: &str, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        let Some(ranges) = self.files.get(file) else {
            return false;
        };
        ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
    }

    /// Whether any byte of `[start, end)` of `file` is in.
    pub fn touches(&self, file: &str, start: u64, end: u64) -> bool {
        let Some(ranges) = self.files.get(file) else {
            return false;
        };
        // The last range starting before `end` is the only one that can.
        ranges
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    /// When the newest arrival was recorded (0: none yet).
    pub fn last_ms(&self) -> u64 {
        self.last_ms
    }
}

/// A reader following a record as a pull appends to it.
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    file: Option<File>,
    /// A line read in part (its writer is mid-write).
    pending: String,
    pub coverage: Coverage,
}

impl Follower {
    pub fn new(path: &Path) -> Self {
        Follower {
            path: path.to_path_buf(),
            file: None,
            pending: String::new(),
            coverage: Coverage::default(),
        }
    }

    /// Reads what was appended since the last call into the coverage.
    /// The record not being there yet is not an error.
    pub fn refresh(&mut self) -> Result<(), String> {
        if self.file.is_none() {
            match File::open(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(format!("{}: open: {e}", self.path.display())),
            }
        }
        let file = self.file.as_mut().expect("opened");
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| format!("{}: read: {e}", self.path.display()))?;
        self.pending.push_str(&text);
        let Some(cut) = self.pending.rfind('\n') else {
            return Ok(());
        };
        let whole: String = self.pending.drain(..=cut).collect();
        for line in whole.lines().filter(|l| !l.is_empty()) {
            self.coverage.add(&Arrival::parse(line)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: &str, offset: u64, len: u64) -> Arrival {
        Arrival {
            unix_ms: 7,
            file: file.into(),
            offset,
            len,
        }
    }

    #[test]
    fn a_line_reads_back_as_written() {
        let a = Arrival::now("images/pages-1.img", 4096, 8192);
        let line = a.line();
        assert!(
            line.ends_with("\t4096\t8192\timages/pages-1.img\n"),
            "{line}"
        );
        assert_eq!(Arrival::parse(line.trim_end()).unwrap(), a);
        for bad in ["", "1\t2\t3", "x\t2\t3\tf", "1\t2\t3\t"] {
            assert!(Arrival::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn coverage_merges_ranges_in_any_order_and_only_covers_whole_spans() {
        let mut c = Coverage::default();
        let f = "images/pages-1.img";
        c.add(&at(f, 100, 50));
        assert!(c.covers(f, 100, 150) && c.covers(f, 120, 130));
        assert!(!c.covers(f, 90, 120) && !c.covers(f, 140, 160));
        assert!(!c.covers("images/pages-2.img", 100, 101));
        c.add(&at(f, 0, 60));
        assert!(!c.covers(f, 0, 150), "60..100 is missing");
        c.add(&at(f, 60, 40));
        assert!(c.covers(f, 0, 150));
        c.add(&at(f, 150, 0));
        c.add(&at(f, 140, 20));
        assert!(c.covers(f, 0, 160) && !c.covers(f, 0, 161));
        assert!(c.covers(f, 5, 5), "an empty span is always there");
        assert!(c.touches(f, 159, 300) && c.touches(f, 0, 1) && !c.touches(f, 160, 300));
        assert!(!c.touches("g", 0, 10));
        assert_eq!(c.last_ms(), 7);
    }

    #[test]
    fn a_follower_reads_whole_lines_as_they_are_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        let mut r = Follower::new(&path);
        r.refresh().unwrap();
        assert!(!r.coverage.covers("f", 0, 1), "no record yet");
        let mut w = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        append(&mut w, &[at("f", 0, 10)]).unwrap();
        let half = at("f", 10, 10).line();
        w.write_all(&half.as_bytes()[..4]).unwrap();
        r.refresh().unwrap();
        assert!(r.coverage.covers("f", 0, 10) && !r.coverage.covers("f", 0, 11));
        w.write_all(&half.as_bytes()[4..]).unwrap();
        r.refresh().unwrap();
        assert!(r.coverage.covers("f", 0, 20));
    }
}
