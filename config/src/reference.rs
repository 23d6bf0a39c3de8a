//! The syntax of `vsnap.io/artifact-ref`, read at create without the
//! registry client (the pull runs in the `vsnap` CLI, which parses it
//! again with oci-client; vsnap-registry's tests hold the two to the same
//! registry and repository): `[host[:port]/]path[:tag][@sha256:<hex>]` as
//! the distribution grammar writes it, normalized as docker does (no host:
//! `docker.io`, one component there: `library/NAME`). A reference carrying
//! credentials is refused and not echoed, as vsnap-registry refuses it.

/// The registry and repository a reference names, as a pull reaches them:
/// what the tenant policy (`tenants.artifact_refs`) is held against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    pub registry: String,
    pub repository: String,
}

/// Ok, or why `reference` is refused.
pub fn check(reference: &str) -> Result<(), String> {
    parse(reference).map(|_| ())
}

/// The registry and repository of `reference`, or why it is refused.
pub fn parse(reference: &str) -> Result<Parts, String> {
    let host = reference.split('/').next().unwrap_or_default();
    if host.contains('@') {
        return Err("a reference with credentials (user[:password]@host) is refused and not shown: credentials come from the runtime config's [registries.\"host:port\"]".into());
    }
    let bad = |why: &str| Err(format!("{reference}: not an OCI reference: {why}"));
    let (rest, digest) = match reference.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (reference, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:");
        if !hex.is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(format!("{reference}: only sha256 digests are supported"));
        }
    }
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(tag) = tag {
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let ok = !tag.is_empty()
            && tag.len() <= 128
            && word(tag.as_bytes()[0])
            && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-');
        if !ok {
            return bad("invalid tag");
        }
    }
    if name.is_empty() || name.len() > 255 {
        return bad("invalid repository name length");
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    let mut registry = "docker.io".to_string();
    if parts.len() > 1 && (first.contains(['.', ':']) || first == "localhost") {
        if !is_host(first) {
            return bad("invalid registry host");
        }
        registry = match first {
            "index.docker.io" => "docker.io".to_string(),
            host => host.to_string(),
        };
        parts.remove(0);
    }
    if !parts.iter().all(|p| is_path_component(p)) {
        return bad("invalid repository name");
    }
    let mut repository = parts.join("/");
    if registry == "docker.io" && parts.len() == 1 {
        repository = format!("library/{repository}");
    }
    Ok(Parts {
        registry,
        repository,
    })
}

/// `host[:port]`: dot-separated labels of letters, digits and inner `-`.
fn is_host(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.split('.').all(label)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`.
fn is_path_component(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = s.as_bytes();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::{check, parse, Parts};

    #[test]
    fn the_registry_and_repository_are_normalized_as_docker_does() {
        let parts = |r: &str, g: &str| Parts {
            registry: r.to_string(),
            repository: g.to_string(),
        };
        for (r, want) in [
            (
                "127.0.0.1:5000/fleet/qwen:v1",
                parts("127.0.0.1:5000", "fleet/qwen"),
            ),
            ("localhost/a", parts("localhost", "a")),
            ("ubuntu", parts("docker.io", "library/ubuntu")),
            ("team/ubuntu:1", parts("docker.io", "team/ubuntu")),
            ("index.docker.io/x/y", parts("docker.io", "x/y")),
        ] {
            assert_eq!(parse(r), Ok(want), "{r}");
        }
    }

    #[test]
    fn references_of_the_distribution_grammar_pass() {
        for r in [
            "127.0.0.1:5000/fleet/qwen:v1",
            "registry.example/fleet/q",
            "localhost:5000/a/b-c__d.e:1.0-rc_1",
            "ubuntu:latest",
            "library/ubuntu",
            &format!("r.example:443/x@sha256:{}", "a".repeat(64)),
            &format!("r.example/x:t@sha256:{}", "0".repeat(64)),
        ] {
            assert_eq!(check(r), Ok(()), "{r}");
        }
    }

    #[test]
    fn malformed_references_are_refused_naming_why() {
        for r in [
            "Not A Ref",
            "r.example/Fleet/q",
            "r.example/q:",
            "r.example/q:-x",
            "r.example:port/q",
            "-bad.example/q",
            "r.example//q",
            "r.example/q.",
            "",
        ] {
            let e = check(r).unwrap_err();
            assert!(e.contains("not an OCI reference"), "{r}: {e}");
        }
        let e = check("r.example/q@md5:00").unwrap_err();
        assert!(e.contains("only sha256"), "{e}");
        let e = check("bob:hunter2@registry.example/fleet/q:v1").unwrap_err();
        assert!(e.contains("refused") && !e.contains("hunter2"), "{e}");
    }
}
