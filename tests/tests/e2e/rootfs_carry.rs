//! The container's root filesystem across a capture, with the reference
//! engine run from an OCI image (a real overlay snapshot per container, as
//! under ctr or CRI with a real image): a file the cold start wrote into
//! its writable layer and keeps open travels with the artifact; a tampered
//! carried layer and a changed volume file are refused before CRIU runs.

use std::time::Duration;

use vsnap_e2e::cmd::CmdOutput;
use vsnap_e2e::engine::{engine_rootfs, free_port, wait_listening};
use vsnap_e2e::image::import_image;
use vsnap_e2e::snapshot_env::{answers, assert_has, flip_middle_byte, largest_image, setup, Env};

const IMAGE: &str = "localhost/vsnap-ref-engine:rootfs";

/// The cold start writes a compiled-cache-like file into its writable
/// layer and keeps it open on fd 3 for its whole life (as Triton keeps
/// its launcher `.so` mapped), then becomes the engine.
const WRITES_ITS_ROOTFS: &str = "busybox mkdir -p /root/.triton/cache/ab12 && \
     echo launcher > /root/.triton/cache/ab12/cuda_utils.so && \
     busybox rm -f /etc/deleted-by-engine && \
     exec 3</root/.triton/cache/ab12/cuda_utils.so && exec /vsnap-ref-engine";

/// Donors stop after their capture.
const EXIT: &str = "vsnap.io/after-capture=exit";

/// A plan for the engine from [`IMAGE`] running `script`.
fn run_image(e: &Env, id: &str, plan: &str, port: u16, extra: &[&str], script: &str) -> CmdOutput {
    let mut extra_all = vec!["--annotation", EXIT];
    extra_all.extend_from_slice(extra);
    let cmd = e.plan_command(
        id,
        plan,
        "layer",
        port,
        &extra_all,
        &[IMAGE],
        &["/bin/sh", "-c", script],
    );
    vsnap_e2e::cmd::run(cmd, None, Duration::from_secs(180))
}

fn image_env(tag: &str) -> Env {
    let e = setup(tag);
    let work = e.c.dir.join("engine-image");
    let root = engine_rootfs(&work);
    std::fs::create_dir_all(root.join("root")).unwrap();
    std::fs::write(root.join("etc/deleted-by-engine"), b"in the image").unwrap();
    import_image(&e.c, &work, &root, IMAGE, serde_json::json!({}));
    e
}

fn create(e: &Env, id: &str, extra: &[&str], script: &str) -> serde_json::Value {
    let out = run_image(e, id, "create", free_port(), extra, script);
    assert!(out.ok(), "{out:?}");
    let manifest = e.wait_manifest("layer");
    e.wait_stopped(id);
    e.remove(id);
    manifest
}

/// One byte of the carried layer changed: the file the engine wrote.
fn tamper_layer(e: &Env) {
    let tar = e.artifact("layer").join("rootfs/upper.tar");
    let mut bytes = std::fs::read(&tar).unwrap();
    let at = bytes
        .windows(8)
        .position(|w| w == b"launcher")
        .expect("the file's bytes");
    bytes[at] = b'L';
    std::fs::write(&tar, &bytes).unwrap();
}

#[test]
fn the_writable_layer_travels_and_a_tampered_one_is_refused() {
    let e = image_env("rootfs-carry");
    let manifest = create(&e, "layer-donor", &[], WRITES_ITS_ROOTFS);
    let layer = &manifest["rootfs"]["layer"];
    assert_eq!(layer["kind"], "overlay-upper", "{manifest}");
    assert!(layer["bytes"].as_u64().unwrap() >= 9, "{layer}");
    assert!(
        manifest["contents"]["rootfs/upper.tar"]["size"]
            .as_u64()
            .unwrap()
            > 0,
        "the layer is under the digests: {}",
        manifest["contents"]
    );

    // Each restore gets a fresh snapshot of the image: the layer is put back.
    let mut reference = None;
    for copy in ["layer-copy1", "layer-copy2"] {
        let port = free_port();
        let out = run_image(&e, copy, "restore", port, &[], WRITES_ITS_ROOTFS);
        assert!(out.ok(), "{copy}: {out:?}\n{}", e.c.log_tail());
        wait_listening(port, Duration::from_secs(30));
        let a = answers(port);
        assert_eq!(reference.get_or_insert_with(|| a.clone()), &a);
        let cat = |path: &str| {
            e.c.ctr(&["task", "exec", "--exec-id", "cat", copy, "/bin/cat", path])
        };
        let so = cat("/root/.triton/cache/ab12/cuda_utils.so");
        assert_eq!(so.stdout, "launcher\n", "{copy}: {so:?}");
        // A file the cold start deleted from the image stays deleted.
        let gone = cat("/etc/deleted-by-engine");
        assert!(!gone.ok(), "{copy}: the whiteout travelled: {gone:?}");
        e.remove(copy);
    }

    // One byte of the carried layer changed: refused at create, naming it.
    tamper_layer(&e);
    let out = run_image(
        &e,
        "layer-tampered",
        "restore",
        free_port(),
        &[],
        WRITES_ITS_ROOTFS,
    );
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "restore: rootfs",
            "rootfs/upper.tar",
            "does not match its digest",
        ],
    );
    let _ = e.c.ctr(&["c", "rm", "layer-tampered"]);
    e.assert_nothing_left();
}

#[test]
fn a_changed_volume_file_is_refused_before_criu() {
    let e = image_env("rootfs-volume");
    let data = e.c.dir.join("volume");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("weights.bin"), b"the weights").unwrap();
    let mount = format!(
        "type=bind,src={},dst=/data,options=rbind:ro",
        data.display()
    );
    let holds_volume_file = "exec 4</data/weights.bin && exec /vsnap-ref-engine";
    let extra = ["--mount", mount.as_str()];
    let manifest = create(&e, "vol-donor", &extra, holds_volume_file);
    let files = manifest["rootfs"]["open_files"].as_array().unwrap();
    assert!(
        files
            .iter()
            .any(|f| f["path"] == "/data/weights.bin" && f["volume"] == "/data"),
        "{manifest}"
    );
    // Unchanged: restores.
    let port = free_port();
    let out = run_image(&e, "vol-copy", "restore", port, &extra, holds_volume_file);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    e.remove("vol-copy");
    // Changed (same size): refused in the preflight, naming the file.
    std::fs::write(data.join("weights.bin"), b"THE weights").unwrap();
    let out = run_image(
        &e,
        "vol-changed",
        "restore",
        free_port(),
        &extra,
        holds_volume_file,
    );
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "restore: preflight: volume file /data/weights.bin",
            "changed since the capture",
        ],
    );
    let _ = e.c.ctr(&["c", "rm", "vol-changed"]);
    // The same volume from a folder without the file: it vanished.
    let other = e.c.dir.join("volume2");
    std::fs::create_dir_all(&other).unwrap();
    let mount2 = format!(
        "type=bind,src={},dst=/data,options=rbind:ro",
        other.display()
    );
    let extra2 = ["--mount", mount2.as_str()];
    let out = run_image(
        &e,
        "vol-missing",
        "restore",
        free_port(),
        &extra2,
        holds_volume_file,
    );
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &[
            "volume file /data/weights.bin",
            "vanished since the capture",
        ],
    );
    let _ = e.c.ctr(&["c", "rm", "vol-missing"]);
    e.assert_nothing_left();
}

/// A rootfs folder the create and its restores share (`ctr run --rootfs`)
/// carries nothing (the manifest says so); a file the tree held open there
/// that is gone at the restore fails CRIU, and the error names the file,
/// not only CRIU's last lines.
#[test]
fn a_shared_rootfs_carries_nothing_and_a_vanished_file_is_named() {
    let e = setup("rootfs-shared");
    let root = engine_rootfs(&e.c.dir.join("shared"));
    std::fs::create_dir_all(root.join("root/.cache")).unwrap();
    std::fs::write(root.join("root/.cache/held.bin"), b"held open").unwrap();
    let script = "exec 3</root/.cache/held.bin && exec /vsnap-ref-engine";
    let root = root.display().to_string();
    let run = |id: &str, plan: &str| {
        let workload = ["--rootfs", root.as_str()];
        let cmd = e.plan_command(
            id,
            plan,
            "shared",
            free_port(),
            &["--annotation", EXIT],
            &workload,
            &["/bin/sh", "-c", script],
        );
        vsnap_e2e::cmd::run(cmd, None, Duration::from_secs(180))
    };
    let out = run("shared-donor", "create");
    assert!(out.ok(), "{out:?}");
    let manifest = e.wait_manifest("shared");
    assert_eq!(
        manifest["rootfs"]["layer"]["kind"], "shared-folder",
        "{manifest}"
    );
    assert!(!e.artifact("shared").join("rootfs").exists());
    e.wait_stopped("shared-donor");
    e.remove("shared-donor");
    std::fs::remove_file(std::path::Path::new(&root).join("root/.cache/held.bin")).unwrap();
    let out = run("shared-copy", "restore");
    assert!(!out.ok(), "{out:?}");
    assert_has(
        &out.stderr,
        &["restore: runc restore failed", "root/.cache/held.bin"],
    );
    let _ = e.c.ctr(&["c", "rm", "shared-copy"]);
    e.assert_nothing_left();
}

/// A writable layer larger than `rootfs_diff_limit_bytes` fails the capture
/// naming its largest paths; nothing is published.
#[test]
fn a_layer_over_the_limit_fails_the_capture_naming_its_largest_paths() {
    let e = image_env("rootfs-limit");
    let config = std::fs::read_to_string(&e.config).unwrap();
    std::fs::write(
        &e.config,
        format!("{config}rootfs_diff_limit_bytes = 1048576\n"),
    )
    .unwrap();
    let writes_3_mib = "busybox mkdir -p /root/.cache/huggingface && \
         busybox dd if=/dev/zero of=/root/.cache/huggingface/model.bin bs=1M count=3 2>/dev/null && \
         exec /vsnap-ref-engine";
    let out = run_image(&e, "limit-donor", "create", free_port(), &[], writes_3_mib);
    assert!(out.ok(), "{out:?}");
    let error = e.wait_capture_failed("limit-donor");
    assert_has(
        &error,
        &[
            "capture: rootfs: ",
            "rootfs_diff_limit_bytes (1 MiB)",
            "/root/.cache/huggingface/model.bin (3 MiB)",
        ],
    );
    e.remove("limit-donor");
    e.assert_nothing_published();
    e.assert_nothing_left();
}

/// `GET /watch` of the engine on `port`: the names its watched folder saw.
fn watch_events(port: u16) -> Vec<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /watch HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["dir"], "/root/.cache/vllm", "{v}");
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// An inotify watch on a folder of the writable layer (a cache folder on
/// the overlay root, whose file handles CRIU cannot open) is captured and
/// fires in every restored copy; the copy sees its own events only.
#[test]
fn an_inotify_watch_on_the_writable_layer_fires_after_restore() {
    let e = image_env("rootfs-watch");
    let env = ["--env", "VSNAP_ENGINE_WATCH=/root/.cache/vllm"];
    let manifest = create(&e, "watch-donor", &env, "exec /vsnap-ref-engine");
    assert_eq!(
        manifest["rootfs"]["layer"]["kind"], "overlay-upper",
        "{manifest}"
    );
    for copy in ["watch-copy1", "watch-copy2"] {
        let port = free_port();
        let out = run_image(&e, copy, "restore", port, &env, "exec /vsnap-ref-engine");
        assert!(out.ok(), "{copy}: {out:?}\n{}", e.c.log_tail());
        wait_listening(port, Duration::from_secs(30));
        assert_eq!(watch_events(port), Vec::<String>::new(), "{copy}");
        let name = format!("reload-{copy}");
        let write = format!("echo x > /root/.cache/vllm/{name}");
        let out = e.c.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "touch",
            copy,
            "/bin/sh",
            "-c",
            &write,
        ]);
        assert!(out.ok(), "{copy}: {out:?}");
        vsnap_e2e::snapshot_env::poll(
            Duration::from_secs(60),
            &format!("{copy}: the watch fires"),
            || watch_events(port).contains(&name),
        );
        e.remove(copy);
    }
    e.assert_nothing_left();
}

/// Under `auto`, a carried layer that does not match its digest is
/// damage: the artifact is set aside, what was unpacked of it is emptied,
/// and the same create starts cold and captures anew; the next start
/// restores the fresh layer.
#[test]
fn under_auto_a_tampered_layer_is_set_aside_and_the_start_captures_anew() {
    let e = image_env("rootfs-auto");
    let old = create(&e, "la-0", &[], WRITES_ITS_ROOTFS);
    tamper_layer(&e);
    let out = run_image(&e, "la-1", "auto", free_port(), &[], WRITES_ITS_ROOTFS);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    let reason = e.artifacts.join(".quarantine/layer/quarantine.json");
    let reason: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&reason).unwrap()).unwrap();
    assert_eq!(reason["cause"], "damaged", "{reason}");
    assert_has(reason["message"].as_str().unwrap(), &["rootfs/upper.tar"]);
    let fresh = e.wait_manifest("layer");
    assert_ne!(fresh["mac"], old["mac"]);
    e.wait_stopped("la-1");
    e.remove("la-1");
    let port = free_port();
    let out = run_image(&e, "la-2", "auto", port, &[], WRITES_ITS_ROOTFS);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    wait_listening(port, Duration::from_secs(30));
    let so = e.c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "cat",
        "la-2",
        "/bin/cat",
        "/root/.triton/cache/ab12/cuda_utils.so",
    ]);
    assert_eq!(so.stdout, "launcher\n", "{so:?}");
    e.remove("la-2");
}

/// Under `auto`, a restore that fails at Start after its carried layer was
/// unpacked (a flipped byte of memory, found beside CRIU): the same start
/// goes on cold on the writable layer emptied again. The script refuses to
/// start on a layer that still holds the file the capture carried, so the
/// fresh artifact is published only if the layer was emptied.
#[test]
fn under_auto_a_restore_that_fails_at_start_goes_on_cold_on_an_emptied_layer() {
    let e = image_env("rootfs-cold");
    let fresh_only =
        format!("[ ! -e /root/.triton/cache/ab12/cuda_utils.so ] || exit 7; {WRITES_ITS_ROOTFS}");
    let old = create(&e, "lc-0", &[], &fresh_only);
    flip_middle_byte(&largest_image(&e.artifact("layer"), true));
    let out = run_image(&e, "lc-1", "auto", free_port(), &[], &fresh_only);
    assert!(out.ok(), "{out:?}\n{}", e.c.log_tail());
    let reason = e.artifacts.join(".quarantine/layer/quarantine.json");
    let reason: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&reason).unwrap()).unwrap();
    assert_eq!(reason["cause"], "damaged", "{reason}");
    let fresh = e.wait_manifest("layer");
    assert_ne!(fresh["mac"], old["mac"], "the cold start captured anew");
    e.wait_stopped("lc-1");
    e.remove("lc-1");
    e.assert_nothing_left();
}
