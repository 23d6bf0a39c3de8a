//! `vsnap.io/` settings from the container's labels and from the image's own
//! config labels (an image author opting in), read by the shim from
//! containerd; OCI annotations win over both.

use std::time::{Duration, Instant};

use vsnap_e2e::engine::{engine_rootfs, free_port, wait_listening};
use vsnap_e2e::image::import_image;
use vsnap_e2e::snapshot_env::setup;

fn wait_artifact(root: &std::path::Path, prefix: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = vsnap_e2e::containerd::list(root)
            .into_iter()
            .find(|n| n.starts_with(prefix) && root.join(n).join("manifest.json").exists());
        if let Some(name) = found {
            return name;
        }
        assert!(Instant::now() < deadline, "no artifact {prefix}* published");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ctr c create` then labels set afterwards: they live only in containerd's
/// container record (ctr copies `--label` values into the spec's annotations
/// too, which would not show that the shim reads the record).
fn create_then_label(
    e: &vsnap_e2e::snapshot_env::Env,
    id: &str,
    extra: &[&str],
    labels: &[&str],
    engine_args: &[&str],
) {
    let mut args = vec![
        "c",
        "create",
        "--net-host",
        "--runtime",
        "io.vsnap.v1",
        "--runtime-config-path",
        &e.config,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--rootfs", &e.rootfs, id, "/vsnap-ref-engine"]);
    args.extend_from_slice(engine_args);
    e.c.ctr_ok(&args);
    let mut label = vec!["c", "label", id];
    label.extend_from_slice(labels);
    e.c.ctr_ok(&label);
}

#[test]
fn container_labels_choose_the_plan() {
    let e = setup("labels");
    let port = free_port();
    let listen = format!("vsnap.io/listen=127.0.0.1:{port}");
    create_then_label(
        &e,
        "l1",
        &[],
        &[
            "vsnap.io/plan=create",
            "vsnap.io/artifact=from-labels",
            &listen,
        ],
        &[],
    );
    e.c.ctr_ok(&["t", "start", "-d", "l1"]);
    assert_eq!(wait_artifact(&e.artifacts, "from-labels"), "from-labels");
    wait_listening(port, Duration::from_secs(60));
    e.remove("l1");

    // An annotation wins over the labels: plan=off runs the engine plain.
    let plain_port = free_port().to_string();
    create_then_label(
        &e,
        "l2",
        &["--annotation", "vsnap.io/plan=off"],
        &["vsnap.io/plan=create", "vsnap.io/artifact=never", &listen],
        &["--host", "127.0.0.1", "--port", &plain_port],
    );
    e.c.ctr_ok(&["t", "start", "-d", "l2"]);
    // Plain: the engine listens once its init is done (a create plan would
    // hold it capture-ready, not listening, and capture first).
    wait_listening(plain_port.parse().unwrap(), Duration::from_secs(60));
    assert!(!e.artifacts.join("never").exists(), "nothing captured");
    assert_eq!(
        vsnap_e2e::snapshot_env::control_dirs(&e.artifacts),
        Vec::<String>::new()
    );
    e.remove("l2");
}

#[test]
fn an_image_can_opt_in_with_its_config_labels() {
    let e = setup("imglabels");
    let port = free_port();
    let work = e.c.dir.join("engine-image");
    let root = engine_rootfs(&work);
    let reference = "localhost/vsnap-engine:labels";
    import_image(
        &e.c,
        &work,
        &root,
        reference,
        serde_json::json!({"vsnap.io/plan": "auto", "vsnap.io/listen": format!("127.0.0.1:{port}")}),
    );
    let run = |id: &str| {
        e.c.ctr(&[
            "run",
            "-d",
            "--net-host",
            "--runtime",
            "io.vsnap.v1",
            "--runtime-config-path",
            &e.config,
            reference,
            id,
            "/vsnap-ref-engine",
        ])
    };
    assert!(run("lbl1").ok());
    // auto without a name: the artifact is keyed by the workload, whose
    // identity includes the image's digest (asked from containerd).
    let name = wait_artifact(&e.artifacts, "auto-");
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(e.artifacts.join(&name).join("manifest.json")).unwrap(),
    )
    .unwrap();
    let digest = manifest["workload"]["image_digest"]
        .as_str()
        .unwrap_or_default();
    assert!(digest.starts_with("sha256:"), "{manifest}");
    wait_listening(port, Duration::from_secs(60));
    e.remove("lbl1");
    let out = run("lbl2");
    assert!(out.ok(), "{out:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "the second start was a restore: listening when ctr returned"
    );
    e.remove("lbl2");
}
