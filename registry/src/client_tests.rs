//! The client against small fake hosts on loopback: which host is asked,
//! in which order, with which headers, and where credentials go.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;
use crate::hosts::{self, Need};

/// What a fake host answers: status, extra header lines, body.
type Answer = (u16, String, String);

/// A fake host: every request's head (request line and headers) kept.
struct Fake {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Fake {
    async fn start(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (record, answer) = (seen.clone(), Arc::new(answer));
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (record, answer) = (record.clone(), answer.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut byte = [0u8; 1];
                    loop {
                        while !buf.ends_with(b"\r\n\r\n") {
                            if s.read(&mut byte).await.unwrap_or(0) == 0 {
                                return;
                            }
                            buf.push(byte[0]);
                        }
                        let head = String::from_utf8_lossy(&buf).into_owned();
                        buf.clear();
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(str::to_string)
                            })
                            .and_then(|n| n.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        let mut body = vec![0u8; length];
                        s.read_exact(&mut body).await.unwrap();
                        record.lock().unwrap().push(head.clone());
                        let (status, headers, body) = answer(&head);
                        let out = format!(
                            "HTTP/1.1 {status} X\r\n{headers}Content-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        s.write_all(out.as_bytes()).await.unwrap();
                    }
                });
            }
        });
        Fake { port, seen }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn ok(body: &str) -> Answer {
    (200, String::new(), body.to_string())
}

fn missing() -> Answer {
    (
        404,
        String::new(),
        r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#.into(),
    )
}

fn creds() -> Option<Credentials> {
    Some(Credentials {
        user: "ci".into(),
        password: "s3cret".into(),
    })
}

/// The client of `origin`'s repository `fleet/m` with `hosts_toml` (in
/// the registry's own folder) and the registry's credentials.
fn client(origin: &Fake, hosts_toml: &str) -> Client {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join(origin.host());
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("hosts.toml"), hosts_toml).unwrap();
    let hosts = hosts::load(&origin.host(), &[dir.path().to_path_buf()], true).unwrap();
    Client::new(hosts, "fleet/m", creds()).unwrap()
}

fn authorizations(seen: &[String]) -> Vec<String> {
    seen.iter()
        .flat_map(|h| {
            h.lines()
                .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn a_mirror_serves_first_with_ns_and_headers_and_never_gets_credentials() {
    // The mirror wants credentials for the tag (it gets none: the next host
    // is asked), then serves the blob.
    let mirror = Fake::start(|head| match head.contains("/manifests/") {
        true => (
            401,
            "WWW-Authenticate: Basic realm=\"m\"\r\n".into(),
            String::new(),
        ),
        false => ok("chunk"),
    })
    .await;
    let origin =
        Fake::start(
            |head| match head.to_ascii_lowercase().contains("authorization: basic") {
                true => ok("{}"),
                false => (
                    401,
                    "WWW-Authenticate: Basic realm=\"o\"\r\n".into(),
                    String::new(),
                ),
            },
        )
        .await;
    let c = client(
        &origin,
        &format!(
            "[host.\"http://{}\"]\ncapabilities = [\"pull\", \"resolve\"]\n[host.\"http://{}\".header]\nX-Mirror-Of = \"origin\"\n",
            mirror.host(),
            mirror.host()
        ),
    );
    assert_eq!(
        c.manifest("v1", crate::OCI_MANIFEST, Need::Resolve)
            .await
            .unwrap(),
        b"{}"
    );
    let mut blob = c
        .blob_stream(&format!("sha256:{}", "a".repeat(64)))
        .await
        .unwrap();
    assert_eq!(&blob.next().await.unwrap().unwrap()[..], b"chunk");

    let on_mirror = mirror.seen();
    assert_eq!(on_mirror.len(), 2, "{on_mirror:?}");
    let ns = format!("?ns=127.0.0.1%3A{}", origin.port);
    assert!(
        on_mirror[0].starts_with(&format!("GET /v2/fleet/m/manifests/v1{ns} ")),
        "{on_mirror:?}"
    );
    assert!(
        on_mirror.iter().all(|h| h.contains("x-mirror-of: origin")),
        "{on_mirror:?}"
    );
    assert!(
        authorizations(&on_mirror).is_empty(),
        "credentials on a mirror: {on_mirror:?}"
    );
    // The registry got the tag after the mirror's refusal, with the
    // credentials once it asked for them; no ns (it is the registry).
    let on_origin = origin.seen();
    assert_eq!(on_origin.len(), 2, "{on_origin:?}");
    assert!(
        on_origin[1].starts_with("GET /v2/fleet/m/manifests/v1 "),
        "{on_origin:?}"
    );
    assert_eq!(authorizations(&on_origin).len(), 1, "{on_origin:?}");
}

#[tokio::test]
async fn a_bearer_token_is_asked_with_credentials_for_the_registry_only() {
    let tokens =
        Fake::start(
            |head| match head.to_ascii_lowercase().contains("authorization: basic") {
                true => ok(r#"{"token":"for-origin"}"#),
                false => ok(r#"{"access_token":"anonymous"}"#),
            },
        )
        .await;
    let realm = format!("http://{}/token", tokens.host());
    let challenge = move |head: &str, want: &str| match head.contains(&format!("Bearer {want}")) {
        true => missing(),
        false => (
            401,
            format!("WWW-Authenticate: Bearer realm=\"{realm}\",service=\"reg\"\r\n"),
            String::new(),
        ),
    };
    let c2 = challenge.clone();
    let mirror = Fake::start(move |h| c2(h, "anonymous")).await;
    let origin = Fake::start(move |h| challenge(h, "for-origin")).await;
    let c = client(&origin, &format!("[host.\"http://{}\"]\n", mirror.host()));
    let e = c
        .manifest("v1", crate::OCI_MANIFEST, Need::Resolve)
        .await
        .unwrap_err();
    assert!(e.not_found(), "every host answered 404: {e}");
    let asked = tokens.seen();
    assert_eq!(asked.len(), 2, "{asked:?}");
    // The mirror's realm is asked anonymously, the registry's with its
    // credentials; both for the repository.
    assert!(authorizations(&asked[..1]).is_empty(), "{asked:?}");
    assert_eq!(authorizations(&asked[1..]).len(), 1, "{asked:?}");
    assert!(
        asked
            .iter()
            .all(|h| h.contains("scope=repository%3Afleet%2Fm%3Apull")),
        "{asked:?}"
    );
    assert!(authorizations(&mirror.seen())
        .iter()
        .all(|a| a.ends_with("Bearer anonymous")));
    assert_eq!(
        e.to_string(),
        format!(
            "mirror http://{}: answered 404: MANIFEST_UNKNOWN manifest unknown; http://{}: answered 404: MANIFEST_UNKNOWN manifest unknown",
            mirror.host(),
            origin.host()
        )
    );
}

#[tokio::test]
async fn a_push_goes_to_the_first_host_that_may_push_only() {
    let mirror = Fake::start(|_| ok("")).await;
    let origin = Fake::start(|head| match head.split(' ').next() {
        Some("POST") => (
            202,
            "Location: /v2/fleet/m/blobs/uploads/u1?_state=x\r\n".into(),
            String::new(),
        ),
        Some("PUT") | Some("HEAD") => (201, String::new(), String::new()),
        _ => missing(),
    })
    .await;
    let c = client(
        &origin,
        &format!(
            "[host.\"http://{}\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
            mirror.host()
        ),
    );
    let digest = format!("sha256:{}", "b".repeat(64));
    assert!(c.blob_exists(&digest).await.unwrap());
    c.push_blob(&digest, Bytes::from_static(b"xyz"))
        .await
        .unwrap();
    c.push_manifest("v1", b"{}".to_vec(), crate::OCI_MANIFEST)
        .await
        .unwrap();
    assert!(mirror.seen().is_empty(), "{:?}", mirror.seen());
    let lines: Vec<String> = origin
        .seen()
        .iter()
        .map(|h| h.lines().next().unwrap().to_string())
        .collect();
    assert_eq!(
        lines,
        [
            format!("HEAD /v2/fleet/m/blobs/{digest} HTTP/1.1"),
            "POST /v2/fleet/m/blobs/uploads/ HTTP/1.1".to_string(),
            format!(
                "PUT /v2/fleet/m/blobs/uploads/u1?_state=x&digest=sha256%3A{} HTTP/1.1",
                "b".repeat(64)
            ),
            "PUT /v2/fleet/m/manifests/v1 HTTP/1.1".to_string(),
        ]
    );
    // With no host that may push, nothing is sent.
    let c = client(
        &origin,
        "server = \"http://127.0.0.1:1\"\ncapabilities = [\"pull\"]\n",
    );
    let e = c
        .push_manifest("v1", b"{}".to_vec(), crate::OCI_MANIFEST)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("may push"), "{e}");
}

#[tokio::test]
async fn a_host_that_cannot_be_reached_passes_the_request_on_and_is_named() {
    let origin = Fake::start(|_| ok("{}")).await;
    // A port nothing listens on (bound, then closed).
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = client(
        &origin,
        &format!("[host.\"http://127.0.0.1:{dead}\"]\ndial_timeout = \"2s\"\n"),
    );
    assert_eq!(
        c.manifest("v1", crate::OCI_MANIFEST, Need::Resolve)
            .await
            .unwrap(),
        b"{}"
    );
    c.ping(Need::Resolve).await.unwrap();
    let e = client(&origin, "server = \"http://127.0.0.1:1\"\n")
        .manifest("v1", crate::OCI_MANIFEST, Need::Resolve)
        .await
        .unwrap_err();
    assert!(!e.not_found(), "{e}");
    assert!(e.to_string().starts_with("http://127.0.0.1:1: "), "{e}");
}
