//! The reference engine as a container workload: a root filesystem with the
//! engine binary, what it links against, and busybox (for exec); and a tiny
//! HTTP client for its OpenAI-style API.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The engine binary of the workspace build.
pub fn engine_binary() -> PathBuf {
    let shim = crate::containerd::shim_binary();
    let bin = shim.with_file_name("vsnap-ref-engine");
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first",
        bin.display()
    );
    bin
}

/// A folder `rootfs` in `dir`: busybox plus `/vsnap-ref-engine` and its
/// shared libraries (`vsnap_engine_rootfs` of `scripts/lib.sh`).
pub fn engine_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    crate::lib_sh::engine_rootfs(&root, &engine_binary());
    root
}

/// A free TCP port on the host (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// POSTs `/v1/completions` and returns the JSON body.
pub fn complete(port: u16, prompt: &str, max_tokens: u32) -> serde_json::Value {
    complete_at(([127, 0, 0, 1], port).into(), prompt, max_tokens)
}

/// [`complete`] against an engine at `addr` (a pod's IP, say).
pub fn complete_at(addr: std::net::SocketAddr, prompt: &str, max_tokens: u32) -> serde_json::Value {
    let body = serde_json::json!({
        "model": "ref", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "logprobs": 1, "return_token_ids": true,
    })
    .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    serde_json::from_str(body).unwrap()
}

/// The parts of a completion that must be identical across engines.
pub fn answer(v: &serde_json::Value) -> (serde_json::Value, serde_json::Value, serde_json::Value) {
    let c = &v["choices"][0];
    (
        c["text"].clone(),
        c["token_ids"].clone(),
        c["logprobs"].clone(),
    )
}

pub fn wait_listening(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain cold-started engine on the host, killed on drop.
pub struct HostEngine {
    child: std::process::Child,
    pub port: u16,
}

impl HostEngine {
    /// The engine on a free port. A port found free can be taken before
    /// the engine binds it (an outgoing connection's ephemeral port, on a
    /// busy host): an engine that exits before it listens is started again
    /// on another port, up to five times.
    pub fn start() -> Self {
        for _ in 0..5 {
            let port = free_port();
            let mut child = Command::new(engine_binary())
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return HostEngine { child, port };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "nothing listens on port {port}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("the host engine exited before it listened, five times");
    }
}

impl Drop for HostEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
