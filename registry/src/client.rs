//! The distribution API over a registry's hosts ([`crate::hosts`]): each
//! request goes to the hosts that may serve it, in order, until one does;
//! a push goes to its one host. What push, pull and the signatures ask of
//! a registry, and nothing more.

use std::path::Path;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE, LOCATION};
use reqwest::StatusCode;

use crate::hosts::{Hosts, Need};
use crate::transport::{error_message, Credentials, Failure, Host};

/// A blob's bytes as they arrive.
pub type BlobStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// The most bytes of a manifest read (the pull refuses more than 4 MiB).
const MANIFEST_READ_LIMIT: usize = 8 << 20;

/// The hosts of one repository, each with its HTTP client.
pub struct Client {
    hosts: Hosts,
    conns: Vec<Host>,
}

/// Why no host served a request: each host asked and its failure, in order.
#[derive(Debug)]
pub struct HostsError {
    tried: Vec<Tried>,
    /// No host may serve the request at all (its capabilities).
    none: Option<String>,
}

#[derive(Debug)]
struct Tried {
    host: String,
    /// The registry itself (its credentials go there), not a mirror.
    own: bool,
    failure: Failure,
}

impl HostsError {
    /// Every host asked answered 404.
    pub fn not_found(&self) -> bool {
        self.none.is_none()
            && !self.tried.is_empty()
            && self.tried.iter().all(|t| t.failure.not_found())
    }

    /// The registry itself refused this host's credentials, or the lack of them.
    pub fn unauthorized(&self) -> bool {
        self.tried.iter().any(|t| t.own && t.failure.unauthorized())
    }
}

impl std::fmt::Display for HostsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(none) = &self.none {
            return f.write_str(none);
        }
        let one = self.tried.len() == 1;
        let all: Vec<String> = self
            .tried
            .iter()
            .map(|t| match (one, t.own) {
                (true, _) => format!("{}: {}", t.host, t.failure),
                (false, true) => format!("{}: {}", t.host, t.failure),
                (false, false) => format!("mirror {}: {}", t.host, t.failure),
            })
            .collect();
        f.write_str(&all.join("; "))?;
        if self
            .tried
            .iter()
            .any(|t| !t.own && t.failure.unauthorized())
        {
            f.write_str(" (vsnap sends no credentials to a mirror)")?;
        }
        Ok(())
    }
}

impl Client {
    /// Clients for every host of `hosts`; the registry's `credentials` go
    /// only to the hosts that are the registry itself.
    pub fn new(
        hosts: Hosts,
        repository: &str,
        credentials: Option<Credentials>,
    ) -> Result<Self, String> {
        let mut conns = Vec::new();
        for e in &hosts.endpoints {
            let creds = credentials.clone().filter(|_| hosts.sends_credentials(e));
            let ns = hosts.namespace(e).map(str::to_string);
            let host =
                Host::new(e.clone(), ns, repository, creds).map_err(|m| match &hosts.source {
                    Some(file) => format!("hosts.toml {}: {m}", file.display()),
                    None => m,
                })?;
            conns.push(host);
        }
        Ok(Client { hosts, conns })
    }

    /// The `hosts.toml` (or certificate folder) in use, if any.
    pub fn source(&self) -> Option<&Path> {
        self.hosts.source.as_deref()
    }

    /// `f` on each host that may serve `need`, in order, until one does.
    async fn each<T>(
        &self,
        need: Need,
        f: impl AsyncFn(&Host) -> Result<T, Failure>,
    ) -> Result<T, HostsError> {
        let asked = self.hosts.indices_for(need).map_err(|none| HostsError {
            tried: Vec::new(),
            none: Some(none),
        })?;
        let mut tried = Vec::new();
        for i in asked {
            let host = &self.conns[i];
            match f(host).await {
                Ok(t) => return Ok(t),
                Err(failure) => tried.push(Tried {
                    host: host.endpoint.name(),
                    own: self.hosts.sends_credentials(&host.endpoint),
                    failure,
                }),
            }
        }
        Err(HostsError { tried, none: None })
    }

    /// Whether a host for `need` answers the API (authenticating where it
    /// asks), before a transfer starts.
    pub async fn ping(&self, need: Need) -> Result<(), HostsError> {
        self.each(need, async |h: &Host| {
            let root = h.endpoint.root();
            let r = h.send(need, |c| c.get(&root)).await?;
            match r.status() {
                s if s.is_success() => Ok(()),
                s => Err(Failure::status(s, error_message(r).await)),
            }
        })
        .await
    }

    /// The manifest at `at` (a tag or a digest) accepting `media_type`
    /// ([`HostsError::not_found`] when every host asked has none). `need`:
    /// Resolve for a tag, Pull for a digest, Push to read back what a push
    /// wrote.
    pub async fn manifest(
        &self,
        at: &str,
        media_type: &str,
        need: Need,
    ) -> Result<Vec<u8>, HostsError> {
        self.each(need, async |h: &Host| {
            let url = h.url(&format!("manifests/{at}"));
            let r = h
                .send(need, |c| c.get(&url).header(ACCEPT, media_type))
                .await?;
            if !r.status().is_success() {
                let s = r.status();
                return Err(Failure::status(s, error_message(r).await));
            }
            read_bounded(r, MANIFEST_READ_LIMIT).await
        })
        .await
    }

    /// Blob `digest`'s bytes as they arrive, from the first host with it.
    pub async fn blob_stream(&self, digest: &str) -> Result<BlobStream, HostsError> {
        self.each(Need::Pull, async |h: &Host| {
            let url = h.url(&format!("blobs/{digest}"));
            let r = h.send(Need::Pull, |c| c.get(&url)).await?;
            if !r.status().is_success() {
                let s = r.status();
                return Err(Failure::status(s, error_message(r).await));
            }
            let stream: BlobStream = Box::pin(
                r.bytes_stream()
                    .map(|piece| piece.map_err(std::io::Error::other)),
            );
            Ok(stream)
        })
        .await
    }

    /// Whether the push host has blob `digest`.
    pub async fn blob_exists(&self, digest: &str) -> Result<bool, HostsError> {
        self.each(Need::Push, async |h: &Host| {
            let url = h.url(&format!("blobs/{digest}"));
            let r = h.send(Need::Push, |c| c.head(&url)).await?;
            match r.status() {
                s if s.is_success() => Ok(true),
                StatusCode::NOT_FOUND => Ok(false),
                s => Err(Failure::status(s, error_message(r).await)),
            }
        })
        .await
    }

    /// Uploads `bytes` as blob `digest` to the push host in one request
    /// (the registry checks the digest).
    pub async fn push_blob(&self, digest: &str, bytes: Bytes) -> Result<(), HostsError> {
        self.each(Need::Push, async |h: &Host| {
            let start = h.url("blobs/uploads/");
            let r = h.send(Need::Push, |c| c.post(&start)).await?;
            if r.status() != StatusCode::ACCEPTED {
                let s = r.status();
                return Err(Failure::status(s, error_message(r).await));
            }
            let location = r
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| Failure::Net("the upload's answer has no Location".into()))?;
            let mut url = reqwest::Url::parse(&start)
                .and_then(|base| base.join(location))
                .map_err(|e| Failure::Net(format!("the upload's Location: {e}")))?;
            url.query_pairs_mut().append_pair("digest", digest);
            let r = h
                .send(Need::Push, |c| {
                    c.put(url.clone())
                        .header(CONTENT_TYPE, "application/octet-stream")
                        .body(bytes.clone())
                })
                .await?;
            match r.status() {
                s if s.is_success() => Ok(()),
                s => Err(Failure::status(s, error_message(r).await)),
            }
        })
        .await
    }

    /// Puts `body` (of `media_type`) as the manifest at `tag` on the push host.
    pub async fn push_manifest(
        &self,
        tag: &str,
        body: Vec<u8>,
        media_type: &str,
    ) -> Result<(), HostsError> {
        let body = Bytes::from(body);
        self.each(Need::Push, async |h: &Host| {
            let url = h.url(&format!("manifests/{tag}"));
            let r = h
                .send(Need::Push, |c| {
                    c.put(&url)
                        .header(CONTENT_TYPE, media_type)
                        .body(body.clone())
                })
                .await?;
            match r.status() {
                s if s.is_success() => Ok(()),
                s => Err(Failure::status(s, error_message(r).await)),
            }
        })
        .await
    }
}

/// A response's body, refused past `limit` bytes.
async fn read_bounded(r: reqwest::Response, limit: usize) -> Result<Vec<u8>, Failure> {
    let mut bytes = Vec::new();
    let mut stream = r.bytes_stream();
    while let Some(piece) = stream.next().await {
        bytes.extend_from_slice(&piece.map_err(Failure::net)?);
        if bytes.len() > limit {
            return Err(Failure::Net(format!("answered more than {limit} bytes")));
        }
    }
    Ok(bytes)
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
