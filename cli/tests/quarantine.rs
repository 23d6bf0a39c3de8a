//! Quarantined copies (artifacts an `auto` start set aside, through the
//! vsnap-artifact API as the shim does) in `vsnap ls`, `inspect
//! --quarantined`, `gc --older-than` and `metrics`. Run as root, as CI does.

mod support;
use support::*;
use vsnap_artifact::journal::{Journal, Op, Record};
use vsnap_artifact::quarantine::{self, Reason};

/// Makes `name` and sets it aside `ago` with `cause`.
fn quarantined(f: &Fixture, name: &str, cause: &str, ago: Duration) -> Reason {
    f.make(name, ago + DAY, 1024);
    let at = SystemTime::now() - ago;
    let reason = Reason {
        cause: cause.into(),
        message: format!(
            "restore: verify: damaged: {}/{name}/images/pages-1.img chunk 0 does not match its digest\nsecond line",
            f.root.display()
        ),
        at: at.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
        container: format!("ctr-{name}"),
    };
    let _lock = ArtifactLock::exclusive(&f.root, name).unwrap();
    let to = quarantine::set_aside(&f.root, name, &reason).unwrap();
    assert_eq!(to, Some(f.root.join(".quarantine").join(name)));
    reason
}

#[test]
fn ls_shows_quarantined_copies_after_the_artifacts_and_apart_in_json() {
    let Some(f) = Fixture::new() else { return };
    f.make("alpha", Duration::ZERO, 2048);
    quarantined(&f, "beta", "damaged", 2 * DAY);

    let out = f.vsnap(&["ls"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("NAME "), "{stdout}");
    assert!(lines[1].starts_with("alpha "), "{stdout}");
    assert_eq!(lines[2], "", "{stdout}");
    assert!(lines[3].starts_with("set aside under "), "{stdout}");
    assert!(lines[3].contains("/.quarantine/"), "{stdout}");
    assert!(lines[4].starts_with("QUARANTINED "), "{stdout}");
    let beta = lines[5];
    for part in ["beta ", " damaged ", " 2d ", " ctr-beta "] {
        assert!(beta.contains(part), "{part:?} in {beta}");
    }
    // The first line of the reason, paths relative to the root.
    assert!(
        beta.ends_with(
            "restore: verify: damaged: beta/images/pages-1.img chunk 0 does not match its digest"
        ),
        "{beta}"
    );
    assert_eq!(lines.len(), 6, "{stdout}");

    // The artifacts' array is as it was: a quarantined copy is no artifact.
    let (code, v) = f.json(&["ls", "--json"]);
    assert_eq!(code, 0);
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha"]);

    let (code, v) = f.json(&["ls", "--quarantined", "--json"]);
    assert_eq!(code, 0, "{v}");
    let q = &v.as_array().unwrap()[..];
    assert_eq!(q.len(), 1, "{v}");
    assert_eq!(
        (&q[0]["name"], &q[0]["cause"], &q[0]["container"]),
        (&json!("beta"), &json!("damaged"), &json!("ctr-beta"))
    );
    assert!(q[0]["message"].as_str().unwrap().ends_with("\nsecond line"));
    let age = q[0]["age_seconds"].as_u64().unwrap();
    assert!((2 * 86_400..2 * 86_400 + 60).contains(&age), "{v}");
    assert!(q[0]["size_bytes"].as_u64().unwrap() > 1024, "{v}");

    // Only the quarantined copies, as a table.
    let (stdout, _) = text(&f.vsnap(&["ls", "--quarantined"]));
    assert!(!stdout.contains("alpha"), "{stdout}");
    assert!(stdout.contains("\nbeta "), "{stdout}");
}

#[test]
fn inspect_quarantined_reads_the_reason_and_the_manifest() {
    let Some(f) = Fixture::new() else { return };
    quarantined(&f, "beta", "host", DAY);
    let out = f.vsnap(&["inspect", "--quarantined", "beta"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    for want in [
        "Cause:",
        "host",
        "ctr-beta",
        "Reason:\n  restore: verify: damaged: ",
        "\n  second line\n",
        "Source:",
        "src-beta",
        "MAC:",
        "verified",
    ] {
        assert!(stdout.contains(want), "{want:?} in\n{stdout}");
    }
    let (code, v) = f.json(&["inspect", "--quarantined", "beta", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["quarantine"]["cause"], "host");
    assert_eq!(v["manifest"]["name"], "beta");
    assert_eq!(v["mac"], "verified");
    assert_eq!(v["manifest_error"], Value::Null);

    // A manifest of a format this vsnap does not read: the reason still shows.
    let manifest = f.root.join(".quarantine/beta/manifest.json");
    let text_of = fs::read_to_string(&manifest).unwrap();
    let future = text_of.replacen(
        &format!("\"schema_version\": {SCHEMA_VERSION}"),
        "\"schema_version\": 99",
        1,
    );
    assert_ne!(text_of, future);
    fs::write(&manifest, future).unwrap();
    let (code, v) = f.json(&["inspect", "--quarantined", "beta", "--json"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["quarantine"]["cause"], "host");
    let e = v["manifest_error"].as_str().unwrap();
    let read: Vec<String> = vsnap_artifact::READABLE_SCHEMA_VERSIONS
        .iter()
        .map(u32::to_string)
        .collect();
    assert_eq!(read.last().unwrap(), &SCHEMA_VERSION.to_string());
    assert!(
        e.contains(&format!(
            "schema_version 99 is not an artifact format this vsnap reads ({})",
            read.join(", ")
        )),
        "{e}"
    );

    // No such copy; and the artifact itself is not a quarantined copy.
    f.make("alpha", Duration::ZERO, 16);
    let out = f.vsnap(&["inspect", "--quarantined", "alpha"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no quarantined copy of alpha"), "{stderr}");
}

#[test]
fn gc_removes_quarantined_copies_older_than_its_age_unless_in_use() {
    let Some(f) = Fixture::new() else { return };
    quarantined(&f, "old", "damaged", 10 * DAY);
    quarantined(&f, "busy", "restore", 10 * DAY);
    quarantined(&f, "new", "host", DAY);
    let q = f.root.join(".quarantine");
    // Without an age they stay.
    let (code, v) = f.json(&["gc", "--json"]);
    assert_eq!(
        (code, v["actions"].as_array().unwrap().len()),
        (0, 0),
        "{v}"
    );
    let (code, v) = f.json(&["gc", "--older-than", "7d", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["actions"].as_array().unwrap().len(), 2, "{v}");
    assert!(q.join("old").exists() && q.join("busy").exists());

    let _lock = ArtifactLock::shared(&f.root, "busy").unwrap();
    let (code, v) = f.json(&["gc", "--older-than", "7d", "--json"]);
    assert_eq!(code, 0, "{v}");
    let results: Vec<(&str, &str, &str)> = v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap(),
                a["kind"].as_str().unwrap(),
                a["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            (".quarantine/busy", "quarantined", "in-use"),
            (".quarantine/old", "quarantined", "removed"),
        ],
        "{v}"
    );
    assert!(v["actions"][1]["reason"]
        .as_str()
        .unwrap()
        .starts_with("set aside (damaged) longer ago than 7d"));
    assert!(!q.join("old").exists());
    assert!(q.join("busy").exists() && q.join("new").exists());
    // The artifacts' total is the artifacts' alone.
    assert_eq!(v["total_bytes_before"], 0, "{v}");
    let (stdout, _) = text(&f.vsnap(&["gc", "--older-than", "7d", "--dry-run"]));
    assert!(stdout.contains(".quarantine/busy"), "{stdout}");
    assert!(stdout.contains("quarantined"), "{stdout}");
}

#[test]
fn metrics_count_quarantined_copies_and_fallbacks() {
    let Some(f) = Fixture::new() else { return };
    f.make("alpha", Duration::ZERO, 16);
    quarantined(&f, "beta", "damaged", DAY);
    quarantined(&f, "gamma", "host", DAY);
    let j = Journal::at(&f.root);
    for (artifact, cause) in [("beta", "damaged"), ("gamma", "host"), ("gamma", "host")] {
        j.append(&Record::now(Op::Fallback, artifact, false, 0.2).failed_in(cause))
            .unwrap();
    }
    let out = f.vsnap(&["metrics"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    for want in [
        "# TYPE vsnap_auto_fallbacks_total counter",
        "vsnap_auto_fallbacks_total{artifact=\"beta\",reason=\"damaged\"} 1",
        "vsnap_auto_fallbacks_total{artifact=\"gamma\",reason=\"host\"} 2",
        "# TYPE vsnap_quarantined_artifacts gauge",
        "vsnap_quarantined_artifacts 2",
        // Quarantined copies are not artifacts of the store.
        "vsnap_artifacts 1",
    ] {
        assert!(stdout.lines().any(|l| l == want), "{want} not in\n{stdout}");
    }
    // A fallback is in none of the four operations' series.
    assert!(!stdout.contains("op=\"fallback\""), "{stdout}");
}
