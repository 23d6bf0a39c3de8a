//! containerd's registry host configuration (`hosts.toml` under the
//! runtime config's `registry_config_path`): a node's mirror serves
//! `vsnap pull` and the shim's `vsnap.io/artifact-ref` pulls, pushes go to
//! the registry alone, and the registry's credentials never reach the
//! mirror.

use std::path::Path;

use vsnap_e2e::engine::{free_port, HostEngine};
use vsnap_e2e::registry::{RecordingProxy, Registry};
use vsnap_e2e::snapshot_env::{answers, assert_has, Env};

use super::harness::{fleet_with, vsnap_json};

const PASSWORD: &str = "s3cret-mirror-pw";

/// `env`'s runtime config gets the registry `host`'s entry: plain HTTP
/// and the credentials in `password_file`.
fn with_credentials(env: &Env, host: &str, password_file: &Path) {
    let mut config = std::fs::read_to_string(&env.config).unwrap();
    config.push_str(&format!(
        "[registries.\"{host}\"]\nplain_http = true\nusername = \"fleet\"\npassword_file = \"{}\"\n",
        password_file.display()
    ));
    std::fs::write(&env.config, config).unwrap();
}

/// A hosts folder as a node's mirror (Spegel's layout) writes it: the
/// registry's own folder, in containerd's spelling of `host:port`, naming
/// the registry as `server` and the mirror as a host that pulls and
/// resolves (and may not push).
fn hosts_folder(dir: &Path, registry: &Registry, mirror: &str) -> String {
    let folder = dir.join(format!("127.0.0.1_{}_", registry.port));
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n\n[host.\"http://{mirror}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  dial_timeout = \"2s\"\n",
            registry.host()
        ),
    )
    .unwrap();
    format!("registry_config_path = \"{}\"\n", dir.display())
}

#[test]
fn a_mirror_in_hosts_toml_serves_pulls_with_the_registry_down_and_never_gets_credentials() {
    let (a, mut b, mut origin) = fleet_with("fleet-mirror", Some(("fleet", PASSWORD)));
    b.rootfs = a.rootfs.clone();
    let host = origin.host();
    let password_file = a.c.dir.join("registry.password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(
        &password_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    // Both hosts hold the registry's credentials and the same node
    // configuration: a mirror in front of which a proxy records every
    // request it is sent.
    let mirror = Registry::start(&b.c.dir);
    let proxy = RecordingProxy::start(mirror.port);
    let path = hosts_folder(&a.c.dir.join("certs.d"), &origin, &proxy.host());
    for env in [&a, &b] {
        with_credentials(env, &host, &password_file);
        env.prepend_config(&path);
    }
    a.create_good("fleet-mirror-donor", "m", &[]);
    let cold = HostEngine::start();
    let reference = answers(cold.port);

    // A push goes to the registry only: the mirror may not push.
    let r = format!("{host}/fleet/m:v1");
    let pushed = vsnap_json(&a, &["push", "m", &r]);
    assert!(
        proxy.sent().is_empty(),
        "a push asked the mirror: {}",
        proxy.sent()
    );

    // The mirror holds what the registry holds (as one that served it
    // would); then the registry goes away, killed by its pid.
    mirror.copy_content_from(&origin);
    origin.kill();
    assert!(!origin.answers(), "the registry is down");

    // `vsnap pull` on B: every request served by the mirror.
    let pulled = vsnap_json(&b, &["pull", &r, "m-pulled"]);
    assert_eq!(pulled["digest"], pushed["digest"], "{pulled}");
    assert_eq!(pulled["fetched"], pushed["unique_chunks"], "{pulled}");
    let ns = format!("?ns=127.0.0.1%3A{}", origin.port);
    assert_has(
        &proxy.sent(),
        &[
            &format!("GET /v2/fleet/m/manifests/v1{ns}"),
            "GET /v2/fleet/m/manifests/sha256-",
            "GET /v2/fleet/m/blobs/sha256:",
        ],
    );

    // A restore from the reference on B, the artifact absent: the shim's
    // pull goes through the mirror too, and the copy answers like a cold
    // start.
    let before = proxy.sent().len();
    let port = free_port();
    let out = b.run(
        "fleet-mirror-copy",
        "restore",
        "m",
        port,
        &["--annotation", &format!("vsnap.io/artifact-ref={r}")],
    );
    assert!(out.ok(), "{out:?}\n{}", b.c.log_tail());
    assert_eq!(answers(port), reference, "the mirror's copy answers");
    b.remove("fleet-mirror-copy");
    assert!(
        proxy.sent()[before..].contains(&format!("GET /v2/fleet/m/manifests/v1{ns}")),
        "the shim's pull went elsewhere"
    );

    // Configured for the registry, the credentials never reached the
    // mirror: no Authorization header in any request it was sent.
    let sent = proxy.sent().to_ascii_lowercase();
    assert!(!sent.contains("authorization:"), "{sent}");
    assert!(!sent.contains(&PASSWORD.to_ascii_lowercase()), "{sent}");
}
