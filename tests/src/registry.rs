//! A private OCI registry for one test: Debian's docker-registry (the
//! distribution registry 2.8, installed by scripts/setup.sh) serving from the
//! test's scratch folder on 127.0.0.1 and a free port, started and stopped
//! by its pid; a throttling TCP proxy in front of it, a slow link that lets
//! a test act while a pull is under way; and a recording one, which keeps
//! what its clients send (requests and their headers).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::free_port;

pub struct Registry {
    pub dir: PathBuf,
    pub port: u16,
    child: Child,
}

impl Registry {
    /// Starts `docker-registry serve` with its storage in `dir/registry`.
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, None)
    }

    /// As [`Registry::start`], requiring HTTP basic authentication as
    /// `user` with `password` (an htpasswd file, bcrypt) when given.
    pub fn start_with(dir: &Path, auth: Option<(&str, &str)>) -> Self {
        let dir = dir.join("registry");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let port = free_port();
        let config = dir.join("config.yml");
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("data").display()
        );
        if let Some((user, password)) = auth {
            let htpasswd = dir.join("htpasswd");
            let hash = bcrypt::hash(password, 4).unwrap();
            std::fs::write(&htpasswd, format!("{user}:{hash}\n")).unwrap();
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: vsnap-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        std::fs::write(&config, yaml).unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry (run scripts/setup.sh)");
        let r = Registry { dir, port, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !r.answers() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not come up: {}",
                r.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// Stops the registry (by its pid, SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Copies every repository, manifest and blob `from` stores into this
    /// registry's storage (what a mirror that served them would hold).
    pub fn copy_content_from(&self, from: &Registry) {
        let out = Command::new("cp")
            .arg("-a")
            .arg(from.dir.join("data/."))
            .arg(self.dir.join("data"))
            .output()
            .unwrap();
        assert!(out.status.success(), "cp: {out:?}");
    }

    /// `GET /v2/` answers (200, or 401 when it wants credentials).
    pub fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.write_all(b"GET /v2/ HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).is_ok()
            && (head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.1 401"))
    }

    /// `127.0.0.1:<port>`, as a reference names it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// The file holding blob `digest` in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Bytes of all blobs the registry stores.
    pub fn stored_bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(md) = std::fs::symlink_metadata(p) else {
                return 0;
            };
            if md.is_dir() {
                std::fs::read_dir(p)
                    .unwrap()
                    .flatten()
                    .map(|e| walk(&e.path()))
                    .sum()
            } else {
                md.len()
            }
        }
        walk(&self.dir.join("data/docker/registry/v2/blobs"))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy to `127.0.0.1:<target>` that sends what the target answers
/// at most `rate` bytes per second per connection, idle or not (a
/// connection that waited gets at most 50 ms of credit). Stopped on drop.
pub struct SlowProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl SlowProxy {
    pub fn start(target: u16, rate: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                            continue;
                        };
                        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                        std::thread::spawn(move || pump(client, server, None, None));
                        std::thread::spawn(move || pump(s2, c2, Some(rate), None));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        SlowProxy { port, stop }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A TCP proxy to `127.0.0.1:<target>` that keeps every byte its clients
/// send: over plain HTTP, the requests with their headers, to say what a
/// host was asked and with which credentials. Stopped on drop.
pub struct RecordingProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl RecordingProxy {
    pub fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stopped, record) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                            continue;
                        };
                        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                        let record = record.clone();
                        std::thread::spawn(move || pump(client, server, None, Some(record)));
                        std::thread::spawn(move || pump(s2, c2, None, None));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        RecordingProxy { port, stop, seen }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Everything the clients sent so far (lossy UTF-8).
    pub fn sent(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to`, at most `rate` bytes per second when given,
/// keeping a copy of every byte in `record` when given.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    rate: Option<u64>,
    record: Option<Arc<Mutex<Vec<u8>>>>,
) {
    let mut buf = vec![0u8; 16 << 10];
    // When the bytes sent so far are paid for at `rate`. A connection that
    // sat idle gets at most `SLACK` of credit to send faster later: enough
    // to make up for a sleep that overslept on a busy host, not for a pause
    // between requests.
    const SLACK: Duration = Duration::from_millis(50);
    let mut due = Instant::now();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(record) = &record {
            record.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Some(rate) = rate {
            let now = Instant::now();
            due = due.max(now - SLACK) + Duration::from_secs_f64(n as f64 / rate as f64);
            if let Some(wait) = due.checked_duration_since(now) {
                std::thread::sleep(wait);
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
