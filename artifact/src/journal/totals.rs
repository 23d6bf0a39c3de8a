//! What the records add up to: counts by operation, artifact and result,
//! bytes, failures by phase, a duration histogram per phase, the last
//! outcome per artifact. The journal's checkpoint (`totals.json`) holds the
//! totals of every rotated-out record, so a counter never goes backwards.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record::{Op, Record};

/// The histograms' upper bounds, in seconds (`le`); `+Inf` follows.
pub const BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// How many of an artifact's operations ended each way, and their bytes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Outcomes {
    pub ok: u64,
    pub failed: u64,
    pub bytes: u64,
}

/// A Prometheus histogram: `counts[i]` observations in bucket `i` (not
/// cumulative; the last one is `+Inf`), their sum and count.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    pub fn observe(&mut self, seconds: f64) {
        if self.counts.len() != BUCKETS.len() + 1 {
            self.counts.resize(BUCKETS.len() + 1, 0);
        }
        let at = BUCKETS
            .iter()
            .position(|le| seconds <= *le)
            .unwrap_or(BUCKETS.len());
        self.counts[at] += 1;
        self.sum += seconds;
        self.count += 1;
    }

    /// The cumulative counts, one per bucket of [`BUCKETS`] then `+Inf`.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0, |acc, n| {
                *acc += n;
                Some(*acc)
            })
            .collect()
    }
}

/// The last operation of a kind on an artifact.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Last {
    pub at: u64,
    pub ok: bool,
    pub seconds: f64,
    pub bytes: u64,
}

/// Maps keyed by operation (`restore`, `capture`, `pull`, `push`), then by
/// artifact or phase.
type ByOp<T> = BTreeMap<String, BTreeMap<String, T>>;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Totals {
    /// Every segment up to this one is counted here (0: none).
    pub folded_through: u64,
    /// Lines skipped as torn or damaged.
    pub skipped: u64,
    /// By operation, then artifact.
    pub outcomes: ByOp<Outcomes>,
    /// By operation, then the phase that failed.
    pub failures: ByOp<u64>,
    /// By operation, then phase (`total`: the whole operation); of the
    /// operations that succeeded.
    pub durations: ByOp<Histogram>,
    /// By operation, then artifact.
    pub last: ByOp<Last>,
    /// `auto` fallbacks (an artifact set aside, the start a create): by
    /// artifact, then cause (the record's `failed_phase`: `host`,
    /// `damaged`, `restore`). Counted here only, not among the outcomes,
    /// failures or last operations of the four operations. Absent from
    /// totals written before fallbacks were recorded.
    #[serde(default)]
    pub fallbacks: BTreeMap<String, BTreeMap<String, u64>>,
}

impl Totals {
    pub fn add(&mut self, r: &Record) {
        if r.op == Op::Fallback {
            let cause = r.failed_phase.as_deref().unwrap_or("unknown");
            *self
                .fallbacks
                .entry(r.artifact.clone())
                .or_default()
                .entry(cause.to_string())
                .or_default() += 1;
            return;
        }
        let op = r.op.as_str().to_string();
        let o = self
            .outcomes
            .entry(op.clone())
            .or_default()
            .entry(r.artifact.clone())
            .or_default();
        if r.ok {
            o.ok += 1;
        } else {
            o.failed += 1;
        }
        o.bytes += r.bytes;
        if let Some(phase) = &r.failed_phase {
            *self
                .failures
                .entry(op.clone())
                .or_default()
                .entry(phase.clone())
                .or_default() += 1;
        }
        if r.ok {
            let hist = self.durations.entry(op.clone()).or_default();
            hist.entry("total".into()).or_default().observe(r.seconds);
            for (phase, seconds) in &r.phases {
                hist.entry(phase.clone()).or_default().observe(*seconds);
            }
        }
        let last = self
            .last
            .entry(op)
            .or_default()
            .entry(r.artifact.clone())
            .or_default();
        if r.at >= last.at {
            *last = Last {
                at: r.at,
                ok: r.ok,
                seconds: r.seconds,
                bytes: r.bytes,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_puts_each_value_in_the_first_bucket_that_holds_it() {
        let mut h = Histogram::default();
        for v in [0.005, 0.006, 700.0] {
            h.observe(v);
        }
        let c = h.cumulative();
        assert_eq!(
            (c[0], c[1], c[BUCKETS.len() - 1], c[BUCKETS.len()]),
            (1, 2, 2, 3)
        );
        assert_eq!(h.count, 3);
        assert!((h.sum - 700.011).abs() < 1e-9);
    }

    #[test]
    fn totals_count_outcomes_bytes_failures_and_only_successful_durations() {
        let mut t = Totals::default();
        t.add(&Record::now(Op::Restore, "a", true, 2.0).phase("criu", 1.0));
        t.add(&Record::now(Op::Restore, "a", false, 9.0).failed_in("activation"));
        t.add(&Record::now(Op::Pull, "a", true, 3.0).bytes(100));
        t.add(&Record::now(Op::Pull, "a", true, 3.0).bytes(50));
        let r = &t.outcomes["restore"]["a"];
        assert_eq!((r.ok, r.failed), (1, 1));
        assert_eq!(t.outcomes["pull"]["a"].bytes, 150);
        assert_eq!(t.failures["restore"]["activation"], 1);
        assert_eq!(t.durations["restore"]["total"].count, 1);
        assert_eq!(t.durations["restore"]["criu"].sum, 1.0);
        assert!(!t.last["restore"]["a"].ok);
    }

    #[test]
    fn fallbacks_are_counted_by_artifact_and_cause_and_nowhere_else() {
        let mut t = Totals::default();
        for cause in ["host", "host", "damaged"] {
            t.add(&Record::now(Op::Fallback, "a", false, 0.1).failed_in(cause));
        }
        t.add(&Record::now(Op::Fallback, "b", false, 0.1));
        assert_eq!(t.fallbacks["a"]["host"], 2);
        assert_eq!(t.fallbacks["a"]["damaged"], 1);
        assert_eq!(t.fallbacks["b"]["unknown"], 1);
        assert!(t.outcomes.is_empty() && t.failures.is_empty());
        assert!(t.durations.is_empty() && t.last.is_empty());
    }

    #[test]
    fn totals_written_before_fallbacks_still_load() {
        let old = r#"{"folded_through":3,"skipped":1,"outcomes":{},"failures":{},"durations":{},"last":{}}"#;
        let t: Totals = serde_json::from_str(old).unwrap();
        assert_eq!((t.folded_through, t.skipped), (3, 1));
        assert!(t.fallbacks.is_empty());
    }
}
