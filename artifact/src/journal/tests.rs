use std::os::unix::fs::PermissionsExt;

use super::*;

fn restore(artifact: &str, ok: bool) -> Record {
    let r = Record::now(Op::Restore, artifact, ok, 1.0).phase("criu", 0.5);
    if ok {
        r
    } else {
        r.failed_in("activation")
    }
}

fn restores(j: &Journal, artifact: &str) -> (u64, u64) {
    let t = j.totals().unwrap();
    t.outcomes
        .get("restore")
        .and_then(|m| m.get(artifact))
        .map(|o| (o.ok, o.failed))
        .unwrap_or((0, 0))
}

fn segment_files(j: &Journal) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(j.dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_journal_not_yet_made_reads_as_empty_and_is_not_made_by_reading() {
    let root = tempfile::tempdir().unwrap();
    let j = Journal::at(root.path());
    assert_eq!(j.totals().unwrap(), Totals::default());
    assert!(!j.dir().exists());
}

#[test]
fn the_journal_is_root_only() {
    let root = tempfile::tempdir().unwrap();
    let j = Journal::at(root.path());
    j.append(&restore("a", true)).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(j.dir()), 0o700);
    for p in segment_files(&j) {
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
}

#[test]
fn a_record_torn_by_a_killed_writer_is_skipped_and_nothing_before_or_after_is_lost() {
    let root = tempfile::tempdir().unwrap();
    let j = Journal::at(root.path());
    j.append(&restore("a", true)).unwrap();
    j.append(&restore("a", false)).unwrap();
    // What a SIGKILL mid-write leaves: the start of a third record.
    let seg = segment_files(&j).pop().unwrap();
    let torn = restore("a", true).encode();
    let mut f = File::options().append(true).open(&seg).unwrap();
    f.write_all(&torn[..torn.len() / 2]).unwrap();
    drop(f);
    let t = j.totals().unwrap();
    assert_eq!(restores(&j, "a"), (1, 1));
    assert_eq!(t.skipped, 1);
    // The next writer ends the torn line; its own record counts.
    j.append(&restore("a", true)).unwrap();
    assert_eq!(restores(&j, "a"), (2, 1));
    assert_eq!(j.totals().unwrap().skipped, 1);
}

#[test]
fn rotation_bounds_the_segments_and_no_counter_goes_backwards() {
    let root = tempfile::tempdir().unwrap();
    let j = Journal::at(root.path()).with_max_segment(1024);
    let line = restore("a", true).encode().len() as u64;
    let mut previous = 0;
    for n in 1..=200u64 {
        j.append(&restore("a", true)).unwrap();
        let (ok, _) = restores(&j, "a");
        assert_eq!(ok, n);
        assert!(ok >= previous);
        previous = ok;
        let on_disk: u64 = segment_files(&j)
            .iter()
            .map(|p| fs::metadata(p).unwrap().len())
            .sum();
        assert!(on_disk <= 1024 + line, "{on_disk} bytes of segments");
    }
    let t = j.totals().unwrap();
    assert!(t.folded_through > 1, "rotated {} times", t.folded_through);
    assert_eq!(t.durations["restore"]["criu"].count, 200);
}

#[test]
fn a_crash_after_the_totals_but_before_the_segments_went_counts_nothing_twice() {
    let root = tempfile::tempdir().unwrap();
    let j = Journal::at(root.path()).with_max_segment(1);
    j.append(&restore("a", true)).unwrap();
    let seg = segment_files(&j).pop().unwrap();
    let kept = fs::read(&seg).unwrap();
    // This append folds segment 1 into the totals and removes it ...
    j.append(&restore("a", true)).unwrap();
    assert_eq!(restores(&j, "a"), (2, 0));
    // ... a crash before the removal would have left it there.
    fs::write(&seg, kept).unwrap();
    assert_eq!(restores(&j, "a"), (2, 0));
    j.append(&restore("a", true)).unwrap();
    assert_eq!(restores(&j, "a"), (3, 0));
    assert!(
        !seg.exists(),
        "the next rotation removes the folded segment"
    );
}

#[test]
fn a_half_written_checkpoint_is_never_read() {
    let root = tempfile::tempdir().unwrap();
    let j = Journal::at(root.path()).with_max_segment(1);
    j.append(&restore("a", true)).unwrap();
    j.append(&restore("a", true)).unwrap();
    // A rotation killed while writing the temporary file.
    fs::write(j.dir().join(".totals.json.tmp"), b"{\"folded_thr").unwrap();
    assert_eq!(restores(&j, "a"), (2, 0));
    j.append(&restore("a", true)).unwrap();
    assert_eq!(restores(&j, "a"), (3, 0));
}

#[test]
fn writers_in_many_threads_lose_no_record() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let j = Journal::at(&path).with_max_segment(2048);
                for _ in 0..50 {
                    j.append(&restore("a", true)).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let j = Journal::at(&path);
    assert_eq!(restores(&j, "a"), (200, 0));
    assert_eq!(j.totals().unwrap().skipped, 0);
}
