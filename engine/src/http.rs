//! A minimal HTTP/1.1 server: one request per connection, a thread per connection,
//! `Connection: close`. Enough for health probes and completion requests.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

use crate::log;

const MAX_HEAD: usize = 16 * 1024;
const MAX_BODY: usize = 1024 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// A response: status, content type, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(status: u16, value: &Value) -> Self {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(value).unwrap_or_default(),
        }
    }

    /// An error in vLLM's shape.
    pub fn error(status: u16, message: &str) -> Self {
        let kind = if status == 404 {
            "NotFoundError"
        } else {
            "BadRequestError"
        };
        Response::json(
            status,
            &json!({"object": "error", "message": message, "type": kind, "param": null, "code": status}),
        )
    }
}

/// Serves forever, answering each request with `app`.
pub fn serve<H>(listener: TcpListener, app: Arc<H>) -> !
where
    H: Fn(&Request) -> Response + Send + Sync + 'static,
{
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let app = app.clone();
                // Spawning can fail under resource exhaustion; drop that connection rather
                // than the whole server.
                let spawned = thread::Builder::new()
                    .name("http".into())
                    .spawn(move || handle(stream, app.as_ref()));
                if let Err(e) = spawned {
                    log(&format!("cannot start a connection thread: {e}"));
                }
            }
            Err(e) => {
                log(&format!("accept failed: {e}"));
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn handle(mut stream: TcpStream, app: &(impl Fn(&Request) -> Response + ?Sized)) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let response = match read_request(&mut stream) {
        Ok(request) => app(&request),
        Err(response) => response,
    };
    let _ = write_response(&mut stream, &response);
}

/// Reads one request. Protocol errors come back as the response to send.
pub fn read_request(stream: &mut impl ReadWrite) -> Result<Request, Response> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            break end;
        }
        if buf.len() > MAX_HEAD {
            return Err(Response::error(431, "request head too large"));
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) => return Err(Response::error(400, "connection closed mid-request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(Response::error(400, &format!("read failed: {e}"))),
        }
    };
    let mut body = buf.split_off(head_end + 4);
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| Response::error(400, "request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target), Some(version)) = (
        request_line.next(),
        request_line.next(),
        request_line.next(),
    ) else {
        return Err(Response::error(400, "malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Response::error(505, "only HTTP/1.x is supported"));
    }
    let mut content_length = 0usize;
    let mut expect_continue = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(Response::error(400, "malformed header line"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value
                .parse()
                .map_err(|_| Response::error(400, "bad Content-Length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Response::error(
                411,
                "chunked bodies are not supported; send Content-Length",
            ));
        } else if name.eq_ignore_ascii_case("expect") && value.eq_ignore_ascii_case("100-continue")
        {
            expect_continue = true;
        }
    }
    if content_length > MAX_BODY {
        return Err(Response::error(413, "request body too large"));
    }
    if expect_continue {
        let _ = stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    while body.len() < content_length {
        let mut chunk = vec![0u8; (content_length - body.len()).min(64 * 1024)];
        match stream.read(&mut chunk) {
            Ok(0) => return Err(Response::error(400, "body shorter than Content-Length")),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(Response::error(400, &format!("read failed: {e}"))),
        }
    }
    body.truncate(content_length);
    let path = target.split('?').next().unwrap_or_default().to_string();
    Ok(Request {
        method: method.to_string(),
        path,
        body,
    })
}

pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn write_response(stream: &mut impl Write, response: &Response) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(&response.body)?;
    stream.flush()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A fake connection: reads from `input`, collects writes.
    struct Conn {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Conn {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Conn {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn read(raw: &[u8]) -> Result<Request, Response> {
        read_request(&mut Conn {
            input: Cursor::new(raw.to_vec()),
            output: Vec::new(),
        })
    }

    #[test]
    fn reads_a_post_with_body() {
        let req =
            read(b"POST /v1/completions?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/v1/completions");
        assert_eq!(req.body, b"{}");
    }

    #[test]
    fn malformed_requests_are_answered_not_panicked() {
        for raw in [
            &b""[..],
            b"GET\r\n\r\n",
            b"GET / SPDY/3\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"\xff\xfe / HTTP/1.1\r\n\r\n",
        ] {
            let status = read(raw).unwrap_err().status;
            assert!((400..600).contains(&status), "{raw:?}: {status}");
        }
    }
}
