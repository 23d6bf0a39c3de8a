//! The smallest gRPC client the shim needs: unary and server-streaming calls
//! to containerd over its unix socket (HTTP/2 with prior knowledge), one
//! connection per lookup, calls one after another on it.
//!
//! It replaces tonic, hyper and tower (containerd-client), which every
//! plain container's shim mapped for three reads (labels.rs). A call
//! succeeds when its trailers carry `grpc-status` 0 and fails, naming the
//! method, when they carry another status (with `grpc-message`), when the
//! stream ends without them or is reset. What it leaves out, knowingly:
//! the response's leading headers are not read, and the header table is
//! static only (hpack.rs). Flow control: the client opens its windows wide
//! once; responses are small.

mod hpack;

use std::path::Path;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The receive window, stream and connection: larger than any answer read.
const WINDOW: u32 = 16 << 20;
/// The largest frame a server may send us by default (SETTINGS_MAX_FRAME_SIZE).
const MAX_FRAME: usize = 16384;

pub struct Connection {
    stream: UnixStream,
    next_stream: u32,
}

impl Connection {
    /// Connects to containerd's gRPC socket and sends the client preface
    /// (no dynamic header table, no push, wide windows).
    pub async fn connect(socket: &Path) -> Result<Self, String> {
        let mut stream = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        let mut out = PREFACE.to_vec();
        let mut settings = Vec::new();
        for (id, value) in [(0x1u16, 0u32), (0x2, 0), (0x4, WINDOW)] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        frame(&mut out, SETTINGS, 0, 0, &settings);
        frame(
            &mut out,
            WINDOW_UPDATE,
            0,
            0,
            &(WINDOW - 65535).to_be_bytes(),
        );
        stream
            .write_all(&out)
            .await
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        Ok(Connection {
            stream,
            next_stream: 1,
        })
    }

    /// Calls `path` (`/package.Service/Method`) in containerd namespace `ns`
    /// and returns the messages of the answer, decoded.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &mut self,
        path: &str,
        ns: &str,
        request: &Req,
    ) -> Result<Vec<Resp>, String> {
        let id = self.next_stream;
        self.next_stream += 2;
        let mut out = Vec::new();
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("containerd-namespace", ns),
        ] {
            hpack::literal(&mut block, name, value);
        }
        frame(&mut out, HEADERS, END_HEADERS, id, &block);
        let body = request.encode_to_vec();
        let mut message = Vec::with_capacity(5 + body.len());
        message.push(0);
        message.extend_from_slice(&(body.len() as u32).to_be_bytes());
        message.extend_from_slice(&body);
        frame(&mut out, DATA, END_STREAM, id, &message);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("{path}: send: {e}"))?;
        let (data, trailers) = self.answer(id, path).await?;
        status(&trailers).map_err(|e| format!("{path}: {e}"))?;
        let messages = messages(&data).map_err(|e| format!("{path}: {e}"))?;
        if messages.is_empty() {
            return Err(format!("{path}: containerd answered with an error"));
        }
        messages
            .into_iter()
            .map(|m| Resp::decode(m).map_err(|e| format!("{path}: decode: {e}")))
            .collect()
    }

    /// The DATA of stream `id` and the header block of its trailers (empty
    /// when the stream ended on DATA); answers SETTINGS and PING.
    async fn answer(&mut self, id: u32, path: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
        let mut data = Vec::new();
        loop {
            let (kind, flags, stream, payload) = self
                .read_frame()
                .await
                .map_err(|e| format!("{path}: receive: {e}"))?;
            match kind {
                SETTINGS if flags & ACK == 0 => self.send(SETTINGS, ACK, 0, &[]).await?,
                PING if flags & ACK == 0 => self.send(PING, ACK, 0, &payload).await?,
                GOAWAY => return Err(format!("{path}: containerd closed the connection")),
                RST_STREAM if stream == id => {
                    return Err(format!("{path}: containerd reset the call"))
                }
                DATA if stream == id => {
                    data.extend_from_slice(unpadded(flags, &payload)?);
                    if flags & END_STREAM != 0 {
                        return Ok((data, Vec::new()));
                    }
                }
                HEADERS if stream == id && flags & END_STREAM != 0 => {
                    let block = self.header_block(id, flags, &payload).await;
                    return Ok((data, block.map_err(|e| format!("{path}: trailers: {e}"))?));
                }
                _ => {}
            }
        }
    }

    /// A HEADERS frame's header block, with the CONTINUATION frames that
    /// follow it until END_HEADERS.
    async fn header_block(
        &mut self,
        id: u32,
        flags: u8,
        payload: &[u8],
    ) -> Result<Vec<u8>, String> {
        let mut block = fragment(flags, payload)?.to_vec();
        let mut done = flags & END_HEADERS != 0;
        while !done {
            let (kind, flags, stream, payload) =
                self.read_frame().await.map_err(|e| e.to_string())?;
            if kind != CONTINUATION || stream != id {
                return Err(format!("frame type {kind} inside a header block"));
            }
            block.extend_from_slice(&payload);
            done = flags & END_HEADERS != 0;
        }
        Ok(block)
    }

    async fn send(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let mut out = Vec::new();
        frame(&mut out, kind, flags, stream, payload);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("send: {e}"))
    }

    async fn read_frame(&mut self) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.stream.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        if len > MAX_FRAME {
            return Err(std::io::Error::other(format!("a frame of {len} bytes")));
        }
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).await?;
        Ok((head[3], head[4], stream, payload))
    }
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The header block fragment of a HEADERS frame: without its padding
/// and its priority fields.
fn fragment(flags: u8, payload: &[u8]) -> Result<&[u8], String> {
    let rest = unpadded(flags, payload)?;
    if flags & PRIORITY == 0 {
        return Ok(rest);
    }
    rest.get(5..)
        .ok_or_else(|| "a HEADERS frame shorter than its priority".into())
}

/// Whether trailers (`block`, HPACK) carry `grpc-status` 0; the status,
/// its name and `grpc-message` when not.
fn status(block: &[u8]) -> Result<(), String> {
    if block.is_empty() {
        return Err("the answer ended without its trailers (grpc-status)".into());
    }
    let fields = hpack::decode(block).map_err(|e| format!("trailers: {e}"))?;
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let code = field("grpc-status").ok_or("trailers without grpc-status")?;
    if code == "0" {
        return Ok(());
    }
    let name = code
        .parse::<usize>()
        .ok()
        .and_then(|c| CODES.get(c))
        .unwrap_or(&"UNKNOWN");
    let message = percent_decoded(field("grpc-message").unwrap_or_default());
    Err(format!(
        "containerd answered grpc-status {code} ({name}): {message}"
    ))
}

/// gRPC's status codes by number.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// `grpc-message` is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_decoded(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.as_bytes();
    while let Some((&b, rest)) = bytes.split_first() {
        let hex = rest.get(..2).and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(v) if b == b'%' => {
                out.push(v);
                bytes = &rest[2..];
            }
            _ => {
                out.push(b);
                bytes = rest;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn unpadded(flags: u8, payload: &[u8]) -> Result<&[u8], String> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let pad = *payload.first().ok_or("a padded frame without its length")? as usize;
    payload
        .get(1..payload.len().saturating_sub(pad))
        .filter(|_| pad < payload.len())
        .ok_or_else(|| "a frame's padding is longer than the frame".into())
}

/// The length-prefixed gRPC messages of a response body.
fn messages(mut data: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.len() < 5 {
            return Err("a truncated message".into());
        }
        if data[0] != 0 {
            return Err("a compressed message".into());
        }
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        let body = data.get(5..5 + len).ok_or("a truncated message")?;
        out.push(body);
        data = &data[5 + len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailers(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in fields {
            hpack::literal(&mut block, name, value);
        }
        block
    }

    #[test]
    fn a_non_zero_grpc_status_in_the_trailers_fails_the_call() {
        assert!(status(&trailers(&[("grpc-status", "0")])).is_ok());
        let e = status(&trailers(&[
            ("grpc-status", "5"),
            ("grpc-message", "container%20%22x%22: not found"),
        ]))
        .unwrap_err();
        assert_eq!(
            e,
            "containerd answered grpc-status 5 (NOT_FOUND): container \"x\": not found"
        );
        let e = status(&trailers(&[("grpc-status", "99")])).unwrap_err();
        assert!(e.contains("grpc-status 99 (UNKNOWN)"), "{e}");
        let e = status(&trailers(&[("content-type", "application/grpc")])).unwrap_err();
        assert!(e.contains("without grpc-status"), "{e}");
        assert!(status(&[]).unwrap_err().contains("without its trailers"));
        assert!(status(&[0x80 | 70]).unwrap_err().contains("static table"));
    }

    #[test]
    fn percent_encoded_messages_are_decoded() {
        assert_eq!(percent_decoded("a%20b%zz%"), "a b%zz%");
        assert_eq!(percent_decoded("%E2%9C%93"), "\u{2713}");
    }

    #[test]
    fn header_fragments_lose_padding_and_priority() {
        assert_eq!(fragment(0, b"ab").unwrap(), b"ab");
        assert_eq!(fragment(PRIORITY, b"\0\0\0\x01\x10ab").unwrap(), b"ab");
        assert_eq!(
            fragment(PADDED | PRIORITY, b"\x01\0\0\0\x01\x10abX").unwrap(),
            b"ab"
        );
        assert!(fragment(PRIORITY, b"\0\0").is_err());
    }

    #[test]
    fn messages_are_split_and_bad_bodies_refused() {
        let body = b"\x00\x00\x00\x00\x02hi\x00\x00\x00\x00\x00";
        assert_eq!(messages(body).unwrap(), vec![&b"hi"[..], &b""[..]]);
        assert!(messages(b"\x00\x00\x00\x00\x05hi").is_err());
        assert!(messages(b"\x01\x00\x00\x00\x00").is_err());
        assert!(messages(b"\x00\x00").is_err());
    }

    #[test]
    fn padding_is_stripped_and_checked() {
        assert_eq!(unpadded(PADDED, b"\x02abXX").unwrap(), b"ab");
        assert_eq!(unpadded(0, b"ab").unwrap(), b"ab");
        assert!(unpadded(PADDED, b"\x05ab").is_err());
    }

    #[test]
    fn frames_carry_length_type_flags_and_stream() {
        let mut out = Vec::new();
        frame(&mut out, DATA, END_STREAM, 3, b"abc");
        assert_eq!(out, b"\x00\x00\x03\x00\x01\x00\x00\x00\x03abc");
    }
}
