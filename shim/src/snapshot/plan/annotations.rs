//! The `vsnap.io/` annotations, turned into a [`Plan`]. Invalid values fail
//! the create with an error naming the annotation.

use std::collections::HashMap;
use std::time::Duration;
use vsnap_artifact::ArtifactName;

use crate::bundle_spec::{CRI_CONTAINER_TYPE, CRI_SANDBOX};
use crate::error::{Error, Result};
use crate::snapshot::engine_argv::Protocol;
use crate::snapshot::registry::fetch::Wanted;

pub const PLAN: &str = "vsnap.io/plan";
pub const ARTIFACT: &str = "vsnap.io/artifact";
/// An OCI reference (`registry/repo:tag` or `@sha256:...`) a restore pulls
/// the artifact from when the artifact root does not hold it (fetch.rs).
pub const ARTIFACT_REF: &str = "vsnap.io/artifact-ref";
pub const LISTEN: &str = "vsnap.io/listen";
pub const AFTER_CAPTURE: &str = "vsnap.io/after-capture";
pub const CAPTURE_TIMEOUT: &str = "vsnap.io/capture-timeout";
pub const ACTIVATION_TIMEOUT: &str = "vsnap.io/activation-timeout";
/// `startup` (vLLM's control-dir protocol) or `barrier` (released vLLM).
pub const ENGINE_PROTOCOL: &str = "vsnap.io/engine-protocol";
/// More environment variables each pod is given as its own (per_pod.rs).
pub const PER_POD_ENV: &str = vsnap_artifact::per_pod::ANNOTATION;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Create,
    Restore,
    /// Restore when the artifact exists, otherwise create.
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterCapture {
    /// Activate the original process (kind "donor") so it goes on serving.
    Serve,
    /// Stop the original process once the artifact is published.
    Exit,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub mode: Mode,
    /// `None` only with `auto`: the name is then derived from the workload.
    pub artifact: Option<ArtifactName>,
    pub host: Option<String>,
    pub port: u16,
    pub after_capture: AfterCapture,
    pub capture_timeout: Option<Duration>,
    pub activation_timeout: Option<Duration>,
    /// The engine protocol annotation, resolved against the argv at create.
    pub engine_protocol: Option<Protocol>,
    /// Where to pull the artifact from when it is not here (restore, auto).
    pub artifact_ref: Option<String>,
}

impl Plan {
    /// The artifact to fetch from (or push to) a registry, when the plan
    /// names a reference.
    pub fn wanted(&self) -> Option<Wanted> {
        Some(Wanted {
            reference: self.artifact_ref.clone()?,
            name: self.artifact.clone()?,
            auto: self.mode == Mode::Auto,
        })
    }
}

/// `None` when the container runs plain (no plan, `off`, or a CRI sandbox:
/// [`CRI_CONTAINER_TYPE`], which labels may carry too).
pub fn from_annotations(a: &HashMap<String, String>) -> Result<Option<Plan>> {
    if a.get(CRI_CONTAINER_TYPE).map(String::as_str) == Some(CRI_SANDBOX) {
        return Ok(None);
    }
    check_known_keys(a)?;
    let Some(mode) = mode_of(a)? else {
        return Ok(None);
    };
    let artifact = artifact_of(a, mode)?;
    let artifact_ref = artifact_ref_of(a, mode, artifact.as_ref().map(ArtifactName::as_str))?;
    let listen = a
        .get(LISTEN)
        .ok_or_else(|| invalid(LISTEN, "required with a snapshot plan (HOST:PORT)".into()))?;
    let (host, port) = parse_listen(listen).map_err(|m| invalid(LISTEN, m))?;
    Ok(Some(Plan {
        mode,
        artifact,
        host,
        port,
        after_capture: after_capture_of(a)?,
        capture_timeout: seconds(a, CAPTURE_TIMEOUT)?,
        activation_timeout: seconds(a, ACTIVATION_TIMEOUT)?,
        engine_protocol: protocol_of(a)?,
        artifact_ref,
    }))
}

/// The create's error for the annotation `key`.
fn invalid(key: &str, msg: String) -> Error {
    Error::InvalidArgument(format!("create: annotation {key}: {msg}"))
}

/// The plan [`PLAN`] names; `None` for none or `off`.
fn mode_of(a: &HashMap<String, String>) -> Result<Option<Mode>> {
    match a.get(PLAN).map(String::as_str) {
        None | Some("off") => Ok(None),
        Some("create") => Ok(Some(Mode::Create)),
        Some("restore") => Ok(Some(Mode::Restore)),
        Some("auto") => Ok(Some(Mode::Auto)),
        Some(other) => Err(invalid(
            PLAN,
            format!("{other:?} is not one of off, create, restore, auto"),
        )),
    }
}

/// The artifact's name ([`ARTIFACT`]), which only `auto` may leave out.
fn artifact_of(a: &HashMap<String, String>, mode: Mode) -> Result<Option<ArtifactName>> {
    match (a.get(ARTIFACT), mode) {
        (Some(name), _) => ArtifactName::new(name.as_str())
            .map(Some)
            .map_err(|e| invalid(ARTIFACT, e.to_string())),
        (None, Mode::Auto) => Ok(None),
        (None, _) => Err(invalid(
            ARTIFACT,
            "required with the create and restore plans".into(),
        )),
    }
}

/// The reference to pull the artifact from ([`ARTIFACT_REF`]): only with a
/// restore or auto plan that names the artifact.
fn artifact_ref_of(
    a: &HashMap<String, String>,
    mode: Mode,
    artifact: Option<&str>,
) -> Result<Option<String>> {
    match (a.get(ARTIFACT_REF), mode, artifact) {
        (None, ..) => Ok(None),
        (Some(_), Mode::Create, _) => Err(invalid(
            ARTIFACT_REF,
            "only with the restore and auto plans (a create makes the artifact)".into(),
        )),
        (Some(_), _, None) => Err(invalid(
            ARTIFACT_REF,
            format!("needs {ARTIFACT}: the name the pulled artifact gets here"),
        )),
        (Some(r), ..) => {
            vsnap_config::reference::check(r).map_err(|e| invalid(ARTIFACT_REF, e))?;
            Ok(Some(r.clone()))
        }
    }
}

/// What follows a capture ([`AFTER_CAPTURE`]); `serve` unless it says `exit`.
fn after_capture_of(a: &HashMap<String, String>) -> Result<AfterCapture> {
    match a.get(AFTER_CAPTURE).map(String::as_str) {
        None | Some("serve") => Ok(AfterCapture::Serve),
        Some("exit") => Ok(AfterCapture::Exit),
        Some(other) => Err(invalid(
            AFTER_CAPTURE,
            format!("{other:?} is not one of serve, exit"),
        )),
    }
}

/// The engine protocol [`ENGINE_PROTOCOL`] asks for, if it asks.
fn protocol_of(a: &HashMap<String, String>) -> Result<Option<Protocol>> {
    let Some(name) = a.get(ENGINE_PROTOCOL) else {
        return Ok(None);
    };
    Protocol::named(name).map(Some).ok_or_else(|| {
        invalid(
            ENGINE_PROTOCOL,
            format!("{name:?} is not one of startup, barrier"),
        )
    })
}

/// A timeout annotation `key`: whole seconds in 1..=86400, if given.
fn seconds(a: &HashMap<String, String>, key: &str) -> Result<Option<Duration>> {
    match a.get(key) {
        None => Ok(None),
        Some(v) => match v.parse::<u64>() {
            Ok(s) if s > 0 && s <= 86_400 => Ok(Some(Duration::from_secs(s))),
            _ => Err(invalid(
                key,
                format!("{v:?} is not a number of seconds in 1..=86400"),
            )),
        },
    }
}

/// Every `vsnap.io/` key vsnap reads.
pub const KNOWN: [&str; 9] = [
    PLAN,
    ARTIFACT,
    ARTIFACT_REF,
    LISTEN,
    AFTER_CAPTURE,
    CAPTURE_TIMEOUT,
    ACTIVATION_TIMEOUT,
    ENGINE_PROTOCOL,
    PER_POD_ENV,
];

/// A `vsnap.io/` key vsnap does not know is a mistake (`vsnap.io/plann`
/// would otherwise run the container plain without a word): refused,
/// naming the nearest known key.
fn check_known_keys(a: &HashMap<String, String>) -> Result<()> {
    let mut unknown: Vec<&String> = a
        .keys()
        .filter(|k| k.starts_with("vsnap.io/") && !KNOWN.contains(&k.as_str()))
        .collect();
    unknown.sort();
    let Some(key) = unknown.first() else {
        return Ok(());
    };
    let nearest = KNOWN
        .iter()
        .map(|k| (edit_distance(key, k), k))
        .min()
        .filter(|(d, _)| *d <= 3)
        .map(|(_, k)| format!(" (did you mean {k}?)"))
        .unwrap_or_default();
    Err(Error::InvalidArgument(format!(
        "create: annotation {key}: unknown vsnap.io/ key{nearest}; known: {}",
        KNOWN.join(", ")
    )))
}

/// Levenshtein distance of two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `HOST:PORT`, `[V6]:PORT` or `:PORT` (all interfaces, host null). The
/// host must resolve now: a mistake found after a capture would publish an
/// artifact no copy can be probed on.
fn parse_listen(v: &str) -> std::result::Result<(Option<String>, u16), String> {
    let (host, port) = v
        .rsplit_once(':')
        .ok_or_else(|| format!("{v:?} is not HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{v:?}: port must be 1-65535"))?;
    let host = match (host.strip_prefix('['), host.strip_suffix(']')) {
        (Some(_), Some(_)) => {
            let inner = &host[1..host.len() - 1];
            inner
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("{v:?}: [{inner}] is not an IPv6 address"))?;
            inner
        }
        (None, None) if host.contains(':') => {
            return Err(format!(
                "{v:?}: an IPv6 address goes in brackets: [ADDR]:PORT"
            ))
        }
        (None, None) => host,
        _ => return Err(format!("{v:?}: unbalanced brackets")),
    };
    if host.is_empty() {
        return Ok((None, port));
    }
    if host.contains(char::is_whitespace) {
        return Err(format!("{v:?}: host has whitespace"));
    }
    use std::net::ToSocketAddrs;
    let resolved = (host, port)
        .to_socket_addrs()
        .map(|mut a| a.next().is_some());
    if !matches!(resolved, Ok(true)) {
        return Err(format!("{v:?}: host {host:?} does not resolve"));
    }
    Ok((Some(host.to_string()), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unknown_vsnap_keys_are_refused_naming_the_nearest() {
        let e = from_annotations(&ann(&[("vsnap.io/plann", "create")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "annotation vsnap.io/plann: unknown vsnap.io/ key (did you mean vsnap.io/plan?)"
            ),
            "{e}"
        );
        let e = from_annotations(&ann(&[(PLAN, "create"), ("vsnap.io/zzzzzzzzzz", "1")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown vsnap.io/ key; known: vsnap.io/plan"),
            "{e}"
        );
        // Other prefixes are not vsnap's business.
        assert_eq!(
            from_annotations(&ann(&[("example.com/plann", "x")])).unwrap(),
            None
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn listen_addresses_are_checked_whole() {
        assert_eq!(parse_listen(":80"), Ok((None, 80)));
        assert_eq!(parse_listen("[::1]:8000"), Ok((Some("::1".into()), 8000)));
        assert_eq!(
            parse_listen("127.0.0.1:8000"),
            Ok((Some("127.0.0.1".into()), 8000))
        );
        assert_eq!(parse_listen("localhost:8000").map(|(_, p)| p), Ok(8000));
        for (bad, why) in [
            ("[::1:8000", "unbalanced brackets"),
            ("::1]:8000", "unbalanced brackets"),
            ("::1:8000", "in brackets"),
            ("[nope]:80", "not an IPv6 address"),
            ("no-such-host.invalid:80", "does not resolve"),
            ("127.0.0.1:0", "port must be"),
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn no_plan_or_off_runs_plain() {
        assert_eq!(from_annotations(&ann(&[])).unwrap(), None);
        assert_eq!(from_annotations(&ann(&[(PLAN, "off")])).unwrap(), None);
    }

    #[test]
    fn a_cri_sandbox_always_runs_plain() {
        let a = ann(&[(PLAN, "create"), (CRI_CONTAINER_TYPE, "sandbox")]);
        assert_eq!(from_annotations(&a).unwrap(), None);
    }

    #[test]
    fn a_full_plan_is_read() {
        let a = ann(&[
            (PLAN, "create"),
            (ARTIFACT, "qwen3-0.6b"),
            (LISTEN, "127.0.0.1:8000"),
            (AFTER_CAPTURE, "exit"),
            (CAPTURE_TIMEOUT, "60"),
        ]);
        let p = from_annotations(&a).unwrap().unwrap();
        assert_eq!(p.mode, Mode::Create);
        assert_eq!(p.host.as_deref(), Some("127.0.0.1"));
        assert_eq!(p.port, 8000);
        assert_eq!(p.after_capture, AfterCapture::Exit);
        assert_eq!(p.capture_timeout, Some(Duration::from_secs(60)));
        assert_eq!(p.artifact_ref, None);
    }

    #[test]
    fn an_artifact_reference_goes_with_a_named_restore_or_auto() {
        let r = "registry.example:5000/fleet/qwen3:v1";
        for plan in ["restore", "auto"] {
            let a = ann(&[
                (PLAN, plan),
                (ARTIFACT, "q"),
                (LISTEN, ":8000"),
                (ARTIFACT_REF, r),
            ]);
            let p = from_annotations(&a).unwrap().unwrap();
            assert_eq!(p.artifact_ref.as_deref(), Some(r));
        }
        let refused = |pairs: &[(&str, &str)], why: &str| {
            let e = from_annotations(&ann(pairs)).unwrap_err().to_string();
            assert!(e.contains(ARTIFACT_REF) && e.contains(why), "{e}");
        };
        refused(
            &[
                (PLAN, "create"),
                (ARTIFACT, "q"),
                (LISTEN, ":1"),
                (ARTIFACT_REF, r),
            ],
            "only with the restore and auto plans",
        );
        refused(
            &[(PLAN, "auto"), (LISTEN, ":1"), (ARTIFACT_REF, r)],
            "needs vsnap.io/artifact",
        );
        refused(
            &[
                (PLAN, "restore"),
                (ARTIFACT, "q"),
                (LISTEN, ":1"),
                (ARTIFACT_REF, "Not A Ref"),
            ],
            "not an OCI reference",
        );
        // Credentials never come from an annotation, and are not echoed.
        let e = from_annotations(&ann(&[
            (PLAN, "restore"),
            (ARTIFACT, "q"),
            (LISTEN, ":1"),
            (ARTIFACT_REF, "bob:hunter2@registry.example/fleet/q:v1"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("refused") && !e.contains("hunter2"), "{e}");
    }

    #[test]
    fn bad_values_name_the_annotation() {
        let base = [(ARTIFACT, "a"), (LISTEN, ":8000")];
        for (key, value) in [
            (PLAN, "sometimes"),
            (ARTIFACT, "../etc"),
            (ARTIFACT, "/var/lib/other"),
            (ARTIFACT, ".hidden"),
            (LISTEN, "8000"),
            (LISTEN, "host:0"),
            (AFTER_CAPTURE, "linger"),
            (CAPTURE_TIMEOUT, "0"),
            (ACTIVATION_TIMEOUT, "soon"),
            (ENGINE_PROTOCOL, "carrier"),
        ] {
            let mut a = ann(&base);
            a.insert(PLAN.into(), "create".into());
            a.insert(key.into(), value.into());
            let err = from_annotations(&a).unwrap_err().to_string();
            assert!(err.contains(key), "{key}={value}: {err}");
        }
    }

    #[test]
    fn only_auto_may_leave_the_artifact_unnamed() {
        let p = from_annotations(&ann(&[(PLAN, "auto"), (LISTEN, ":8000")]))
            .unwrap()
            .unwrap();
        assert_eq!(p.artifact, None);
        let err = from_annotations(&ann(&[(PLAN, "restore"), (LISTEN, ":8000")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains(ARTIFACT), "{err}");
    }

    #[test]
    fn listen_without_host_means_all_interfaces() {
        assert_eq!(parse_listen(":8000").unwrap(), (None, 8000));
        assert_eq!(parse_listen("[::1]:80").unwrap(), (Some("::1".into()), 80));
    }
}
