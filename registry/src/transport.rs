//! One registry host's HTTP: its client, built from what `hosts.toml` says
//! of it (CA files, a client certificate, `skip_verify`, headers, the dial
//! timeout), and the distribution API's authentication handshake (a 401's
//! `WWW-Authenticate`: basic credentials, or a bearer token from the
//! realm it names), with the registry's credentials only on a host that
//! may have them ([`crate::hosts::Hosts::sends_credentials`]).

use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{Request, RequestBuilder, Response, StatusCode};

use crate::hosts::{Endpoint, Need};

/// A registry's basic credentials (never shown by Debug).
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.user)
    }
}

/// Why one host did not serve one request.
#[derive(Debug, Clone)]
pub enum Failure {
    /// Not reached, or the connection failed (refused, TLS, a timeout).
    Net(String),
    /// It answered with an error status (the registry's message, if any).
    Status { code: u16, message: String },
}

impl Failure {
    pub fn status(code: StatusCode, message: String) -> Self {
        Failure::Status {
            code: code.as_u16(),
            message,
        }
    }

    pub fn net(e: reqwest::Error) -> Self {
        // reqwest's own message is terse ("error sending request"); its
        // sources say why (connection refused, certificate, timeout).
        let e = e.without_url();
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        Failure::Net(message)
    }

    pub fn not_found(&self) -> bool {
        matches!(self, Failure::Status { code: 404, .. })
    }

    /// The host wants (other) credentials.
    pub fn unauthorized(&self) -> bool {
        match self {
            Failure::Status { code, message } => {
                *code == 401 || message.contains("UNAUTHORIZED") || message.contains("DENIED")
            }
            Failure::Net(_) => false,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Net(m) => f.write_str(m),
            Failure::Status { code, message } if message.is_empty() => {
                write!(f, "answered {code}")
            }
            Failure::Status { code, message } => write!(f, "answered {code}: {message}"),
        }
    }
}

/// What a request carries once the host asked for it.
#[derive(Clone)]
enum Authorization {
    Basic,
    Bearer(String),
}

/// One host of a registry, ready for requests.
pub struct Host {
    pub endpoint: Endpoint,
    /// The `ns` query of every request (a mirror's), or None.
    pub namespace: Option<String>,
    repository: String,
    http: reqwest::Client,
    credentials: Option<Credentials>,
    auth: Mutex<Option<Authorization>>,
}

impl Host {
    /// The client of `endpoint`; `credentials` only where they may go.
    /// Errors name the setting and the file it reads.
    pub fn new(
        endpoint: Endpoint,
        namespace: Option<String>,
        repository: &str,
        credentials: Option<Credentials>,
    ) -> Result<Self, String> {
        let http = client(&endpoint).map_err(|m| format!("host {}: {m}", endpoint.name()))?;
        Ok(Host {
            endpoint,
            namespace,
            repository: repository.to_string(),
            http,
            credentials,
            auth: Mutex::new(None),
        })
    }

    /// The URL of `tail` in the repository on this host.
    pub fn url(&self, tail: &str) -> String {
        self.endpoint.url(&self.repository, tail)
    }

    /// Sends the request `build` makes (again after a 401 this host's
    /// challenge could be answered: `build` is called once per try). A
    /// request to another host (an upload's `Location` elsewhere) gets
    /// neither the `ns` query nor any authorization.
    pub async fn send(
        &self,
        need: Need,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, Failure> {
        let actions = match need {
            Need::Push => "pull,push",
            Need::Resolve | Need::Pull => "pull",
        };
        let mut answered = false;
        loop {
            let mut request = build(&self.http).build().map_err(Failure::net)?;
            let ours = self.is_ours(&request);
            if ours {
                if let Some(ns) = &self.namespace {
                    request.url_mut().query_pairs_mut().append_pair("ns", ns);
                }
                self.authorize(&mut request);
            }
            let response = self.http.execute(request).await.map_err(Failure::net)?;
            if response.status() != StatusCode::UNAUTHORIZED || answered || !ours {
                return Ok(response);
            }
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            if !self.answer(&challenge, actions).await? {
                return Ok(response);
            }
            answered = true;
        }
    }

    /// Whether `request` goes to this host (same scheme, host and port).
    fn is_ours(&self, request: &Request) -> bool {
        let url = request.url();
        let there = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        url.scheme() == self.endpoint.scheme
            && crate::hosts::same_host(&self.endpoint.scheme, &there, &self.endpoint.host)
    }

    fn authorize(&self, request: &mut Request) {
        let auth = self.auth.lock().expect("the auth lock").clone();
        let value = match (auth, &self.credentials) {
            (Some(Authorization::Basic), Some(c)) => basic(c),
            (Some(Authorization::Bearer(token)), _) => format!("Bearer {token}"),
            _ => return,
        };
        if let Ok(mut v) = HeaderValue::from_str(&value) {
            v.set_sensitive(true);
            request.headers_mut().insert(AUTHORIZATION, v);
        }
    }

    /// Answers a 401's challenge for `actions`: a bearer token from its
    /// realm (with the credentials, if this host has them), or basic
    /// credentials. False when there is nothing better to send.
    async fn answer(&self, challenge: &str, actions: &'static str) -> Result<bool, Failure> {
        let challenges = http_auth::parse_challenges(challenge).unwrap_or_default();
        let param = |c: &http_auth::ChallengeRef, name: &str| {
            c.params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_unescaped())
        };
        if let Some(bearer) = challenges
            .iter()
            .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))
        {
            let Some(realm) = param(bearer, "realm") else {
                return Ok(false);
            };
            let mut scopes = vec![format!("repository:{}:{actions}", self.repository)];
            scopes.extend(param(bearer, "scope").filter(|s| !scopes.contains(s)));
            let token = self
                .token(&realm, param(bearer, "service"), &scopes)
                .await?;
            *self.auth.lock().expect("the auth lock") = Some(Authorization::Bearer(token));
            return Ok(true);
        }
        let basic_asked = challenges
            .iter()
            .any(|c| c.scheme.eq_ignore_ascii_case("basic"));
        let mut auth = self.auth.lock().expect("the auth lock");
        if basic_asked && self.credentials.is_some() && !matches!(*auth, Some(Authorization::Basic))
        {
            *auth = Some(Authorization::Basic);
            return Ok(true);
        }
        Ok(false)
    }

    /// A bearer token for `scopes` from the token service at `realm`.
    async fn token(
        &self,
        realm: &str,
        service: Option<String>,
        scopes: &[String],
    ) -> Result<String, Failure> {
        let mut query: Vec<(&str, &str)> = scopes.iter().map(|s| ("scope", s.as_str())).collect();
        if let Some(service) = &service {
            query.push(("service", service));
        }
        let mut request = self.http.get(realm).query(&query);
        if let Some(c) = &self.credentials {
            request = request.header(AUTHORIZATION, basic(c));
        }
        let response = request.send().await.map_err(Failure::net)?;
        let status = response.status();
        if !status.is_success() {
            let message = error_message(response).await;
            return Err(Failure::status(
                status,
                format!("token service {realm}: {message}"),
            ));
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body: Token = response
            .json()
            .await
            .map_err(|e| Failure::Net(format!("token service {realm}: {e}")))?;
        body.token
            .or(body.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Failure::Net(format!("token service {realm}: no token in its answer")))
    }
}

fn basic(c: &Credentials) -> String {
    use base64::Engine;
    let pair = format!("{}:{}", c.user, c.password);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// The registry's error envelope (`{"errors": [{"code", "message"}]}`) as
/// one line, else the status's reason.
pub async fn error_message(response: Response) -> String {
    let reason = response
        .status()
        .canonical_reason()
        .unwrap_or_default()
        .to_string();
    #[derive(serde::Deserialize)]
    struct Envelope {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: String,
        #[serde(default)]
        message: String,
    }
    let body = response.bytes().await.unwrap_or_default();
    match serde_json::from_slice::<Envelope>(&body) {
        Ok(e) if !e.errors.is_empty() => e
            .errors
            .iter()
            .map(|e| format!("{} {}", e.code, e.message).trim().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        _ => reason,
    }
}

/// The HTTP client of `e`.
fn client(e: &Endpoint) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("vsnap/", env!("CARGO_PKG_VERSION")))
        // A host that stops answering fails the transfer (or passes it to
        // the next host) instead of hanging it; an interrupted pull
        // resumes from its cache.
        .connect_timeout(e.dial_timeout.unwrap_or(Duration::from_secs(30)))
        .read_timeout(Duration::from_secs(120))
        .danger_accept_invalid_certs(e.skip_verify);
    let mut headers = HeaderMap::new();
    for (name, values) in &e.header {
        let key = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name:?}: not a header name"))?;
        for v in values {
            let value = HeaderValue::from_str(v)
                .map_err(|_| format!("header {name:?}: a value that is not a header value"))?;
            headers.append(key.clone(), value);
        }
    }
    builder = builder.default_headers(headers);
    let mut roots = Vec::new();
    for file in &e.ca {
        let pem = read(file, "ca")?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|err| format!("ca {}: {err}", file.display()))?;
        if certs.is_empty() {
            return Err(format!("ca {}: no certificate in it", file.display()));
        }
        roots.extend(certs);
    }
    builder = builder.tls_certs_merge(roots);
    if let Some((cert, key)) = e.client.first() {
        let mut pem = read(cert, "client")?;
        if let Some(key) = key {
            pem.push(b'\n');
            pem.extend(read(key, "client")?);
        }
        let identity = reqwest::Identity::from_pem(&pem)
            .map_err(|err| format!("client {}: {err}", cert.display()))?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|err| err.to_string())
}

fn read(file: &std::path::Path, key: &str) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|err| format!("{key} {}: {err}", file.display()))
}
