//! The vLLM-shaped test engine (scripts/vllm-fixture.sh, built by setup):
//! vLLM 0.33.0's own `vllm.snapshot.server` over a stand-in for the rest of
//! vLLM, as an OCI image in the private containerd, and its OpenAI API.

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::containerd::Containerd;

/// Where setup builds the fixture's root filesystem.
pub const ROOTFS: &str = "/var/cache/vsnap/vllm/rootfs";

/// The fixture's root filesystem: [`ROOTFS`], or `rootfs/` of
/// `VSNAP_VLLM_FIXTURE_DIR` where that is set (as `scripts/vllm-fixture.sh`
/// reads it), to test a stand-in built elsewhere.
pub fn rootfs() -> PathBuf {
    match std::env::var_os("VSNAP_VLLM_FIXTURE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("rootfs"),
        _ => PathBuf::from(ROOTFS),
    }
}
pub const IMAGE: &str = "localhost/vsnap-vllm-standin:0.33.0";
/// The model folder baked into the image, and the name it is served as.
pub const MODEL: &str = "/models/standin";
pub const SERVED: &str = "standin";

/// Imports the fixture as [`IMAGE`] into `namespace` of `c`.
pub fn import_image(c: &Containerd, namespace: &str) {
    let root = rootfs();
    assert!(
        root.join("usr/bin/python3.11").exists(),
        "{} is missing: run scripts/setup.sh (its vllm-fixture step)",
        root.display()
    );
    let work = c.dir.join(format!("vllm-image-{namespace}"));
    std::fs::create_dir_all(&work).unwrap();
    let config = serde_json::json!({
        "Cmd": ["/usr/bin/python3.11"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "VLLM_WORKER_MULTIPROC_METHOD=spawn"],
    });
    crate::image::import_image_to(c, namespace, &work, &root, IMAGE, config);
}

/// The container command of vLLM's barrier server: its control flags
/// (`flags`, e.g. the ready and release files), then `--`, then what
/// follows `vllm serve`: the model first, then `serve_args`.
pub fn server_argv(flags: &[&str], serve_args: &[&str]) -> Vec<String> {
    ["/usr/bin/python3.11", "-m", "vllm.snapshot.server"]
        .iter()
        .chain(flags)
        .chain(&["--", MODEL, "--served-model-name", SERVED])
        .chain(serve_args)
        .map(|s| s.to_string())
        .collect()
}

/// The default control flags: both files in the control dir.
pub const BARRIER_FLAGS: [&str; 4] = [
    "--ready-file",
    "/run/vsnap/control/ready.json",
    "--release-file",
    "/run/vsnap/control/release.json",
];

/// The canary request on `port` (with the API key when given); returns
/// (HTTP status, body).
pub fn canary(port: u16, api_key: Option<&str>) -> (u16, serde_json::Value) {
    let body = serde_json::json!({
        "model": SERVED, "prompt": "The capital of France is", "max_tokens": 1,
        "temperature": 0, "seed": 0, "logprobs": 0, "return_token_ids": true,
    });
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}"])
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            &body.to_string(),
        ]);
    if let Some(k) = api_key {
        cmd.args(["-H", &format!("Authorization: Bearer {k}")]);
    }
    cmd.arg(format!("http://127.0.0.1:{port}/v1/completions"));
    let out = crate::cmd::run(cmd, None, Duration::from_secs(30));
    let (body, code) = out.stdout.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// The canary's answer as the oracle compares it: token ids, text, logprob.
pub fn oracle_of(answer: &serde_json::Value) -> (serde_json::Value, serde_json::Value, f64) {
    let c = &answer["choices"][0];
    (
        c["token_ids"].clone(),
        c["text"].clone(),
        c["logprobs"]["token_logprobs"][0]
            .as_f64()
            .unwrap_or(f64::NAN),
    )
}

/// The socket files in a container's /tmp, as the host sees them: `live`
/// ones are bound by a listening socket of the container's process tree
/// (vLLM's input and output channels), `stale` ones by nothing (the startup
/// handshake's, which libzmq leaves). Paths as the container names them
/// (`/tmp/<uuid>`). The connections on a live one are not counted: in a
/// cold-started tree the accepted end carries the listener's path, but
/// CRIU restores a connection between two sockets of the tree as a
/// socketpair, without a name; a request through the channel shows it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TmpSockets {
    pub live: BTreeSet<String>,
    pub stale: BTreeSet<String>,
}

impl TmpSockets {
    pub fn all(&self) -> BTreeSet<String> {
        self.live.union(&self.stale).cloned().collect()
    }
}

/// `pid` and every descendant of it (host pids).
fn process_tree(pid: i32) -> Vec<i32> {
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", tree[i]));
        for task in tasks.into_iter().flatten().flatten() {
            let children = std::fs::read_to_string(task.path().join("children"));
            let children = children.unwrap_or_default();
            tree.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
        i += 1;
    }
    tree
}

/// The inodes of the sockets the processes `pids` hold open.
fn socket_inodes(pids: &[i32]) -> BTreeSet<String> {
    let mut inodes = BTreeSet::new();
    for &pid in pids {
        for fd in vsnap_host::fds::open_fds(pid) {
            let target = fd.target.to_string_lossy();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(inode.to_string());
            }
        }
    }
    inodes
}

/// The socket files of the /tmp of the container whose PID 1 is host pid
/// `pid`, sorted into live and stale (its network namespace's
/// `/proc/PID/net/unix`, against the sockets its tree holds).
pub fn tmp_sockets(pid: i32) -> TmpSockets {
    let tmp = PathBuf::from(format!("/proc/{pid}/root/tmp"));
    let files: BTreeSet<String> = std::fs::read_dir(&tmp)
        .unwrap_or_else(|e| panic!("{}: {e}", tmp.display()))
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| format!("/tmp/{}", e.file_name().to_string_lossy()))
        .collect();
    let held = socket_inodes(&process_tree(pid));
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap();
    let mut live = BTreeSet::new();
    for line in table.lines().skip(1) {
        // Num RefCount Protocol Flags Type St Inode Path
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || !files.contains(f[7]) || !held.contains(f[6]) {
            continue;
        }
        // __SO_ACCEPTCON: a listening socket.
        if u32::from_str_radix(f[3], 16).unwrap_or(0) & 0x10000 != 0 {
            live.insert(f[7].to_string());
        }
    }
    let stale = files.difference(&live).cloned().collect();
    TmpSockets { live, stale }
}

/// The socket paths the manifest's carried layer names
/// (`rootfs.layer.sockets`).
pub fn manifest_sockets(manifest: &serde_json::Value) -> BTreeSet<String> {
    manifest["rootfs"]["layer"]["sockets"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts the ZMQ shape of vLLM V1 in a running container's /tmp (PID 1 is
/// host pid `pid`): two live sockets (the input and output channels) and
/// the handshake's stale file, or none of it (`stale: false`, a restored
/// copy: the stale file is not carried). Returns what it found.
pub fn assert_zmq_sockets(what: &str, pid: i32, stale: bool) -> TmpSockets {
    let found = tmp_sockets(pid);
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    let rows: Vec<&str> = table.lines().filter(|l| l.contains(" /tmp/")).collect();
    let what = format!(
        "{what} (pid {pid}; /tmp rows of net/unix: {rows:#?}; sockets the tree holds: {:?})",
        socket_inodes(&process_tree(pid))
    );
    assert_eq!(
        found.live.len(),
        2,
        "{what}: the input and output channels: {found:?}"
    );
    assert_eq!(
        found.stale.len(),
        usize::from(stale),
        "{what}: the handshake's file: {found:?}"
    );
    found
}

/// The socket files in `/tmp` of the writable layer of the container whose
/// PID 1 is host pid `pid`: the overlay upper dir of its root mount (a
/// containerd snapshot or dockerd's overlay2), listed from the host.
pub fn upper_tmp_sockets(pid: i32) -> BTreeSet<String> {
    let rows = vsnap_host::mountinfo::of_pid(pid).unwrap();
    let upper = rows
        .iter()
        .find(|r| r.mount_point == Path::new("/") && r.fs_type == "overlay")
        .and_then(|r| {
            let mut options = r.super_options.split(',');
            options.find_map(|o| o.strip_prefix("upperdir="))
        })
        .unwrap_or_else(|| panic!("no overlay root with an upper dir in pid {pid}:\n{rows:#?}"));
    let tmp = Path::new(upper).join("tmp");
    std::fs::read_dir(&tmp)
        .unwrap_or_else(|e| panic!("{}: {e}", tmp.display()))
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| format!("/tmp/{}", e.file_name().to_string_lossy()))
        .collect()
}
