//! A real Prometheus server (Debian's `prometheus`, installed by
//! scripts/setup.sh) for the metrics tests: its own config, data dir and
//! port under the test's folder, scraping one target every second; started
//! and stopped by pid. Queried through its HTTP API.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::engine::free_port;

pub struct Prometheus {
    dir: PathBuf,
    pub port: u16,
    child: Child,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`, path /metrics)
    /// every second; returns once it is ready.
    pub fn start(dir: &Path, target: &str) -> Self {
        let dir = dir.join("prometheus");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: vsnap\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus (run scripts/setup.sh)");
        let p = Prometheus { dir, port, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while p.get("/-/ready").is_none_or(|(status, _)| status != 200) {
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of an instant query (`/api/v1/query`).
    pub fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let Some((200, body)) = self.get(&path) else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The value of the only sample `promql` returns, when it returns one.
    pub fn value(&self, promql: &str) -> Option<f64> {
        match self.query(promql).as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        s.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        // Prometheus answers small bodies whole, larger ones chunked.
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Some((
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        ))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
