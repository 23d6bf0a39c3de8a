//! A registry repository as push and pull see it: the parsed reference,
//! the registry's hosts (containerd's `hosts.toml` under the runtime
//! config's `registry_config_path`: mirrors first, the origin last) each
//! with its HTTP client, and the registry's credentials from the runtime
//! config (never from the reference or the command line), which go to the
//! registry itself only, never to a mirror.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use oci_client::Reference;
use vsnap_config::runtime::{RegistryConfig, RuntimeConfig};

use crate::client::Client;
use crate::error::{RegistryError, Result};
use crate::hosts::Need;
use crate::transport::Credentials;

pub struct Remote {
    pub client: Client,
    pub reference: Reference,
    /// Whether credentials were configured (for reports; never their value).
    pub authenticated: bool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("reference", &self.reference.whole())
            .field("authenticated", &self.authenticated)
            .field("hosts", &self.client.source())
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
    /// The repository of `reference` with the runtime config's settings:
    /// its registry's `[registries."host:port"]` entry and the hosts
    /// `registry_config_path` gives it.
    pub fn from_config(reference: &str, config: &RuntimeConfig) -> Result<Self> {
        Self::new(reference, &config.registries, &config.registry_config_path)
    }

    /// The repository of `reference`: its registry's hosts from the
    /// `hosts.toml` under `config_path` (`:`-separated folders; none: the
    /// registry alone), its settings from `registries` (anonymous HTTPS
    /// when it has none).
    pub fn new(
        reference: &str,
        registries: &BTreeMap<String, RegistryConfig>,
        config_path: &str,
    ) -> Result<Self> {
        let reference = parse_reference(reference)?;
        let host = reference.registry().to_string();
        let settings = registries.get(&host).cloned().unwrap_or_default();
        let roots = crate::hosts::roots(config_path);
        let hosts =
            crate::hosts::load(&host, &roots, settings.plain_http).map_err(RegistryError::Hosts)?;
        let credentials = match (&settings.username, &settings.password_file) {
            (Some(user), Some(file)) => Some(Credentials {
                user: user.clone(),
                password: read_password(file, &host)?,
            }),
            _ => None,
        };
        let authenticated = credentials.is_some();
        let client = Client::new(hosts, reference.repository(), credentials)
            .map_err(RegistryError::Hosts)?;
        Ok(Remote {
            client,
            reference,
            authenticated,
        })
    }

    /// The reference as given (no credentials can be in it).
    pub fn name(&self) -> String {
        self.reference.whole()
    }

    /// What reading the reference's manifest needs of a host: a tag is
    /// resolved, a digest pulled.
    pub fn read_need(&self) -> Need {
        match self.reference.digest() {
            Some(_) => Need::Pull,
            None => Need::Resolve,
        }
    }

    /// Checks, before a transfer, that a host for `op` answers the API
    /// (authenticated where it asks: a bearer token where the registry
    /// hands them out, basic credentials otherwise).
    pub async fn login(&self, op: oci_client::RegistryOperation) -> Result<()> {
        let need = match op {
            oci_client::RegistryOperation::Push => Need::Push,
            oci_client::RegistryOperation::Pull => self.read_need(),
        };
        self.client.ping(need).await.map_err(|e| {
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
        let r = Remote::new("127.0.0.1:5000/vsnap/ref:v1", &registries, "").unwrap();
        assert!(r.authenticated);
        assert_eq!(
            read_password(&pw, "127.0.0.1:5000").unwrap(),
            "s3cret-value"
        );
        assert!(!format!("{r:?}").contains("s3cret"), "{r:?}");
        let anon = Remote::new("127.0.0.1:5001/vsnap/ref:v1", &registries, "").unwrap();
        assert!(!anon.authenticated, "another port is another registry");

        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Remote::new("127.0.0.1:5000/vsnap/ref:v1", &registries, "")
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
