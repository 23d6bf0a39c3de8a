//! The `vsnap` binary against real artifact folders built with the
//! vsnap-artifact API (staging, sealed manifest, atomic publish) under a
//! temporary root. The artifact checks demand a root-owned path, so these
//! tests run as root (as CI does) and skip themselves otherwise.

mod support;
use support::*;

#[test]
fn inspect_shows_identity_without_secrets_and_the_mac_status() {
    let Some(f) = Fixture::new() else { return };
    let m = f.make("demo", Duration::from_secs(3 * 3600), 4096);

    let out = f.vsnap(&["inspect", "demo"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    for want in [
        "Name:",
        "demo",
        "Capture ID:",
        "cap-demo",
        "src-demo",
        "verified",
        "3h ago",
        "cold start to capture-ready 1500 ms, inventory 3 ms, checkpoint 250 ms",
        "\"canary text\"",
        "[11,22,33]",
        "-0.25",
        "kernel_release:",
        "\"--api-key\",\"***:",
        "HF_TOKEN",
        "PATH",
        "example.com/engine:1",
        "/rootfs",
        "seccomp",
        "owner:",
        "k8s.io/team-a",
        "Memory:",
        "1031 MiB (pages 1024 MiB, /dev/shm 7 MiB)",
        "Zero pages:",
        "5.0 MiB (5242880 bytes) elided (1280 pages of 4 KiB",
    ] {
        assert!(stdout.contains(want), "{want:?} missing:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("({} bytes)", m.image_bytes)),
        "{stdout}"
    );
    assert!(!stdout.contains("s3cret") && !stdout.contains("hf_secret"));

    let (code, v) = f.json(&["inspect", "demo", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["name"], "demo");
    assert_eq!(v["mac"], "verified");
    assert_eq!(v["in_use"], false);
    assert_eq!(v["manifest"]["capture_id"], "cap-demo");
    assert_eq!(v["manifest"]["image_bytes"], m.image_bytes);
    assert_eq!(v["manifest"]["memory"]["pages_bytes"], 1024u64 << 20);
    assert_eq!(v["manifest"]["zero_pages"]["elided_bytes"], 5u64 << 20);
    assert_eq!(
        v["manifest"]["workload"]["env"]["HF_TOKEN"]
            .as_str()
            .unwrap()
            .len(),
        64
    );
    assert!(v["disk_bytes"].as_u64().unwrap() > m.image_bytes);
    let back: Manifest = serde_json::from_value(v["manifest"].clone()).unwrap();
    assert_eq!(back, m, "the manifest is shown whole");

    // An edited manifest is still shown, with the MAC failure named.
    f.tamper("demo");
    let out = f.vsnap(&["inspect", "demo"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout.contains("FAILS") && stdout.contains("someone-else"),
        "{stdout}"
    );
    let (_, v) = f.json(&["inspect", "demo", "--json"]);
    assert_eq!(v["mac"], "fails");

    // Without the host key nothing can be verified, but it can be inspected.
    fs::remove_file(f.root.join(".host-key")).unwrap();
    let (code, v) = f.json(&["inspect", "demo", "--json"]);
    assert_eq!((code, &v["mac"]), (0, &json!("no-host-key")));
    let (stdout, _) = text(&f.vsnap(&["inspect", "demo"]));
    assert!(stdout.contains("no host key"), "{stdout}");
}

#[test]
fn inspect_shows_where_a_pulled_artifact_came_from() {
    let Some(f) = Fixture::new() else { return };
    f.make("local", Duration::ZERO, 100);
    let (stdout, _) = text(&f.vsnap(&["inspect", "local"]));
    assert!(stdout.contains("Origin:        not pulled"), "{stdout}");
    assert!(stdout.contains("fingerprint key:    \"host\""), "{stdout}");
    let (_, v) = f.json(&["inspect", "local", "--json"]);
    assert!(v["manifest"].get("origin").is_none(), "{v}");

    let mut m = f.make("pulled", Duration::ZERO, 100);
    m.origin = Some(Origin {
        reference: "registry.example/engines/qwen:7b".into(),
        manifest_digest: format!("sha256:{}", "ab".repeat(32)),
        signed_by: Some("ed25519:0123456789abcdef".into()),
        pulled_at: "2026-12-01T10:00:00Z".into(),
    });
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("pulled"), m.to_bytes()).unwrap();
    let out = f.vsnap(&["inspect", "pulled"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "pulled from \"registry.example/engines/qwen:7b\" (manifest \"sha256:{}\"), signed by \"ed25519:0123456789abcdef\", at \"2026-12-01T10:00:00Z\"",
            "ab".repeat(32)
        )),
        "{stdout}"
    );
    assert!(stdout.contains("verified"), "{stdout}");
    let (_, v) = f.json(&["inspect", "pulled", "--json"]);
    assert_eq!(
        v["manifest"]["origin"]["signed_by"],
        "ed25519:0123456789abcdef"
    );
}

#[test]
fn inspect_refuses_paths_and_names_missing_artifacts() {
    let Some(f) = Fixture::new() else { return };
    for (args, code, says) in [
        (&["inspect", "nope"][..], 2, "does not exist"),
        (&["inspect", "../etc"], 2, "not an artifact name"),
        (&["verify", ".host-key"], 2, "not an artifact name"),
        (&["verify", "nope"], 2, "does not exist"),
    ] {
        let out = f.vsnap(args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn verify_passes_for_a_fresh_artifact() {
    let Some(f) = Fixture::new() else { return };
    f.make("good", Duration::ZERO, 1000);
    let out = f.vsnap(&["verify", "good"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("good: valid"), "{stdout}");
    let (code, v) = f.json(&["verify", "good", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["valid"], true);
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["status"], "ok", "{c}");
            c["check"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        checks,
        ["layout", "files", "manifest", "mac", "contents", "host", "clocks"]
    );
}

#[test]
fn inspect_shows_the_capture_clocks_and_verify_holds_this_hosts_to_them() {
    let Some(f) = Fixture::new() else { return };
    let mut m = f.make("clocked", Duration::ZERO, 100);
    let captured = m.clocks.clone().unwrap();
    let (stdout, _) = text(&f.vsnap(&["inspect", "clocked"]));
    assert!(
        stdout.contains(&format!(
            "Clocks:        boot id \"{}\", CLOCK_MONOTONIC ",
            captured.boot_id
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("(the capturing host's, right before the dump)"),
        "{stdout}"
    );
    let (_, v) = f.json(&["inspect", "clocked", "--json"]);
    assert_eq!(
        v["manifest"]["clocks"]["boot_id"],
        captured.boot_id.as_str()
    );
    let (code, v) = f.json(&["verify", "clocked", "--json"]);
    assert_eq!(code, 0, "{v}");
    let check = |v: &Value| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "clocks")
            .cloned()
            .unwrap()
    };
    assert_eq!(
        check(&v)["detail"],
        "this host's clocks are ahead of the capture's"
    );

    // Captured on a host up 10^6 s longer than this one: this kernel has
    // time namespaces, in which CRIU continues the captured clocks.
    m.clocks = Some(Clocks {
        boot_id: "another-boot".into(),
        monotonic_ns: captured.monotonic_ns + 1_000_000_000_000_000,
        boottime_ns: captured.boottime_ns + 1_000_000_000_000_000,
    });
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("clocked"), m.to_bytes()).unwrap();
    let (code, v) = f.json(&["verify", "clocked", "--json"]);
    if vsnap_artifact::clocks::has_time_namespaces() {
        assert_eq!(code, 0, "{v}");
        let detail = check(&v)["detail"].as_str().unwrap().to_string();
        assert!(detail.contains("boot id another-boot"), "{detail}");
        assert!(
            detail.contains("time namespace that continues the captured clocks"),
            "{detail}"
        );
    } else {
        assert_eq!(code, 1, "{v}");
        assert_eq!(check(&v)["status"], "failed");
    }

    // A manifest from before clocks were recorded.
    m.clocks = None;
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("clocked"), m.to_bytes()).unwrap();
    let (stdout, _) = text(&f.vsnap(&["inspect", "clocked"]));
    assert!(
        stdout.contains("Clocks:        - (not recorded"),
        "{stdout}"
    );
    let (code, v) = f.json(&["verify", "clocked", "--json"]);
    assert_eq!(code, 0, "{v}");
}

#[test]
fn verify_fails_an_edited_manifest() {
    let Some(f) = Fixture::new() else { return };
    f.make("edited", Duration::ZERO, 1000);
    f.tamper("edited");
    let out = f.vsnap(&["verify", "edited"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("mac         FAILED: FAILS"), "{stdout}");
    assert!(
        stdout.contains("edited: INVALID (1 check failed)"),
        "{stdout}"
    );
    let (code, v) = f.json(&["verify", "edited", "--json"]);
    assert_eq!((code, &v["valid"]), (1, &json!(false)));
    let mac = &v["checks"][3];
    assert_eq!(
        (&mac["check"], &mac["status"]),
        (&json!("mac"), &json!("failed"))
    );
}

#[test]
fn verify_fails_a_group_writable_artifact_folder() {
    let Some(f) = Fixture::new() else { return };
    f.make("perm", Duration::ZERO, 1000);
    let dir = f.root.join("perm");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
    let out = f.vsnap(&["verify", "perm"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("group/world-writable (mode 0770)"),
        "{stdout}"
    );
    let (_, v) = f.json(&["verify", "perm", "--json"]);
    let status: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        status,
        ["failed", "ok", "skipped", "skipped", "skipped", "skipped", "skipped"],
        "{v}"
    );
    // Inspect names the problem too, and reads nothing through it.
    let out = f.vsnap(&["inspect", "perm"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("group/world-writable"));
}

#[test]
fn verify_fails_changed_images_and_another_host() {
    let Some(f) = Fixture::new() else { return };
    f.make("img", Duration::ZERO, 1000);
    let page = f.root.join("img/images/pages-1.img");
    // One byte flipped: the digests catch it, naming the file and chunk;
    // --quick (sizes only) does not.
    let mut bytes = fs::read(&page).unwrap();
    bytes[500] ^= 1;
    fs::write(&page, &bytes).unwrap();
    let out = f.vsnap(&["verify", "img"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("images/pages-1.img chunk 0 (bytes 0-999) does not match its digest"),
        "{stdout}"
    );
    let out = f.vsnap(&["verify", "--quick", "img"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out).0);
    // Truncated: the size tells, with --quick too.
    fs::write(&page, vec![0u8; 10]).unwrap();
    for args in [&["verify", "img"][..], &["verify", "--quick", "img"]] {
        let out = f.vsnap(args);
        let (stdout, _) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        assert!(
            stdout.contains("images/pages-1.img holds 10 bytes, the manifest says 1000"),
            "{stdout}"
        );
    }

    // Sealed with this host's key but recording another kernel.
    f.make("moved", Duration::ZERO, 1000);
    let mut m = Manifest::load_verified(&f.root, "moved").unwrap();
    m.host.kernel_release = "0.0.1-elsewhere".into();
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("moved"), m.to_bytes()).unwrap();
    let out = f.vsnap(&["verify", "moved"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("host.kernel_release: captured \"0.0.1-elsewhere\", live"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("mac ") && l.contains(" ok: verifies")),
        "the MAC verifies: {stdout}"
    );

    // Another machine of a compatible kind: valid, and the difference shown.
    f.make("fleet", Duration::ZERO, 1000);
    let mut m = Manifest::load_verified(&f.root, "fleet").unwrap();
    m.host.machine_id = "another-machine".into();
    m.seal(&HostKey::load(&f.root).unwrap());
    fs::write(f.manifest_path("fleet"), m.to_bytes()).unwrap();
    let out = f.vsnap(&["verify", "fleet"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("allowed to differ: host.machine_id: captured \"another-machine\", live"),
        "{stdout}"
    );

    // A world-writable image file is named.
    f.make("loose", Duration::ZERO, 1000);
    let img = f.root.join("loose/images/inventory.img");
    fs::set_permissions(&img, fs::Permissions::from_mode(0o666)).unwrap();
    let out = f.vsnap(&["verify", "loose"]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("inventory.img is group/world-writable (mode 0666)"),
        "{stdout}"
    );
}

#[test]
fn inspect_says_whether_the_memory_images_are_sealed_and_verify_opens_them() {
    use vsnap_artifact::at_rest::{apply_in_place, Sealed};
    let Some(f) = Fixture::new() else { return };
    f.make("clear", Duration::ZERO, 100);
    let (stdout, _) = text(&f.vsnap(&["inspect", "clear"]));
    assert!(stdout.contains("At rest:       in clear"), "{stdout}");
    let (_, v) = f.json(&["inspect", "clear", "--json"]);
    assert_eq!(v["sealed_at_rest"], false, "{v}");

    // Its pages file sealed in place with this host's key, as a capture
    // with seal_at_rest does, and the manifest saying so.
    let mut m = f.make("sealed", Duration::ZERO, 5000);
    let key = HostKey::load(&f.root).unwrap();
    let sealed = Sealed::fresh().unwrap();
    let opener = sealed.opener(&key).unwrap();
    let pages = f.root.join("sealed/images/pages-1.img");
    apply_in_place(&pages, &opener.file("images/pages-1.img").unwrap()).unwrap();
    m.sealed = Some(sealed);
    m.seal(&key);
    fs::write(f.manifest_path("sealed"), m.to_bytes()).unwrap();
    let (stdout, _) = text(&f.vsnap(&["inspect", "sealed"]));
    assert!(
        stdout.contains("At rest:       sealed: images/pages-*.img with aes-256-ctr"),
        "{stdout}"
    );
    let (_, v) = f.json(&["inspect", "sealed", "--json"]);
    assert_eq!(v["sealed_at_rest"], true, "{v}");
    assert_eq!(v["manifest"]["sealed"]["cipher"], "aes-256-ctr", "{v}");
    let out = f.vsnap(&["verify", "sealed"]);
    assert_eq!(out.status.code(), Some(0), "{:?}", text(&out));
    // Opened with the key the digests hold; read as it lies, they fail.
    fs::write(&pages, vec![7u8; 5000]).unwrap();
    assert_ne!(f.vsnap(&["verify", "sealed"]).status.code(), Some(0));
}
