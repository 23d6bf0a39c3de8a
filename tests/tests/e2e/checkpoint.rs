//! containerd's own checkpoint/restore through the vsnap shim: `ctr task
//! checkpoint` (runc + CRIU under the shim), then a new container restored
//! from that checkpoint continues where it stopped.

use std::path::Path;
use std::time::{Duration, Instant};

use vsnap_e2e::image::{import_busybox_image, IMAGE_REF};
use vsnap_e2e::Containerd;

const RT: &str = "io.vsnap.v1";

fn ticks(path: &Path) -> Vec<u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn wait_ticks(path: &Path, at_least: usize) -> Vec<u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = ticks(path);
        if t.len() >= at_least {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "only {} ticks in {}",
            t.len(),
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_checkpointed_container_restores_and_continues_where_it_stopped() {
    let c = Containerd::start("checkpoint");
    import_busybox_image(&c);
    let out = c.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let mount = format!("type=bind,src={},dst=/out,options=rbind:rw", out.display());
    let log = out.join("ticks");
    c.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        RT,
        "--mount",
        &mount,
        IMAGE_REF,
        "cp1",
        "/bin/sh",
        "-c",
        "i=0; while true; do echo $i >> /out/ticks; i=$((i+1)); sleep 0.05; done",
    ]);
    wait_ticks(&log, 5);

    // The shim runs runc checkpoint (CRIU dump); containerd packs the task's
    // images with the container's image and spec into a checkpoint image.
    let reference = "localhost/checkpoint/cp1:1";
    c.ctr_ok(&["c", "checkpoint", "--task", "--image", "cp1", reference]);
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "cp1"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.ctr_ok(&["task", "ls"]).contains("STOPPED") {
        assert!(Instant::now() < deadline, "cp1 never stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.ctr_ok(&["task", "delete", "cp1"]);
    c.ctr_ok(&["c", "rm", "cp1"]);
    let before = ticks(&log);
    let last_before = *before.last().unwrap();

    // Restore: containerd hands the CRIU images to the shim at create; the
    // shim runs `runc restore --detach` at start.
    c.ctr_ok(&["c", "restore", "--live", "cp1", reference]);
    let after = wait_ticks(&log, before.len() + 5);
    let resumed = &after[before.len()..];
    assert!(
        resumed[0] > 0 && resumed[0] <= last_before + 1,
        "the restored loop continues from its checkpointed counter (first new tick {}, last before {last_before})",
        resumed[0]
    );
    assert!(
        resumed.windows(2).all(|w| w[1] == w[0] + 1),
        "the restored loop counts on: {resumed:?}"
    );
    assert!(c.ctr_ok(&["task", "ls"]).contains("RUNNING"));
    c.ctr_ok(&["task", "kill", "-s", "SIGKILL", "cp1"]);
}
