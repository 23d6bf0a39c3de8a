//! A `hosts.toml`'s text as containerd reads it: the sections (the
//! `[host."URL"]` ones in file order), values that may be a string or a
//! list, paths taken against the file's folder, Docker's certificate
//! files, Go durations.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// A string or a list of strings.
pub(super) fn strings(v: &toml::Value, key: &str) -> Result<Vec<String>, String> {
    let bad = || format!("{key}: must be a string or a list of strings");
    match v {
        toml::Value::String(s) => Ok(vec![s.clone()]),
        toml::Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

/// `client`: a file, a list of files, or a list of [certificate, key]
/// pairs (an empty key: in the certificate's file).
pub(super) fn client_pairs(v: &toml::Value) -> Result<Vec<(PathBuf, Option<PathBuf>)>, String> {
    let bad =
        || "client: must be a path, a list of paths or of [certificate, key] pairs".to_string();
    let items = match v {
        toml::Value::String(s) => return Ok(vec![(PathBuf::from(s), None)]),
        toml::Value::Array(items) => items,
        _ => return Err(bad()),
    };
    let mut pairs = Vec::new();
    for item in items {
        match item {
            toml::Value::String(s) => pairs.push((PathBuf::from(s), None)),
            toml::Value::Array(pair) => match pair.as_slice() {
                [toml::Value::String(cert), toml::Value::String(key)] => pairs.push((
                    PathBuf::from(cert),
                    (!key.is_empty()).then(|| PathBuf::from(key)),
                )),
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        }
    }
    Ok(pairs)
}

pub(super) fn headers(table: &toml::Table) -> Result<Vec<(String, Vec<String>)>, String> {
    table
        .iter()
        .map(|(name, v)| Ok((name.clone(), strings(v, &format!("header.{name}"))?)))
        .collect()
}

/// The section's relative paths taken against `dir` (the hosts.toml's).
pub(super) fn section_paths(mut s: Section, dir: &Path) -> Section {
    let abs = |p: &str| dir.join(p).display().to_string();
    let map = |v: toml::Value| -> toml::Value {
        match v {
            toml::Value::String(s) if !s.is_empty() => toml::Value::String(abs(&s)),
            toml::Value::Array(items) => toml::Value::Array(
                items
                    .into_iter()
                    .map(|i| match i {
                        toml::Value::String(s) if !s.is_empty() => toml::Value::String(abs(&s)),
                        toml::Value::Array(pair) => toml::Value::Array(
                            pair.into_iter()
                                .map(|p| match p {
                                    toml::Value::String(s) if !s.is_empty() => {
                                        toml::Value::String(abs(&s))
                                    }
                                    other => other,
                                })
                                .collect(),
                        ),
                        other => other,
                    })
                    .collect(),
            ),
            other => other,
        }
    };
    s.ca = s.ca.map(map);
    s.client = s.client.map(map);
    s
}

/// Without a hosts.toml: the folder's Docker-style certificate files, for
/// the origin (`*.crt`: CAs; `*.cert`: a client certificate, its key in
/// the `*.key` of the same name when there is one).
pub(super) fn cert_files(dir: &Path) -> Result<Section, String> {
    let bad = |e: std::io::Error| format!("hosts folder {}: {e}", dir.display());
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()
            .map_err(bad)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Vec::new(),
        Err(e) => return Err(bad(e)),
    };
    names.sort();
    let path = |n: &str| toml::Value::String(dir.join(n).display().to_string());
    let ca: Vec<toml::Value> = names
        .iter()
        .filter(|n| n.ends_with(".crt"))
        .map(|n| path(n))
        .collect();
    let mut client = Vec::new();
    for cert in names.iter().filter(|n| n.ends_with(".cert")) {
        let key = format!("{}.key", cert.trim_end_matches(".cert"));
        let key = match names.contains(&key) {
            true => path(&key),
            false => toml::Value::String(String::new()),
        };
        client.push(toml::Value::Array(vec![path(cert), key]));
    }
    Ok(Section {
        ca: (!ca.is_empty()).then_some(toml::Value::Array(ca)),
        client: (!client.is_empty()).then_some(toml::Value::Array(client)),
        ..Section::default()
    })
}

/// A Go duration (`dial_timeout`): decimal numbers with units `ns`, `us`,
/// `ms`, `s`, `m`, `h`, e.g. `1s`, `500ms`, `1m30s`.
pub(super) fn go_duration(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty".into());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or("a number without a unit")?;
        let number: f64 = rest[..digits].parse().map_err(|_| "not a number")?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(format!("unknown unit {u:?}")),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// A host's settings (the file's root ones apply to the origin).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct Section {
    pub(super) capabilities: Option<Vec<String>>,
    pub(super) ca: Option<toml::Value>,
    pub(super) client: Option<toml::Value>,
    pub(super) skip_verify: Option<bool>,
    pub(super) header: Option<toml::Table>,
    pub(super) override_path: bool,
    pub(super) dial_timeout: Option<String>,
}

/// A hosts.toml. Keys containerd does not know are ignored, as containerd
/// ignores them.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct File {
    pub(super) server: Option<String>,
    pub(super) host: InOrder,
    #[serde(flatten)]
    pub(super) root: Section,
}

/// The `[host."URL"]` sections in the order the file has them (the order
/// they are tried in).
#[derive(Debug, Default)]
pub(super) struct InOrder(pub(super) Vec<(String, Section)>);

impl<'de> Deserialize<'de> for InOrder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Sections;
        impl<'de> Visitor<'de> for Sections {
            type Value = InOrder;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a table of hosts by URL")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<InOrder, A::Error> {
                let mut hosts = Vec::new();
                while let Some(entry) = map.next_entry::<String, Section>()? {
                    hosts.push(entry);
                }
                Ok(InOrder(hosts))
            }
        }
        d.deserialize_map(Sections)
    }
}
