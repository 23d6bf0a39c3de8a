//! `vsnap gc` and the partial folders interrupted pulls leave under
//! `<root>/.pull/partial/` (registry/src/pull/partial.rs), made here as a
//! pull leaves them, under a temporary root. Run as root, as CI does.

mod support;
use std::io::Write;
use std::os::unix::fs::FileExt;
use support::*;

/// Apparent size of the partial folders' pages file: far more than the
/// chunk that landed in it.
const PAGES_LEN: u64 = 1 << 30;
const LANDED: usize = 256 << 10;

/// The partial folder of `name` as a pull that died `ago` leaves it: its
/// records, and a sparse tree with one chunk landed.
fn partial(f: &Fixture, name: &str, ago: Duration) -> PathBuf {
    let dir = f.root.join(".pull/partial").join(name);
    fs::create_dir_all(dir.join("tree/images")).unwrap();
    let pages = fs::File::create(dir.join("tree/images/pages-1.img")).unwrap();
    pages.set_len(PAGES_LEN).unwrap();
    pages.write_all_at(&vec![7u8; LANDED], 0).unwrap();
    pages.sync_all().unwrap();
    fs::write(dir.join("digest"), format!("sha256:{}\n", "a".repeat(64))).unwrap();
    fs::write(dir.join("landed"), format!("sha256:{}\n", "b".repeat(64))).unwrap();
    fs::write(dir.join("arrived"), b"").unwrap();
    for p in ["digest", "landed", "arrived", "tree/images", "tree", ""] {
        set_mtime(&dir.join(p), ago);
    }
    dir
}

fn action<'v>(v: &'v Value, name: &str) -> &'v Value {
    v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == format!(".pull/partial/{name}"))
        .unwrap_or_else(|| panic!("no action for {name}: {v}"))
}

fn actions(v: &Value) -> usize {
    v["actions"].as_array().unwrap().len()
}

#[test]
fn gc_removes_an_abandoned_partial_pull_and_keeps_a_recent_one() {
    let Some(f) = Fixture::new() else { return };
    let old = partial(&f, "old", 2 * DAY);
    let fresh = partial(&f, "fresh", Duration::ZERO);
    // A pull resumed it an hour ago: its record is what says so.
    let resumed = partial(&f, "resumed", 2 * DAY);
    set_mtime(&resumed.join("landed"), Duration::from_secs(3600));

    let (code, v) = f.json(&["gc", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(actions(&v), 1, "only the abandoned one: {v}");
    let a = action(&v, "old");
    assert_eq!(
        (a["kind"].as_str(), a["result"].as_str()),
        (Some("partial"), Some("removed")),
        "{v}"
    );
    assert!(a["age_seconds"].as_u64().unwrap() >= 2 * 86_400, "{v}");
    // What the sparse tree holds, not its length.
    let freed = a["size_bytes"].as_u64().unwrap();
    assert!(
        freed >= LANDED as u64 && freed < PAGES_LEN / 4,
        "allocated bytes: {v}"
    );
    assert_eq!(v["partial_bytes_freed"].as_u64(), Some(freed), "{v}");
    assert_eq!(v["total_bytes_before"], 0, "not an artifact: {v}");
    assert!(!old.exists());
    assert!(fresh.join("tree/images/pages-1.img").exists());
    assert!(resumed.join("tree/images/pages-1.img").exists());

    // A shorter grace age takes the resumed one too, never the fresh one.
    let out = f.vsnap(&["gc", "--partial-older-than", "30m"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(".pull/partial/resumed"), "{stdout}");
    assert!(
        stdout.contains("partial pull untouched for longer than 30m"),
        "{stdout}"
    );
    assert!(
        stdout.contains("partial pulls: ") && stdout.contains(" freed\n"),
        "{stdout}"
    );
    assert!(!resumed.exists());
    assert!(fresh.exists());
}

#[test]
fn gc_dry_run_removes_no_partial_pull() {
    let Some(f) = Fixture::new() else { return };
    let old = partial(&f, "old", 2 * DAY);
    let before = partial_bytes(&old);

    let (code, v) = f.json(&["gc", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(action(&v, "old")["result"], "would-remove", "{v}");
    assert_eq!(v["partial_bytes_freed"].as_u64(), Some(before), "{v}");
    let out = f.vsnap(&["gc", "--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("would remove"), "{stdout}");
    assert!(stdout.contains("would be freed"), "{stdout}");

    assert_eq!(partial_bytes(&old), before, "nothing removed");
    assert!(old.join("digest").exists() && old.join("landed").exists());
    assert!(
        !f.root.join(".pull/locks").exists(),
        "looking takes no lock and makes nothing"
    );
}

#[test]
fn gc_keeps_a_partial_pull_whose_lock_is_held() {
    let Some(f) = Fixture::new() else { return };
    let old = partial(&f, "held", 2 * DAY);
    let locks = f.root.join(".pull/locks");
    fs::create_dir_all(&locks).unwrap();
    // Another open file description holds the pull lock, as a pull under
    // way (or a restore streaming from it) does.
    let lock = fs::File::create(locks.join("held.lock")).unwrap();
    lock.lock().unwrap();

    for args in [&["gc", "--json"][..], &["gc", "--dry-run", "--json"]] {
        let (code, v) = f.json(args);
        assert_eq!(code, 0, "{args:?}: {v}");
        assert_eq!(action(&v, "held")["result"], "in-use", "{args:?}: {v}");
        assert_eq!(v["partial_bytes_freed"], 0, "{v}");
    }
    let (stdout, _) = text(&f.vsnap(&["gc"]));
    assert!(stdout.contains("kept: in use"), "{stdout}");
    assert!(old.join("digest").exists() && old.join("tree").exists());

    drop(lock);
    let (code, v) = f.json(&["gc", "--json"]);
    assert_eq!(
        (code, action(&v, "held")["result"].as_str()),
        (0, Some("removed")),
        "{v}"
    );
    assert!(!old.exists());
}

#[test]
fn gc_leaves_alone_what_is_not_the_partial_folder_of_a_name() {
    let Some(f) = Fixture::new() else { return };
    let partials = f.root.join(".pull/partial");
    fs::create_dir_all(&partials).unwrap();
    // What a symlink points to is never touched, nor the link.
    let outside = f.root.parent().unwrap().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), b"keep").unwrap();
    std::os::unix::fs::symlink(&outside, partials.join("link")).unwrap();
    fs::create_dir(partials.join(".hidden")).unwrap();
    fs::create_dir(partials.join("a b")).unwrap();
    let mut file = fs::File::create(partials.join("plain")).unwrap();
    file.write_all(b"x").unwrap();
    for e in [".hidden", "a b", "plain"] {
        set_mtime(&partials.join(e), 2 * DAY);
    }

    let (code, v) = f.json(&["gc", "--partial-older-than", "0s", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(actions(&v), 4, "{v}");
    for (name, why) in [
        (".hidden", "not an artifact name"),
        ("a b", "not an artifact name"),
        ("link", "a symlink"),
        ("plain", "not a folder"),
    ] {
        let a = action(&v, name);
        assert_eq!(a["result"], "left-alone", "{name}: {v}");
        assert!(a["reason"].as_str().unwrap().contains(why), "{name}: {v}");
        assert!(
            fs::symlink_metadata(partials.join(name)).is_ok(),
            "{name} stays"
        );
    }
    assert!(outside.join("keep").exists());
    let (stdout, _) = text(&f.vsnap(&["gc"]));
    assert!(stdout.contains("left alone"), "{stdout}");
}

/// Allocated bytes under `dir`.
fn partial_bytes(dir: &Path) -> u64 {
    let md = fs::symlink_metadata(dir).unwrap();
    let mut total = md.blocks() * 512;
    if md.is_dir() {
        for e in fs::read_dir(dir).unwrap() {
            total += partial_bytes(&e.unwrap().path());
        }
    }
    total
}
