//! The Prometheus text exposition format (version 0.0.4) of the journal's
//! totals and the artifact store: what `vsnap metrics` prints and serves.

use std::collections::BTreeMap;
use std::fmt::Write;

use vsnap_artifact::journal::{Histogram, Totals, BUCKETS};

/// The artifact store as a scrape sees it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Store {
    /// Each artifact's bytes, by name.
    pub artifacts: BTreeMap<String, u64>,
    /// Quarantined copies under the root now (vsnap_artifact::quarantine).
    pub quarantined: u64,
}

/// Counters of an operation: (operation, metric, help).
const COUNTS: [(&str, &str, &str); 4] = [
    (
        "restore",
        "vsnap_restores_total",
        "Restores from snapshot artifacts, by artifact and result.",
    ),
    (
        "capture",
        "vsnap_captures_total",
        "Captures of snapshot artifacts, by artifact and result.",
    ),
    (
        "pull",
        "vsnap_pulls_total",
        "Pulls of artifacts from a registry, by artifact and result.",
    ),
    (
        "push",
        "vsnap_pushes_total",
        "Pushes of artifacts to a registry, by artifact and result.",
    ),
];

const BYTES: [(&str, &str, &str); 3] = [
    (
        "pull",
        "vsnap_pulled_bytes_total",
        "Bytes fetched from registries by pulls, by artifact.",
    ),
    (
        "push",
        "vsnap_pushed_bytes_total",
        "Bytes uploaded to registries by pushes, by artifact.",
    ),
    (
        "capture",
        "vsnap_captured_bytes_total",
        "Bytes of the artifacts captures published, by artifact.",
    ),
];

pub fn render(totals: &Totals, store: &Store, version: &str) -> String {
    let mut out = String::new();
    family(
        &mut out,
        "vsnap_build_info",
        "gauge",
        "vsnap's version; always 1.",
    );
    sample(&mut out, "vsnap_build_info", &[("version", version)], 1);
    for (op, name, help) in COUNTS {
        family(&mut out, name, "counter", help);
        for (artifact, o) in totals.outcomes.get(op).into_iter().flatten() {
            sample(
                &mut out,
                name,
                &[("artifact", artifact), ("result", "ok")],
                o.ok,
            );
            sample(
                &mut out,
                name,
                &[("artifact", artifact), ("result", "failed")],
                o.failed,
            );
        }
    }
    for (op, name, help) in BYTES {
        family(&mut out, name, "counter", help);
        for (artifact, o) in totals.outcomes.get(op).into_iter().flatten() {
            sample(&mut out, name, &[("artifact", artifact)], o.bytes);
        }
    }
    failures(&mut out, totals);
    fallbacks(&mut out, totals);
    durations(&mut out, totals);
    last(&mut out, totals);
    store_size(&mut out, store);
    let skipped = "vsnap_journal_skipped_records_total";
    family(
        &mut out,
        skipped,
        "counter",
        "Journal records skipped as torn (a writer killed mid-write) or damaged.",
    );
    sample(&mut out, skipped, &[], totals.skipped);
    out
}

fn failures(out: &mut String, totals: &Totals) {
    let name = "vsnap_failures_total";
    family(
        out,
        name,
        "counter",
        "Failed restores, captures, pulls and pushes, by operation and the phase that failed.",
    );
    for (op, phases) in &totals.failures {
        for (phase, n) in phases {
            sample(out, name, &[("op", op), ("phase", phase)], *n);
        }
    }
}

/// `auto` starts that set their artifact aside and created instead, by
/// artifact and cause. Its own family: a fallback is no restore, capture,
/// pull or push, so it is in none of their series.
fn fallbacks(out: &mut String, totals: &Totals) {
    let name = "vsnap_auto_fallbacks_total";
    family(
        out,
        name,
        "counter",
        "Starts under vsnap.io/plan=auto whose artifact could not be restored here, was set aside (quarantined) and was created again, by artifact and reason (host, damaged, restore).",
    );
    for (artifact, causes) in &totals.fallbacks {
        for (cause, n) in causes {
            sample(out, name, &[("artifact", artifact), ("reason", cause)], *n);
        }
    }
}

fn durations(out: &mut String, totals: &Totals) {
    let name = "vsnap_phase_duration_seconds";
    family(
        out,
        name,
        "histogram",
        "Time spent in each phase of successful operations (phase \"total\": the whole operation).",
    );
    for (op, phases) in &totals.durations {
        for (phase, h) in phases {
            histogram(out, name, &[("op", op), ("phase", phase)], h);
        }
    }
}

fn histogram(out: &mut String, name: &str, labels: &[(&str, &str)], h: &Histogram) {
    let bucket = format!("{name}_bucket");
    let cumulative = h.cumulative();
    for (i, le) in BUCKETS
        .iter()
        .map(|b| b.to_string())
        .chain(["+Inf".to_string()])
        .enumerate()
    {
        let mut with_le = labels.to_vec();
        with_le.push(("le", &le));
        sample(
            out,
            &bucket,
            &with_le,
            cumulative.get(i).copied().unwrap_or(h.count),
        );
    }
    let _ = writeln!(out, "{name}_sum{} {}", label_set(labels), float(h.sum));
    sample(out, &format!("{name}_count"), labels, h.count);
}

fn last(out: &mut String, totals: &Totals) {
    let (seconds, success, at) = (
        "vsnap_last_duration_seconds",
        "vsnap_last_success",
        "vsnap_last_timestamp_seconds",
    );
    family(
        out,
        seconds,
        "gauge",
        "How long the last operation of a kind on an artifact took.",
    );
    each_last(out, totals, |out, labels, l| {
        let _ = writeln!(out, "{seconds}{} {}", label_set(labels), float(l.seconds));
    });
    family(
        out,
        success,
        "gauge",
        "Whether the last operation of a kind on an artifact succeeded (1) or failed (0).",
    );
    each_last(out, totals, |out, labels, l| {
        sample(out, success, labels, l.ok as u64)
    });
    family(
        out,
        at,
        "gauge",
        "When the last operation of a kind on an artifact ended, in seconds since the epoch.",
    );
    each_last(out, totals, |out, labels, l| sample(out, at, labels, l.at));
}

fn each_last(
    out: &mut String,
    totals: &Totals,
    mut f: impl FnMut(&mut String, &[(&str, &str)], &vsnap_artifact::journal::Last),
) {
    for (op, artifacts) in &totals.last {
        for (artifact, l) in artifacts {
            f(out, &[("op", op), ("artifact", artifact)], l);
        }
    }
}

fn store_size(out: &mut String, store: &Store) {
    let (total, count, each) = (
        "vsnap_artifact_store_bytes",
        "vsnap_artifacts",
        "vsnap_artifact_bytes",
    );
    family(
        out,
        total,
        "gauge",
        "Bytes of every artifact under the artifact root.",
    );
    sample(out, total, &[], store.artifacts.values().sum());
    family(out, count, "gauge", "Artifacts under the artifact root.");
    sample(out, count, &[], store.artifacts.len() as u64);
    family(
        out,
        each,
        "gauge",
        "Bytes of each artifact under the artifact root.",
    );
    for (artifact, bytes) in &store.artifacts {
        sample(out, each, &[("artifact", artifact)], *bytes);
    }
    let quarantined = "vsnap_quarantined_artifacts";
    family(
        out,
        quarantined,
        "gauge",
        "Quarantined copies of artifacts set aside under the artifact root (vsnap ls lists them, vsnap gc --older-than removes them).",
    );
    sample(out, quarantined, &[], store.quarantined);
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: u64) {
    let _ = writeln!(out, "{name}{} {value}", label_set(labels));
}

fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// A label value as the format escapes it: backslash, quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn float(v: f64) -> String {
    if v.is_finite() {
        v.to_string()
    } else {
        "NaN".to_string()
    }
}

#[cfg(test)]
mod tests;
