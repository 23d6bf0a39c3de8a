//! containerd's registry host configuration (`hosts.toml`), read the way
//! containerd 2.x reads it for CRI pulls (its `config_path`), so that a
//! node's mirror (Spegel, Dragonfly, a pull-through cache) serves vsnap's
//! pulls as it serves the node's images.
//!
//! For a registry `host[:port]`, each folder of the `config_path` list is
//! searched in turn for `<host>_<port>_`, `<host>:<port>` and `_default`
//! (in that order within one folder); the first that exists is the one.
//! Its `hosts.toml` lists the hosts: every `[host."URL"]` section in file
//! order (the mirrors), then the origin: `server`, or the registry itself
//! when no `server` is given. A folder without a `hosts.toml` configures
//! only the origin's TLS, Docker's way (`*.crt` CA files, `*.cert` client
//! certificates with their `*.key`). No folder: the origin alone.
//!
//! Which host a request goes to is decided by its capabilities: a tag is
//! resolved only by hosts with `pull` and `resolve`, content by digest is
//! fetched from hosts with `pull` (each in order, the next one tried when
//! one fails or lacks it), and a push goes to the first host with `push`
//! only.
//!
//! Where vsnap departs on purpose: a `hosts.toml` that does not parse fails
//! the transfer naming the file (containerd logs it and falls back to the
//! certificate files); `[registries."host:port"]` credentials go only to a
//! host that is that registry itself, never to a mirror nor to a `server`
//! elsewhere; and of several client certificates a host lists, the first
//! is used.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod file;

use file::{cert_files, client_pairs, go_duration, headers, section_paths, strings, File, Section};

/// What a host may be asked for (`capabilities`; all when not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub pull: bool,
    pub resolve: bool,
    pub push: bool,
}

impl Capabilities {
    pub const ALL: Capabilities = Capabilities {
        pull: true,
        resolve: true,
        push: true,
    };
}

/// What a request needs of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A tag to a manifest: hosts with `pull` and `resolve`.
    Resolve,
    /// Content by digest: hosts with `pull`.
    Pull,
    /// Anything a push sends or reads back: the first host with `push`.
    Push,
}

impl Need {
    fn word(self) -> &'static str {
        match self {
            Need::Resolve => "resolve tags",
            Need::Pull => "pull",
            Need::Push => "push",
        }
    }
}

/// One host a registry's requests may go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub host: String,
    /// The API root every request path starts with: `/v2`, or with
    /// `override_path` the URL's path as written (possibly empty).
    pub path: String,
    pub capabilities: Capabilities,
    /// CA certificate files (PEM), trusted besides the system's.
    pub ca: Vec<PathBuf>,
    /// Client certificates: (certificate, key), the key in the certificate's
    /// file when None.
    pub client: Vec<(PathBuf, Option<PathBuf>)>,
    pub skip_verify: bool,
    /// Headers sent with every request to this host.
    pub header: Vec<(String, Vec<String>)>,
    pub dial_timeout: Option<Duration>,
    /// The last host: `server`, or the registry itself.
    pub origin: bool,
}

impl Endpoint {
    /// `scheme://host`, for messages.
    pub fn name(&self) -> String {
        format!("{}://{}", self.scheme, self.host)
    }

    /// The URL of `tail` (`manifests/v1`, `blobs/sha256:...`) in
    /// `repository`, without query.
    pub fn url(&self, repository: &str, tail: &str) -> String {
        let mut path = String::new();
        for part in [self.path.as_str(), repository, tail] {
            let part = part.trim_matches('/');
            if !part.is_empty() {
                path.push('/');
                path.push_str(part);
            }
        }
        if tail.ends_with('/') {
            path.push('/');
        }
        format!("{}{path}", self.name())
    }

    /// The API root's URL (`GET` answers whether the host speaks the API).
    pub fn root(&self) -> String {
        format!("{}{}/", self.name(), self.path.trim_end_matches('/'))
    }

    pub fn can(&self, need: Need) -> bool {
        let c = self.capabilities;
        match need {
            Need::Resolve => c.pull && c.resolve,
            Need::Pull => c.pull,
            Need::Push => c.push,
        }
    }
}

/// The hosts of one registry, origin last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosts {
    /// `host[:port]` as the reference names it.
    pub registry: String,
    /// The `hosts.toml` (or, without one, the certificate folder) they
    /// come from; None when no folder applies.
    pub source: Option<PathBuf>,
    pub endpoints: Vec<Endpoint>,
}

impl Hosts {
    /// The hosts to ask for `need`, in order: for a push only the first.
    pub fn for_need(&self, need: Need) -> Result<Vec<&Endpoint>, String> {
        Ok(self
            .indices_for(need)?
            .into_iter()
            .map(|i| &self.endpoints[i])
            .collect())
    }

    /// As [`Hosts::for_need`], their places in `endpoints`.
    pub fn indices_for(&self, need: Need) -> Result<Vec<usize>, String> {
        let mut hosts: Vec<usize> = (0..self.endpoints.len())
            .filter(|&i| self.endpoints[i].can(need))
            .collect();
        if need == Need::Push {
            hosts.truncate(1);
        }
        if hosts.is_empty() {
            let from = match &self.source {
                Some(s) => format!(" ({})", s.display()),
                None => String::new(),
            };
            return Err(format!(
                "no host of {}{from} may {}",
                self.registry,
                need.word()
            ));
        }
        Ok(hosts)
    }

    /// Whether the registry's own credentials may go to `e`: only when it
    /// is that registry, never a mirror or another `server`.
    pub fn sends_credentials(&self, e: &Endpoint) -> bool {
        same_host(&e.scheme, &e.host, &self.registry)
    }

    /// The `ns` query a request to `e` carries: the registry's name when
    /// `e` is another host (a mirror serving many registries needs it).
    pub fn namespace(&self, e: &Endpoint) -> Option<&str> {
        (!same_host(&e.scheme, &e.host, &self.registry)).then_some(self.registry.as_str())
    }
}

/// Whether `a` and `b` (`host[:port]`) name one host over `scheme`: the
/// same name (in any case) and port, a missing port being the scheme's.
pub fn same_host(scheme: &str, a: &str, b: &str) -> bool {
    let key = |h: &str| {
        let url = reqwest::Url::parse(&format!("{scheme}://{h}/")).ok()?;
        Some((
            url.host_str()?.to_ascii_lowercase(),
            url.port_or_known_default(),
        ))
    };
    match (key(a), key(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// The folders of a `config_path` (`:`-separated; empty parts skipped).
pub fn roots(config_path: &str) -> Vec<PathBuf> {
    config_path
        .split(':')
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// The folder names tried for `registry` within one root, in order.
fn dir_names(registry: &str) -> Vec<String> {
    let mut names = Vec::new();
    if let Some((host, port)) = registry.rsplit_once(':').filter(|(h, _)| !h.is_empty()) {
        names.push(format!("{host}_{port}_"));
    }
    names.push(registry.to_string());
    names.push("_default".to_string());
    names
}

/// The host folder of `registry`: in each root in turn, the first of
/// `<host>_<port>_`, `<host>:<port>`, `_default` that exists.
pub fn find_dir(roots: &[PathBuf], registry: &str) -> Result<Option<PathBuf>, String> {
    for root in roots {
        for name in dir_names(registry) {
            let dir = root.join(name);
            match std::fs::metadata(&dir) {
                Ok(_) => return Ok(Some(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("hosts folder {}: {e}", dir.display())),
            }
        }
    }
    Ok(None)
}

/// The hosts of `registry` under `roots`; `plain_http` (vsnap's own
/// `[registries]` setting) is the origin's scheme when no `server` names one.
pub fn load(registry: &str, roots: &[PathBuf], plain_http: bool) -> Result<Hosts, String> {
    let Some(dir) = find_dir(roots, registry)? else {
        return Ok(Hosts {
            registry: registry.to_string(),
            source: None,
            endpoints: vec![default_origin(registry, plain_http, Section::default())?],
        });
    };
    let file = dir.join("hosts.toml");
    let text = match std::fs::read(&file) {
        Ok(bytes) => String::from_utf8(bytes)
            .map_err(|_| format!("hosts.toml {}: not UTF-8", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("hosts.toml {}: {e}", file.display())),
    };
    if text.is_empty() {
        let root = cert_files(&dir)?;
        return Ok(Hosts {
            registry: registry.to_string(),
            source: Some(dir),
            endpoints: vec![default_origin(registry, plain_http, root)?],
        });
    }
    let endpoints = parse(registry, &dir, &text, plain_http)
        .map_err(|m| format!("hosts.toml {}: {m}", file.display()))?;
    Ok(Hosts {
        registry: registry.to_string(),
        source: Some(file),
        endpoints,
    })
}

/// A `hosts.toml`'s hosts (in `dir`, against which relative paths are
/// taken): its `[host."URL"]` sections in file order, then the origin.
pub fn parse(
    registry: &str,
    dir: &Path,
    text: &str,
    plain_http: bool,
) -> Result<Vec<Endpoint>, String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
    let mut endpoints = Vec::new();
    for (url, section) in file.host.0 {
        let at = |m: String| format!("host.\"{url}\": {m}");
        let e = endpoint(&url, dir, section, false).map_err(at)?;
        endpoints.push(e);
    }
    let origin = match &file.server {
        Some(server) => {
            endpoint(server, dir, file.root, true).map_err(|m| format!("server: {m}"))?
        }
        None => {
            let root = section_paths(file.root, dir);
            default_origin(registry, plain_http, root)?
        }
    };
    endpoints.push(origin);
    Ok(endpoints)
}

/// The registry itself as the origin: every capability, `/v2`, over HTTPS
/// unless vsnap's config says plain HTTP; the file's root TLS settings.
fn default_origin(registry: &str, plain_http: bool, root: Section) -> Result<Endpoint, String> {
    let scheme = if plain_http { "http" } else { "https" };
    let mut e = settle(scheme, registry.to_string(), "/v2".into(), root, true)?;
    e.capabilities = Capabilities::ALL;
    Ok(e)
}

/// One host from its URL (`https://` when it names no scheme) and section.
fn endpoint(url: &str, dir: &Path, section: Section, origin: bool) -> Result<Endpoint, String> {
    let (scheme, host, path) = split_url(url, section.override_path)?;
    settle(&scheme, host, path, section_paths(section, dir), origin)
}

fn settle(
    scheme: &str,
    host: String,
    path: String,
    s: Section,
    origin: bool,
) -> Result<Endpoint, String> {
    Ok(Endpoint {
        scheme: scheme.to_string(),
        host,
        path,
        capabilities: capabilities(s.capabilities.as_deref())?,
        ca: match &s.ca {
            Some(v) => strings(v, "ca")?.into_iter().map(PathBuf::from).collect(),
            None => Vec::new(),
        },
        client: match &s.client {
            Some(v) => client_pairs(v)?,
            None => Vec::new(),
        },
        skip_verify: s.skip_verify.unwrap_or(false),
        header: match &s.header {
            Some(t) => headers(t)?,
            None => Vec::new(),
        },
        dial_timeout: match &s.dial_timeout {
            Some(d) => Some(go_duration(d).map_err(|m| format!("dial_timeout {d:?}: {m}"))?),
            None => None,
        },
        origin,
    })
}

/// (scheme, host[:port], API root) of a host's URL, as containerd reads
/// it: `/v2` appended to the path unless it ends so or `override_path`.
fn split_url(raw: &str, override_path: bool) -> Result<(String, String, String), String> {
    let full = match raw.split_once("://") {
        Some(_) => raw.to_string(),
        None => format!("https://{raw}"),
    };
    let url = reqwest::Url::parse(&full).map_err(|e| format!("not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a URL with credentials is refused (vsnap sends none to such a host)".into());
    }
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme {:?}: http or https only", url.scheme()));
    }
    let name = url.host_str().filter(|h| !h.is_empty()).ok_or("no host")?;
    let host = match url.port() {
        Some(port) => format!("{name}:{port}"),
        None => name.to_string(),
    };
    let mut path = clean_path(url.path());
    if !override_path && !path.ends_with("/v2") {
        path.push_str("/v2");
    }
    Ok((url.scheme().to_string(), host, path))
}

/// `path` without empty, `.` and `..` parts (as Go's path.Clean, with no
/// trailing slash: the root is "").
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.iter().map(|p| format!("/{p}")).collect()
}

fn capabilities(names: Option<&[String]>) -> Result<Capabilities, String> {
    let Some(names) = names.filter(|n| !n.is_empty()) else {
        return Ok(Capabilities::ALL);
    };
    let mut c = Capabilities {
        pull: false,
        resolve: false,
        push: false,
    };
    for name in names {
        match name.to_ascii_lowercase().as_str() {
            "pull" => c.pull = true,
            "resolve" => c.resolve = true,
            "push" => c.push = true,
            // The referrers API: vsnap keeps signatures under a tag.
            "referrers" => {}
            other => return Err(format!("capabilities: unknown capability {other:?}")),
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests;
