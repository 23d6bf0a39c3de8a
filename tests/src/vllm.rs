//! The vLLM-shaped test engine (scripts/vllm-fixture.sh, built by setup):
//! vLLM 0.33.0's own `vllm.snapshot.server` over a stand-in for the rest of
//! vLLM, as an OCI image in the private containerd, and its OpenAI API.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::containerd::Containerd;

/// Where setup builds the fixture's root filesystem.
pub const ROOTFS: &str = "/var/cache/vsnap/vllm/rootfs";
pub const IMAGE: &str = "localhost/vsnap-vllm-standin:0.33.0";
/// The model folder baked into the image, and the name it is served as.
pub const MODEL: &str = "/models/standin";
pub const SERVED: &str = "standin";

/// Imports the fixture as [`IMAGE`] into `namespace` of `c`.
pub fn import_image(c: &Containerd, namespace: &str) {
    let root = Path::new(ROOTFS);
    assert!(
        root.join("usr/bin/python3.11").exists(),
        "{ROOTFS} is missing: run scripts/setup.sh (its vllm-fixture step)"
    );
    let work = c.dir.join(format!("vllm-image-{namespace}"));
    std::fs::create_dir_all(&work).unwrap();
    let config = serde_json::json!({
        "Cmd": ["/usr/bin/python3.11"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "VLLM_WORKER_MULTIPROC_METHOD=spawn"],
    });
    crate::image::import_image_to(c, namespace, &work, root, IMAGE, config);
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
