//! `vsnap metrics` end to end: a capture, a restore and a refused restore
//! under the private containerd, then `vsnap metrics --listen` scraped by a
//! real Prometheus server, whose query API returns the restore count and
//! the phase durations of the restore this test made, with the journal's
//! last record torn as a shim killed mid-write leaves it.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vsnap_e2e::containerd::shim_binary;
use vsnap_e2e::engine::{free_port, wait_listening};
use vsnap_e2e::prometheus::Prometheus;
use vsnap_e2e::snapshot_env::{poll, setup};

/// `vsnap metrics --listen 127.0.0.1:0`, stopped by its pid when dropped.
struct Exporter {
    child: Child,
    addr: String,
}

impl Exporter {
    fn start(root: &std::path::Path) -> Self {
        let mut child = Command::new(shim_binary().with_file_name("vsnap"))
            .arg("--root")
            .arg(root)
            .args(["metrics", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line names the address it bound.
        let mut stdout = child.stdout.take().unwrap();
        let (mut line, mut byte) = (Vec::new(), [0u8; 1]);
        while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let line = String::from_utf8(line).unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("vsnap metrics --listen said: {line:?}"))
            .to_string();
        Exporter { child, addr }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_restores_by_artifact_and_the_phase_durations_of_a_restore() {
    let e = setup("metrics");
    let port = free_port();
    assert!(e.run("m-donor", "create", "ref", port, &[]).ok());
    e.wait_manifest("ref");
    wait_listening(port, Duration::from_secs(60));
    e.remove("m-donor");
    let port = free_port();
    let out = e.run("copy", "restore", "ref", port, &[]);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    let timings: serde_json::Value = serde_json::from_slice(
        &std::fs::read(e.bundle("copy").join("vsnap-restore.json")).unwrap(),
    )
    .unwrap();
    e.remove("copy");
    // A restore refused at create counts as a failure in its preflight.
    let out = e.run("nothing", "restore", "missing", free_port(), &[]);
    assert!(!out.ok(), "{out:?}");

    // A shim killed mid-write leaves a torn last record: it costs only itself.
    let journal = e.artifacts.join(".journal");
    let segment = std::fs::read_dir(&journal)
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .max()
        .expect("a journal segment");
    let torn = br#"180 0123456789abcdef {"at":1,"op":"restore","artifact":"ref","ok":tr"#;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&segment)
        .unwrap();
    std::io::Write::write_all(&mut f, torn).unwrap();
    drop(f);

    let exporter = Exporter::start(&e.artifacts);
    let prom = Prometheus::start(&e.c.dir, &exporter.addr);
    let wait = |q: &str, want: f64| {
        poll(
            Duration::from_secs(120),
            &format!("prometheus: {q} == {want}: {}", prom.log()),
            || prom.value(q) == Some(want),
        )
    };
    wait(r#"vsnap_restores_total{artifact="ref",result="ok"}"#, 1.0);
    wait(r#"vsnap_captures_total{artifact="ref",result="ok"}"#, 1.0);
    wait(
        r#"vsnap_failures_total{op="restore",phase="preflight"}"#,
        1.0,
    );
    wait(
        r#"vsnap_restores_total{artifact="missing",result="failed"}"#,
        1.0,
    );
    // The restore's phases: the same times as its vsnap-restore.json (the
    // driver's activation phase is the record's activation and listener).
    let ms = |f: &str| timings[f].as_f64().unwrap();
    for (phase, ms) in [
        ("criu", ms("criu_restore_ms")),
        ("activation", ms("activation_ms") + ms("listener_ms")),
    ] {
        let q = format!(r#"vsnap_phase_duration_seconds_sum{{op="restore",phase="{phase}"}}"#);
        let seconds = prom.value(&q).unwrap_or_else(|| panic!("{q}: no sample"));
        assert!(
            (seconds * 1000.0 - ms).abs() < 1.0 && seconds > 0.0,
            "{phase}: {seconds}s scraped, {ms}ms in vsnap-restore.json"
        );
        let count =
            format!(r#"vsnap_phase_duration_seconds_count{{op="restore",phase="{phase}"}}"#);
        assert_eq!(prom.value(&count), Some(1.0), "{count}");
    }
    let size = prom
        .value("vsnap_artifact_store_bytes")
        .expect("the store's size");
    assert!(size > 0.0, "{size}");
    assert_eq!(prom.value(r#"vsnap_build_info"#), Some(1.0));
    assert_eq!(
        prom.value("vsnap_journal_skipped_records_total"),
        Some(1.0),
        "the torn record, and only it, skipped"
    );
}
