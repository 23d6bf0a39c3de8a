//! `vsnap ls`, `rm`, `gc` and `key` against real artifact folders under a
//! temporary root (the harness in support/: artifacts sealed through the
//! vsnap-artifact API). Run as root, as CI does.

mod support;
use support::*;

#[test]
fn ls_shows_ok_invalid_and_in_use() {
    let Some(f) = Fixture::new() else { return };
    f.make("alpha", Duration::ZERO, 2048);
    f.make("beta", Duration::ZERO, 2048);
    f.make("gamma", Duration::ZERO, 2048);
    f.tamper("beta");
    let _reader = ArtifactLock::shared(&f.root, "gamma").unwrap();
    let _writer = Staging::new(&f.root, "delta").unwrap();

    let out = f.vsnap(&["ls"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three artifacts:\n{stdout}");
    let header = lines[0];
    assert!(header.starts_with("NAME     CREATED"), "{stdout}");
    let status_col = header.find("STATUS").unwrap();
    let source_col = header.find("SOURCE").unwrap();
    let size_col = header.find("SIZE").unwrap();
    let status_of = |name: &str| {
        let line = lines.iter().find(|l| l.starts_with(name)).unwrap();
        let source = if name == "beta" { "someone-" } else { "src-" };
        assert!(line[source_col..].starts_with(source), "aligned: {line}");
        assert!(
            line[size_col..].starts_with(|c: char| c.is_ascii_digit()),
            "aligned: {line}"
        );
        line[status_col..].to_string()
    };
    assert_eq!(status_of("alpha"), "ok");
    assert!(
        status_of("beta").starts_with("invalid: beta/manifest.json: MAC does not verify"),
        "{stdout}"
    );
    assert_eq!(status_of("gamma"), "in-use");

    let (code, v) = f.json(&["ls", "--json"]);
    assert_eq!(code, 0);
    let rows = v.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
    assert_eq!(rows[0]["status"], "ok");
    assert_eq!(rows[1]["status"], "invalid");
    assert_eq!(rows[1]["valid"], false);
    assert_eq!(rows[1]["source_container"], "someone-else");
    assert_eq!(
        (&rows[2]["status"], &rows[2]["valid"]),
        (&json!("in-use"), &json!(true))
    );
    assert!(rows[0]["size_bytes"].as_u64().unwrap() > 2048);
    assert_eq!(rows[0]["image_bytes"], 2048 + 9);
}

#[test]
fn ls_never_follows_a_symlinked_entry() {
    let Some(f) = Fixture::new() else { return };
    std::os::unix::fs::symlink("/", f.root.join("evil")).unwrap();
    let (code, v) = f.json(&["ls", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v[0]["name"], "evil");
    assert_eq!(v[0]["size_bytes"], 0, "not walked");
    assert!(
        v[0]["reason"].as_str().unwrap().contains("is a symlink"),
        "{v}"
    );
    let out = f.vsnap(&["verify", "evil"]);
    assert_eq!(out.status.code(), Some(1));
    // Removing it removes the link, nothing behind it.
    assert_eq!(f.vsnap(&["rm", "evil"]).status.code(), Some(0));
    assert!(Path::new("/etc").exists() && !f.exists("evil"));
}

#[test]
fn ls_of_an_empty_or_missing_root_shows_the_header() {
    let Some(f) = Fixture::new() else { return };
    let (stdout, _) = text(&f.vsnap(&["ls"]));
    assert_eq!(stdout, "NAME    CREATED    SIZE    SOURCE    STATUS\n");
    let out = Command::new(env!("CARGO_BIN_EXE_vsnap"))
        .args(["--root", "/nonexistent/vsnap", "--config"])
        .arg(&f.config)
        .args(["ls", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn rm_refuses_an_artifact_in_use_and_removes_otherwise() {
    let Some(f) = Fixture::new() else { return };
    f.make("busy", Duration::ZERO, 100);
    f.make("idle", Duration::ZERO, 100);
    let lock = ArtifactLock::shared(&f.root, "busy").unwrap();
    let out = f.vsnap(&["rm", "busy"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rm busy: in use"), "{stderr}");
    assert!(f.exists("busy"));
    Manifest::load_verified(&f.root, "busy").expect("untouched");

    let out = f.vsnap(&["rm", "idle"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    assert_eq!(text(&out).0, "idle\n");
    assert!(!f.exists("idle"));

    drop(lock);
    let (code, v) = f.json(&["rm", "busy", "nope", "--json"]);
    assert_eq!(code, 1, "one was missing");
    assert_eq!(
        v[0],
        json!({"name": "busy", "removed": true, "error": null})
    );
    assert_eq!(v[1]["removed"], false);
    assert_eq!(v[1]["error"], "no such artifact");
    assert!(!f.exists("busy"));
    assert!(
        !f.entries().iter().any(|e| e.starts_with(".trash-")),
        "{:?}",
        f.entries()
    );
    assert!(
        !f.root.join(".locks/nope.lock").exists(),
        "a missing name leaves no lock file"
    );

    let out = f.vsnap(&["rm", "ok-name", "../../etc"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "paths are refused before anything is removed"
    );
}

#[test]
fn gc_by_age_dry_run_first() {
    let Some(f) = Fixture::new() else { return };
    f.make("old", 10 * DAY, 100);
    f.make("old-busy", 9 * DAY, 100);
    f.make("new", DAY, 100);
    let _lock = ArtifactLock::shared(&f.root, "old-busy").unwrap();

    let out = f.vsnap(&["gc", "--older-than", "7d", "--dry-run"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let old = stdout.lines().find(|l| l.starts_with("old ")).unwrap();
    assert!(
        old.contains("artifact")
            && old.contains("10d")
            && old.contains("older than 7d")
            && old.ends_with("would remove"),
        "{stdout}"
    );
    let busy = stdout.lines().find(|l| l.starts_with("old-busy")).unwrap();
    assert!(busy.ends_with("kept: in use"), "{stdout}");
    assert!(!stdout.contains("new "), "{stdout}");
    assert!(stdout.contains("dry run: nothing removed"), "{stdout}");
    assert!(f.exists("old") && f.exists("old-busy") && f.exists("new"));

    let (code, v) = f.json(&["gc", "--older-than", "7d", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["dry_run"], false);
    let results: Vec<(&str, &str)> = v["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a["result"].as_str().unwrap()))
        .collect();
    assert_eq!(results, [("old", "removed"), ("old-busy", "in-use")]);
    assert!(v["actions"][0]["age_seconds"].as_u64().unwrap() >= 10 * 86_400);
    assert!(!f.exists("old") && f.exists("old-busy") && f.exists("new"));
    assert!(!f.entries().iter().any(|e| e.starts_with(".trash-")));
}

#[test]
fn gc_by_size_removes_the_oldest_until_the_total_fits() {
    let Some(f) = Fixture::new() else { return };
    f.make("a3", 3 * DAY, 100 << 10);
    f.make("b2", 2 * DAY, 100 << 10);
    f.make("c1", DAY, 100 << 10);
    // Manifests differ by a byte or two (names, times).
    let size = |name: &str| bytes_under(&f.root.join(name));
    let (a3, b2, c1) = (size("a3"), size("b2"), size("c1"));
    assert!(a3 > 100 << 10 && a3 < 110 << 10, "{a3}");

    // Fits two: the oldest goes.
    let (code, v) = f.json(&["gc", "--max-total-size", "250K", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["actions"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["actions"][0]["name"], "a3");
    assert_eq!(v["total_bytes_before"], a3 + b2 + c1);
    assert_eq!(v["total_bytes_after"], b2 + c1);
    assert!(f.exists("a3"), "a dry run removes nothing");

    let out = f.vsnap(&["gc", "--max-total-size", "250K"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("removed") && stdout.contains("is over 250.0 KiB"),
        "{stdout}"
    );
    assert!(!f.exists("a3") && f.exists("b2") && f.exists("c1"));

    // The newest is in use: what can go goes, and the total still does not fit.
    let _lock = ArtifactLock::shared(&f.root, "c1").unwrap();
    let (code, v) = f.json(&["gc", "--max-total-size", "1K", "--json"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["fits"], false);
    assert_eq!(v["total_bytes_after"], c1);
    assert!(!f.exists("b2") && f.exists("c1"));
}

#[test]
fn gc_removes_stale_leftovers_whose_writer_is_gone() {
    let Some(f) = Fixture::new() else { return };
    let mk = |name: &str, ago: Duration| {
        let dir = f.root.join(name);
        fs::create_dir(&dir).unwrap();
        write_private(&dir.join("pages-1.img"), b"half");
        set_mtime(&dir, ago);
    };
    let hours = |h: u64| Duration::from_secs(h * 3600);
    mk(&format!(".staging-crashed-{DEAD_PID}-0"), hours(2));
    mk(&format!(".trash-gone-{DEAD_PID}-3"), hours(5));
    mk(
        &format!(".staging-recent-{DEAD_PID}-1"),
        Duration::from_secs(600),
    );
    mk(
        &format!(".staging-alive-{}-2", std::process::id()),
        hours(2),
    );
    mk(&format!(".staging-locked-{DEAD_PID}-4"), hours(2));
    mk(".staging-odd", hours(2));
    let _lock = ArtifactLock::exclusive(&f.root, "locked").unwrap();

    let (code, v) = f.json(&["gc", "--dry-run", "--json"]);
    assert_eq!(code, 0, "{v}");
    // The lock says whether a writer lives, not the folder's age or a pid.
    assert_eq!(v["actions"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(
        f.entries().len(),
        7,
        "six leftovers and .locks: {:?}",
        f.entries()
    );

    let out = f.vsnap(&["gc"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(".staging-crashed-{DEAD_PID}-0")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("writer (pid {DEAD_PID}) is gone")),
        "{stdout}"
    );
    let left = f.entries();
    for removed in ["crashed", "gone", "recent", "alive"] {
        assert!(!left.iter().any(|e| e.contains(removed)), "{left:?}");
    }
    for kept in ["locked", "odd"] {
        assert!(left.iter().any(|e| e.contains(kept)), "{kept}: {left:?}");
    }

    let (stdout, _) = text(&f.vsnap(&["gc"]));
    assert!(stdout.starts_with("nothing to remove\n"), "{stdout}");
}

#[test]
fn key_generate_makes_a_fleet_key_pair_and_never_overwrites_one() {
    let Some(f) = Fixture::new() else { return };
    let dir = f.root.parent().unwrap().to_path_buf();
    let (private, public) = (dir.join("fleet.key"), dir.join("fleet.pub"));
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vsnap"))
            .args(args)
            .output()
            .unwrap()
    };
    let (p, q) = (private.to_str().unwrap(), public.to_str().unwrap());
    // No config or artifact root is needed to make keys.
    let out = run(&[
        "--config",
        "/nonexistent/vsnap.toml",
        "key",
        "generate",
        "--private",
        p,
        "--public",
        q,
        "--json",
    ]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let id = v["key_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ed25519:"), "{v}");
    assert_eq!(
        fs::metadata(&private).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // The halves work together through the library's API.
    let signer = vsnap_artifact::FleetSigner::load(&private).unwrap();
    assert_eq!(signer.key_id(), id);
    let trusted = vsnap_artifact::TrustedKeys::load(std::slice::from_ref(&public)).unwrap();
    let sig = signer.sign(b"payload");
    assert_eq!(trusted.verify(b"payload", Some(&sig)).unwrap(), id);

    let before = fs::read(&private).unwrap();
    let out = run(&[
        "key",
        "generate",
        "--private",
        p,
        "--public",
        &format!("{q}.2"),
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("never overwritten"), "{stderr}");
    assert_eq!(fs::read(&private).unwrap(), before);
    let out = run(&["key", "generate", "--private", p]);
    assert_eq!(out.status.code(), Some(2), "--public is required");
}

#[test]
fn gc_removes_kept_criu_logs_older_than_its_age() {
    let Some(f) = Fixture::new() else { return };
    let logs = f.root.join(vsnap_artifact::criu_logs::DIR);
    fs::create_dir_all(&logs).unwrap();
    for (name, ago) in [
        ("old-m-c1-dump.log", 10 * DAY),
        ("new-m-c2-restore.log", DAY),
    ] {
        fs::write(
            logs.join(name),
            b"Error (criu/cr-dump.c:1): Dumping FAILED.\n",
        )
        .unwrap();
        set_mtime(&logs.join(name), ago);
    }
    // Without an age they stay.
    let (code, v) = f.json(&["gc", "--json"]);
    assert_eq!(
        (code, v["actions"].as_array().unwrap().len()),
        (0, 0),
        "{v}"
    );
    let (code, v) = f.json(&["gc", "--older-than", "7d", "--json"]);
    assert_eq!(code, 0, "{v}");
    let a = &v["actions"][0];
    assert_eq!(
        (a["name"].as_str(), a["kind"].as_str(), a["result"].as_str()),
        (
            Some(".criu-logs/old-m-c1-dump.log"),
            Some("criu-log"),
            Some("removed")
        ),
        "{v}"
    );
    assert_eq!(v["actions"].as_array().unwrap().len(), 1, "{v}");
    assert!(!logs.join("old-m-c1-dump.log").exists());
    assert!(logs.join("new-m-c2-restore.log").exists());
}
