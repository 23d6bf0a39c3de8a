use super::*;
use vsnap_artifact::journal::{Op, Record};

fn totals() -> Totals {
    let mut t = Totals::default();
    t.add(
        &Record::now(Op::Restore, "llama", true, 2.0)
            .phase("criu", 0.3)
            .phase("activation", 1.2),
    );
    t.add(&Record::now(Op::Restore, "llama", false, 9.0).failed_in("activation"));
    t.add(&Record::now(Op::Capture, "llama", true, 30.0).bytes(1 << 20));
    t.add(&Record::now(Op::Pull, "qwen", true, 4.0).bytes(500));
    t.add(&Record::now(Op::Fallback, "qwen", false, 0.2).failed_in("damaged"));
    t
}

fn store() -> Store {
    Store {
        artifacts: [("llama".to_string(), 100), ("qwen".to_string(), 50)].into(),
        quarantined: 1,
    }
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn counters_by_artifact_and_result_and_failures_by_phase() {
    let text = render(&totals(), &store(), "1.2.3");
    let l = lines(&text);
    for want in [
        "vsnap_build_info{version=\"1.2.3\"} 1",
        "vsnap_restores_total{artifact=\"llama\",result=\"ok\"} 1",
        "vsnap_restores_total{artifact=\"llama\",result=\"failed\"} 1",
        "vsnap_captures_total{artifact=\"llama\",result=\"ok\"} 1",
        "vsnap_captured_bytes_total{artifact=\"llama\"} 1048576",
        "vsnap_pulls_total{artifact=\"qwen\",result=\"ok\"} 1",
        "vsnap_pulled_bytes_total{artifact=\"qwen\"} 500",
        "vsnap_failures_total{op=\"restore\",phase=\"activation\"} 1",
        "vsnap_artifact_store_bytes 150",
        "vsnap_artifacts 2",
        "vsnap_artifact_bytes{artifact=\"qwen\"} 50",
        "vsnap_last_success{op=\"restore\",artifact=\"llama\"} 0",
        "vsnap_last_duration_seconds{op=\"capture\",artifact=\"llama\"} 30",
        "vsnap_journal_skipped_records_total 0",
        "vsnap_auto_fallbacks_total{artifact=\"qwen\",reason=\"damaged\"} 1",
        "vsnap_quarantined_artifacts 1",
    ] {
        assert!(l.contains(&want), "{want} not in\n{text}");
    }
}

#[test]
fn a_histogram_is_cumulative_and_ends_with_inf_sum_and_count() {
    let text = render(&totals(), &store(), "1");
    let l = lines(&text);
    let criu = "vsnap_phase_duration_seconds_bucket{op=\"restore\",phase=\"criu\"";
    assert!(
        l.contains(&format!("{criu},le=\"0.25\"}} 0").as_str()),
        "{text}"
    );
    assert!(
        l.contains(&format!("{criu},le=\"0.5\"}} 1").as_str()),
        "{text}"
    );
    assert!(
        l.contains(&format!("{criu},le=\"+Inf\"}} 1").as_str()),
        "{text}"
    );
    assert!(l.contains(&"vsnap_phase_duration_seconds_sum{op=\"restore\",phase=\"criu\"} 0.3"));
    assert!(l.contains(&"vsnap_phase_duration_seconds_count{op=\"restore\",phase=\"total\"} 1"));
    // A failed restore's time is not a duration of its phases.
    assert!(l.contains(&"vsnap_phase_duration_seconds_sum{op=\"restore\",phase=\"total\"} 2"));
}

#[test]
fn every_family_has_help_and_type_once_and_samples_only_under_it() {
    let text = render(&totals(), &store(), "1");
    let mut current = String::new();
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            current = rest.split(' ').next().unwrap().to_string();
            assert!(seen.insert(current.clone()), "{current} twice");
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| *b == current))
                .unwrap_or(name);
            assert_eq!(base, current, "{line}");
        }
    }
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    assert_eq!(label_set(&[]), "");
}

#[test]
fn an_empty_journal_still_says_the_build_and_the_store() {
    let text = render(&Totals::default(), &Store::default(), "1");
    assert!(text.contains("vsnap_build_info{version=\"1\"} 1"));
    assert!(text.contains("vsnap_artifact_store_bytes 0"));
}

#[test]
fn a_fallback_is_its_own_series_and_in_no_operations() {
    let text = render(&totals(), &store(), "1");
    let fallback_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("fallback"))
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert_eq!(
        fallback_lines,
        ["vsnap_auto_fallbacks_total{artifact=\"qwen\",reason=\"damaged\"} 1"],
        "{text}"
    );
    // Without fallbacks the family is there, empty, as the others are.
    let text = render(&Totals::default(), &Store::default(), "1");
    assert!(text.contains("# TYPE vsnap_auto_fallbacks_total counter\n"));
    assert!(!text.contains("vsnap_auto_fallbacks_total{"));
    assert!(text.contains("\nvsnap_quarantined_artifacts 0\n"));
}
