//! One journal record and its line on disk: `<len> <check> <json>\n`, where
//! `len` is the JSON's byte length and `check` the first 16 hex digits of
//! its BLAKE3 hash. A line that does not parse, whose length or check does
//! not match (a record torn by a writer killed mid-write, or damage) is
//! skipped alone: the newline that ends every whole record bounds it.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What a record is about.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Restore,
    Capture,
    Pull,
    Push,
    /// An `auto` start whose artifact could not be restored here and was
    /// set aside (quarantine.rs), the start becoming a create: recorded
    /// not ok, `failed_phase` holding the cause (`host`, `damaged`,
    /// `restore`).
    Fallback,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Restore, Op::Capture, Op::Pull, Op::Push, Op::Fallback];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Restore => "restore",
            Op::Capture => "capture",
            Op::Pull => "pull",
            Op::Push => "push",
            Op::Fallback => "fallback",
        }
    }
}

/// The outcome of one restore, capture, pull or push, or one `auto`
/// fallback. Its labels have a
/// bounded cardinality: the artifact's name and phase names, never a
/// container id.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Record {
    /// Seconds since the epoch when it ended.
    pub at: u64,
    pub op: Op,
    pub artifact: String,
    pub ok: bool,
    /// The phase that failed (`criu`, `activation`, `preflight`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_phase: Option<String>,
    /// Seconds spent in each phase.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases: BTreeMap<String, f64>,
    /// Seconds from its start to its end.
    pub seconds: f64,
    /// Bytes moved: pulled or pushed over the network, or the artifact's
    /// size for a capture.
    #[serde(default)]
    pub bytes: u64,
}

impl Record {
    /// A record of `op` on `artifact` that ended now.
    pub fn now(op: Op, artifact: &str, ok: bool, seconds: f64) -> Self {
        Record {
            at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            op,
            artifact: artifact.to_string(),
            ok,
            failed_phase: None,
            phases: BTreeMap::new(),
            seconds,
            bytes: 0,
        }
    }

    pub fn failed_in(mut self, phase: &str) -> Self {
        self.ok = false;
        self.failed_phase = Some(phase.to_string());
        self
    }

    pub fn phase(mut self, name: &str, seconds: f64) -> Self {
        self.phases.insert(name.to_string(), seconds);
        self
    }

    pub fn bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }

    /// The record's line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let json = serde_json::to_string(self).expect("a record serializes");
        format!("{} {} {json}\n", json.len(), check(json.as_bytes())).into_bytes()
    }

    /// The record of one line (without its newline), or None when the line
    /// is torn or damaged.
    pub fn decode(line: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(line).ok()?;
        let (len, rest) = text.split_once(' ')?;
        let (sum, json) = rest.split_once(' ')?;
        if len.parse::<usize>().ok()? != json.len() || sum != check(json.as_bytes()) {
            return None;
        }
        serde_json::from_str(json).ok()
    }
}

fn check(bytes: &[u8]) -> String {
    let hash = blake3::hash(bytes);
    hash.to_hex()[..16].to_string()
}

/// The records of a segment's bytes, and how many lines were skipped. A
/// last line without its newline is a torn record.
pub fn parse(bytes: &[u8]) -> (Vec<Record>, u64) {
    let (mut records, mut skipped) = (Vec::new(), 0);
    let mut lines = bytes.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let last = lines.peek().is_none();
        if last && line.is_empty() {
            break;
        }
        match Record::decode(line).filter(|_| !last) {
            Some(r) => records.push(r),
            None => skipped += 1,
        }
    }
    (records, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record::now(Op::Restore, "llama", true, 1.5)
            .phase("criu", 0.75)
            .bytes(42)
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let line = sample().encode();
        assert_eq!(line.last(), Some(&b'\n'));
        let (records, skipped) = parse(&line);
        assert_eq!((records, skipped), (vec![sample()], 0));
    }

    #[test]
    fn every_prefix_of_a_record_is_skipped_and_the_records_before_it_stay() {
        let whole = [sample().encode(), sample().encode()].concat();
        let first = sample().encode().len();
        for cut in first + 1..whole.len() {
            let (records, skipped) = parse(&whole[..cut]);
            assert_eq!(records, vec![sample()], "cut at {cut}");
            assert_eq!(skipped, 1, "cut at {cut}");
        }
    }

    #[test]
    fn every_op_is_named_as_it_is_written() {
        for op in Op::ALL {
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json, format!("\"{}\"", op.as_str()));
            assert_eq!(serde_json::from_str::<Op>(&json).unwrap(), op);
        }
        let fallback = Record::now(Op::Fallback, "llama", false, 0.5).failed_in("host");
        assert_eq!(parse(&fallback.encode()), (vec![fallback], 0));
    }

    #[test]
    fn a_changed_byte_makes_the_record_skipped() {
        let mut line = sample().encode();
        let at = line.len() - 5;
        line[at] ^= 1;
        assert_eq!(parse(&line), (vec![], 1));
    }

    #[test]
    fn a_torn_line_followed_by_whole_records_costs_only_itself() {
        let mut bytes = sample().encode();
        bytes.truncate(bytes.len() / 2);
        bytes.push(b'\n');
        bytes.extend(sample().encode());
        assert_eq!(parse(&bytes), (vec![sample()], 1));
    }
}
