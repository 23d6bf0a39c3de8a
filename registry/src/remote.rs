//! A registry repository as push and pull see it: the parsed reference, an
//! oci-client with this registry's transport, and its credentials from the
//! runtime config (never from the reference or the command line).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use vsnap_config::runtime::RegistryConfig;

use crate::error::{RegistryError, Result};

pub struct Remote {
    pub client: Client,
    pub reference: Reference,
    pub auth: RegistryAuth,
    /// Whether credentials were configured (for reports; never their value).
    pub authenticated: bool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("reference", &self.reference.whole())
            .field("authenticated", &self.authenticated)
            .finish()
    }
}

/// Parses `reference` (`host[:port]/repository[:tag][@digest]`).
pub fn parse_reference(reference: &str) -> Result<Reference> {
    // `user:password@host/...` would put a secret in process listings and
    // shell history; it is refused without echoing the reference.
    let host = reference.split('/').next().unwrap_or_default();
    if host.contains('@') {
        return Err(RegistryError::Credentials(
            "a reference with credentials (user[:password]@host) is refused and not shown: credentials come from the runtime config's [registries.\"host:port\"]".into(),
        ));
    }
    if reference.contains('@') && !reference.contains("@sha256:") {
        return Err(RegistryError::Invalid(format!(
            "{reference}: only sha256 digests are supported"
        )));
    }
    reference
        .parse::<Reference>()
        .map_err(|e| RegistryError::Invalid(format!("{reference}: not an OCI reference: {e}")))
}

impl Remote {
    /// The repository of `reference`, with the settings the runtime config
    /// has for its registry (`[registries."host:port"]`); anonymous HTTPS
    /// when it has none.
    pub fn new(reference: &str, registries: &BTreeMap<String, RegistryConfig>) -> Result<Self> {
        let reference = parse_reference(reference)?;
        let host = reference.registry().to_string();
        let settings = registries.get(&host).cloned().unwrap_or_default();
        let protocol = if settings.plain_http {
            ClientProtocol::HttpsExcept(vec![host.clone()])
        } else {
            ClientProtocol::Https
        };
        let client = Client::try_from(ClientConfig {
            protocol,
            // A registry that stops answering fails the transfer instead of
            // hanging it (an interrupted pull resumes from its cache).
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            read_timeout: Some(std::time::Duration::from_secs(120)),
            // The client's own fan-out is not used: push and pull bound
            // their own parallelism.
            ..Default::default()
        })
        .map_err(|e| RegistryError::registry(format!("registry {host}"), e))?;
        let (auth, authenticated) = match (&settings.username, &settings.password_file) {
            (Some(user), Some(file)) => (
                RegistryAuth::Basic(user.clone(), read_password(file, &host)?),
                true,
            ),
            _ => (RegistryAuth::Anonymous, false),
        };
        Ok(Remote {
            client,
            reference,
            auth,
            authenticated,
        })
    }

    /// The reference as given (no credentials can be in it).
    pub fn name(&self) -> String {
        self.reference.whole()
    }

    /// Authenticates for `op` (a bearer token where the registry hands
    /// them out; basic credentials are sent as they are).
    pub async fn login(&self, op: oci_client::RegistryOperation) -> Result<()> {
        self.client
            .auth(&self.reference, &self.auth, op)
            .await
            .map(|_| ())
            .map_err(|e| {
                RegistryError::registry(format!("registry {}: login", self.reference.registry()), e)
            })
    }
}

/// The password in `file`: a regular file owned by this user and not
/// readable by group or others; one trailing newline is stripped. Errors
/// name the file, never its content.
pub fn read_password(file: &Path, host: &str) -> Result<String> {
    let bad = |m: String| {
        RegistryError::Credentials(format!(
            "registries.\"{host}\".password_file {}: {m}",
            file.display()
        ))
    };
    let md = std::fs::symlink_metadata(file).map_err(|e| bad(e.to_string()))?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !md.is_file() || md.mode() & 0o077 != 0 || md.uid() != euid {
        return Err(bad(format!(
            "must be a regular file of uid {euid}, not readable by group or others (mode {:04o}, owner {})",
            md.mode() & 0o7777,
            md.uid()
        )));
    }
    if md.len() > 4096 {
        return Err(bad("is larger than 4 KiB".into()));
    }
    let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
    let password = text.strip_suffix('\n').unwrap_or(&text);
    if password.is_empty() {
        return Err(bad("is empty".into()));
    }
    Ok(password.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The shim holds `vsnap.io/artifact-ref` to the tenant policy with
    /// vsnap_config::reference (no registry client in the shim); the pull
    /// then reaches what oci-client parses. The two must agree, or a policy
    /// would be checked against one repository and another pulled.
    #[test]
    fn the_shims_reading_of_a_reference_is_the_pulls() {
        let digest = format!("@sha256:{}", "a".repeat(64));
        for r in [
            "127.0.0.1:5000/fleet/qwen:v1",
            "localhost:5000/a/b-c__d.e:1.0-rc_1",
            "localhost/a",
            "registry.example/fleet/q",
            "ubuntu",
            "ubuntu:latest",
            "library/ubuntu",
            "team/engine:v2",
            "index.docker.io/x/y",
            "docker.io/x",
            &format!("r.example:443/x{digest}"),
            &format!("r.example/x:t{digest}"),
        ] {
            let ours = vsnap_config::reference::parse(r).unwrap();
            let theirs = parse_reference(r).unwrap();
            assert_eq!(ours.registry, theirs.registry(), "{r}");
            assert_eq!(ours.repository, theirs.repository(), "{r}");
        }
    }

    #[test]
    fn credentials_come_from_the_config_and_never_show() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "s3cret-value\n").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut registries = BTreeMap::new();
        registries.insert(
            "127.0.0.1:5000".to_string(),
            RegistryConfig {
                username: Some("ci".into()),
                password_file: Some(pw.clone()),
                plain_http: true,
            },
        );
        let r = Remote::new("127.0.0.1:5000/vsnap/ref:v1", &registries).unwrap();
        assert!(r.authenticated);
        assert!(matches!(&r.auth, RegistryAuth::Basic(u, p) if u == "ci" && p == "s3cret-value"));
        assert!(!format!("{r:?}").contains("s3cret"), "{r:?}");
        let anon = Remote::new("127.0.0.1:5001/vsnap/ref:v1", &registries).unwrap();
        assert!(!anon.authenticated, "another port is another registry");

        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Remote::new("127.0.0.1:5000/vsnap/ref:v1", &registries)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not readable by group or others"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn references_parse_and_foreign_digests_are_refused() {
        let r = parse_reference("127.0.0.1:5000/vsnap/ref:v1").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "vsnap/ref");
        assert_eq!(r.tag(), Some("v1"));
        assert!(parse_reference("r:1/x@sha512:abcd").is_err());
        assert!(parse_reference("NOT A REF").is_err());
        let e = parse_reference("ci:hunter2@r:1/x:y")
            .unwrap_err()
            .to_string();
        assert!(e.contains("refused") && !e.contains("hunter2"), "{e}");
    }
}
