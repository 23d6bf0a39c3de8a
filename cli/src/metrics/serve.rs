//! `vsnap metrics --listen`: a small HTTP/1.1 server on std's TcpListener
//! answering `GET /metrics` (each request reads the journal afresh), a
//! thread per connection up to a bound, each connection closed after one
//! answer.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::Outcome;

/// Connections answered at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 8;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn serve(root: &Path, addr: SocketAddr) -> Outcome {
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("metrics: listen on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("metrics: listen on {addr}: {e}"))?;
    // The address actually bound (port 0 picks one), for whoever started us.
    crate::emit(&format!(
        "vsnap metrics: listening on http://{bound}/metrics\n"
    ));
    let busy = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        while busy.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            std::thread::sleep(Duration::from_millis(10));
        }
        busy.fetch_add(1, Ordering::AcqRel);
        let (root, busy) = (root.to_path_buf(), busy.clone());
        std::thread::spawn(move || {
            answer(stream, &root);
            busy.fetch_sub(1, Ordering::AcqRel);
        });
    }
    Ok(crate::OK)
}

fn answer(stream: TcpStream, root: &Path) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut reader = BufReader::new(&stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // The headers, up to the empty line (bounded: 100 lines).
    for _ in 0..100 {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" || line == "\n" => break,
            Ok(_) => {}
        }
    }
    let (status, body) = respond(&request_line, root);
    let mut out = &stream;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = out.write_all(head.as_bytes()).and_then(|_| {
        if request_line.starts_with("HEAD ") {
            Ok(())
        } else {
            out.write_all(body.as_bytes())
        }
    });
}

/// The status line and body for `request_line` (`GET /metrics HTTP/1.1`).
pub fn respond(request_line: &str, root: &Path) -> (&'static str, String) {
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return ("405 Method Not Allowed", "only GET /metrics\n".into());
    }
    if path != "/metrics" {
        return ("404 Not Found", "vsnap serves GET /metrics\n".into());
    }
    match super::gather::exposition(root) {
        Ok(text) => ("200 OK", text),
        Err(e) => ("500 Internal Server Error", format!("{e}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_of_metrics_is_answered() {
        let root = tempfile::tempdir().unwrap();
        let (status, body) = respond("GET /metrics HTTP/1.1\r\n", root.path());
        assert_eq!(status, "200 OK");
        assert!(body.contains("vsnap_build_info"), "{body}");
        assert_eq!(respond("GET / HTTP/1.1", root.path()).0, "404 Not Found");
        assert_eq!(
            respond("POST /metrics HTTP/1.1", root.path()).0,
            "405 Method Not Allowed"
        );
        assert_eq!(
            respond("GET /metrics?x=1 HTTP/1.0", root.path()).0,
            "200 OK"
        );
    }
}
