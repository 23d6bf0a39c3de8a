//! `vsnap metrics` against a real journal written through the library's
//! writer API (as the shim and the registry write it): the exposition
//! passes Debian's `promtool check metrics`, `--listen` serves the same,
//! and a journal whose last record was torn by a killed writer still
//! reads, nothing before it lost.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use vsnap_artifact::journal::{Journal, Op, Record};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("artifacts");
    vsnap_artifact::ensure_root(&root).unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, "").unwrap();
    Fixture {
        _dir: dir,
        root,
        config,
    }
}

impl Fixture {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vsnap"));
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--config")
            .arg(&self.config)
            .args(args);
        cmd
    }

    fn metrics(&self) -> String {
        let out = self.command(&["metrics"]).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }
}

fn restore(ok: bool) -> Record {
    let r = Record::now(Op::Restore, "llama", true, 2.5)
        .phase("criu", 0.4)
        .phase("activation", 1.1);
    if ok {
        r
    } else {
        r.failed_in("activation")
    }
}

fn journal(root: &Path) {
    let j = Journal::at(root);
    j.append(&restore(true)).unwrap();
    j.append(&restore(false)).unwrap();
    j.append(&Record::now(Op::Capture, "llama", true, 40.0).bytes(1 << 30))
        .unwrap();
    j.append(&Record::now(Op::Pull, "qwen", true, 3.0).bytes(123_456))
        .unwrap();
    j.append(&Record::now(Op::Push, "llama", false, 1.0).failed_in("push"))
        .unwrap();
    j.append(&Record::now(Op::Fallback, "llama", false, 0.3).failed_in("damaged"))
        .unwrap();
}

fn promtool(text: &str) -> Output {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/setup.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn the_exposition_passes_promtool_check_metrics() {
    let f = fixture();
    // Empty, then with every kind of record.
    for populated in [false, true] {
        if populated {
            journal(&f.root);
        }
        let text = f.metrics();
        let out = promtool(&text);
        assert!(
            out.status.success(),
            "promtool: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = f.metrics();
    for want in [
        "vsnap_restores_total{artifact=\"llama\",result=\"ok\"} 1",
        "vsnap_restores_total{artifact=\"llama\",result=\"failed\"} 1",
        "vsnap_failures_total{op=\"push\",phase=\"push\"} 1",
        "vsnap_pulled_bytes_total{artifact=\"qwen\"} 123456",
        "vsnap_auto_fallbacks_total{artifact=\"llama\",reason=\"damaged\"} 1",
        "vsnap_quarantined_artifacts 0",
    ] {
        assert!(text.lines().any(|l| l == want), "{want} not in\n{text}");
    }
}

/// Stops the child it holds (by its pid) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn listen_serves_the_same_exposition_over_http_and_reads_the_journal_afresh() {
    let f = fixture();
    journal(&f.root);
    let mut child = f
        .command(&["metrics", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let server = Server(child);
    // The first line names the port it bound.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let line = String::from_utf8(line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let answer = get(&addr, "/metrics");
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains("Content-Type: text/plain; version=0.0.4"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    assert_eq!(body, f.metrics());
    assert!(get(&addr, "/").starts_with("HTTP/1.1 404"));
    // A record written after the server started is in the next answer.
    Journal::at(&f.root).append(&restore(true)).unwrap();
    let answer = get(&addr, "/metrics");
    assert!(
        answer.contains("vsnap_restores_total{artifact=\"llama\",result=\"ok\"} 2"),
        "{answer}"
    );
    drop(server);
}

fn segment(root: &Path) -> PathBuf {
    let dir = root.join(".journal");
    let mut logs: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs.pop().unwrap()
}

#[test]
fn a_record_torn_by_a_killed_writer_costs_only_itself() {
    let f = fixture();
    journal(&f.root);
    let before = f.metrics();
    // What a writer killed mid-write leaves: the first bytes of a record.
    let torn = restore(true).encode();
    let mut seg = File::options().append(true).open(segment(&f.root)).unwrap();
    seg.write_all(&torn[..torn.len() / 3]).unwrap();
    drop(seg);
    let after = f.metrics();
    assert_eq!(
        after.replace(
            "vsnap_journal_skipped_records_total 1",
            "vsnap_journal_skipped_records_total 0"
        ),
        before,
        "only the skipped count changed"
    );
    // The next writer's record counts whole.
    Journal::at(&f.root).append(&restore(true)).unwrap();
    let text = f.metrics();
    assert!(
        text.contains("vsnap_restores_total{artifact=\"llama\",result=\"ok\"} 2"),
        "{text}"
    );
    assert!(promtool(&text).status.success());
}

/// Records appended across many rotations (4 KiB segments) all count, once
/// each. It is also the writer the next test kills: started by that test
/// with `VSNAP_TEST_JOURNAL_ROOT` set, it appends to that root until killed.
#[test]
fn records_appended_across_rotations_all_count_once() {
    if let Ok(root) = std::env::var("VSNAP_TEST_JOURNAL_ROOT") {
        let j = Journal::at(Path::new(&root)).with_max_segment(4096);
        loop {
            j.append(&restore(true)).unwrap();
        }
    }
    let f = fixture();
    let j = Journal::at(&f.root).with_max_segment(4096);
    for _ in 0..200 {
        j.append(&restore(true)).unwrap();
    }
    assert!(
        f.root.join(".journal/totals.json").exists(),
        "200 records rotated 4 KiB segments into the totals"
    );
    assert_eq!(restores_ok(&f.root), 200);
}

fn restores_ok(root: &Path) -> u64 {
    let t = Journal::at(root).totals().unwrap();
    t.outcomes
        .get("restore")
        .and_then(|m| m.get("llama"))
        .map_or(0, |o| o.ok)
}

#[test]
fn a_writer_killed_at_any_moment_loses_nothing_written_before() {
    let f = fixture();
    let mut seen = 0;
    for round in 0..8u64 {
        let mut writer = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "records_appended_across_rotations_all_count_once",
                "--nocapture",
            ])
            .env("VSNAP_TEST_JOURNAL_ROOT", &f.root)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Let it write (and rotate: 4 KiB segments) a while, then SIGKILL it.
        let want = seen + 20 + round * 7;
        let deadline = Instant::now() + Duration::from_secs(120);
        while restores_ok(&f.root) < want {
            assert!(Instant::now() < deadline, "the writer wrote nothing");
            std::thread::sleep(Duration::from_millis(1));
        }
        writer.kill().unwrap();
        writer.wait().unwrap();
        let now = restores_ok(&f.root);
        assert!(
            now >= want,
            "round {round}: {now} < {want}: a record was lost"
        );
        seen = now;
        // The journal still takes records and reads.
        Journal::at(&f.root).append(&restore(true)).unwrap();
        seen += 1;
        assert_eq!(restores_ok(&f.root), seen, "round {round}");
        let text = f.metrics();
        assert!(promtool(&text).status.success(), "{text}");
    }
}
