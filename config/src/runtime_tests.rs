use super::*;

#[test]
fn empty_body_gives_defaults() {
    assert_eq!(
        RuntimeConfig::parse("", "inline").unwrap(),
        RuntimeConfig::default()
    );
}

#[test]
fn known_keys_are_read() {
    let c = RuntimeConfig::parse(
        "runc_binary = \"/usr/sbin/runc\"\nrunc_root = \"/run/x\"\nlog_level = \"debug\"\n",
        "inline",
    )
    .unwrap();
    assert_eq!(c.runc_binary, PathBuf::from("/usr/sbin/runc"));
    assert_eq!(c.runc_root, Some(PathBuf::from("/run/x")));
    assert_eq!(c.log_level, LogLevel::Debug);
}

#[test]
fn pages_are_shared_unless_turned_off() {
    assert!(RuntimeConfig::default().share_pages);
    let off = RuntimeConfig::parse("share_pages = false", "inline").unwrap();
    assert!(!off.share_pages);
}

#[test]
fn huge_pages_are_placed_when_free_unless_told_otherwise() {
    assert_eq!(RuntimeConfig::default().huge_pages, HugePages::WhenFree);
    for (word, want) in [
        ("when-free", HugePages::WhenFree),
        ("always", HugePages::Always),
        ("never", HugePages::Never),
    ] {
        let c = RuntimeConfig::parse(&format!("huge_pages = \"{word}\"\n"), "inline").unwrap();
        assert_eq!(c.huge_pages, want, "{word}");
    }
    let err = RuntimeConfig::parse("huge_pages = \"sometimes\"\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(err.contains("when-free"), "{err}");
}

#[test]
fn memory_images_are_sealed_at_rest_only_when_turned_on() {
    assert!(!RuntimeConfig::default().seal_at_rest);
    let c = RuntimeConfig::parse("seal_at_rest = true\n", "inline").unwrap();
    assert!(c.seal_at_rest);
}

#[test]
fn zero_pages_are_elided_unless_turned_off() {
    assert!(RuntimeConfig::default().elide_zero_pages);
    let c = RuntimeConfig::parse("elide_zero_pages = false\n", "inline").unwrap();
    assert!(!c.elide_zero_pages);
}

#[test]
fn masks_are_external_unless_turned_off() {
    assert!(RuntimeConfig::default().external_masks);
    let c = RuntimeConfig::parse("external_masks = false\n", "inline").unwrap();
    assert!(!c.external_masks);
}

#[test]
fn the_memory_preflight_is_on_unless_turned_off() {
    assert!(RuntimeConfig::default().memory_preflight);
    let c = RuntimeConfig::parse("memory_preflight = false\n", "inline").unwrap();
    assert!(!c.memory_preflight);
    let err = RuntimeConfig::parse("memory_preflight = \"off\"\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(err.contains("bool"), "{err}");
}

#[test]
fn the_tenant_policy_is_read_strictly() {
    let c = RuntimeConfig::parse(
        "[tenants]\ncreate = [\"k8s.io/*\"]\n[[tenants.share]]\nowner = \"k8s.io/models\"\nartifacts = [\"llama-*\"]\nto = [\"k8s.io/team-a\"]\n[tenants.artifact_refs]\n\"k8s.io/team-a\" = [\"reg.internal:5000/team-a/*\"]\n",
        "inline",
    )
    .unwrap();
    assert!(c.tenants.may_create("k8s.io/team-a"));
    assert!(c
        .tenants
        .share_for("k8s.io/team-a", "k8s.io/models", "llama-8b")
        .is_some());
    let e = RuntimeConfig::parse("[tenants]\ncreate = [\"a/b/c\"]\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tenants.create"), "{e}");
    let e = RuntimeConfig::parse("[tenants]\nshares = []\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `shares`"), "{e}");
}

#[test]
fn unknown_key_is_named() {
    let err = RuntimeConfig::parse("runc_binry = \"x\"\n", "/etc/vsnap/config.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("runc_binry"), "{err}");
    assert!(err.contains("/etc/vsnap/config.toml"), "{err}");
}

#[test]
fn bad_value_is_named() {
    let err = RuntimeConfig::parse("log_level = \"loud\"\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(err.contains("loud"), "{err}");
    let err = RuntimeConfig::parse("runc_root = \"relative\"\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(err.contains("runc_root"), "{err}");
}

#[test]
fn fleet_keys_are_absolute_paths() {
    let c = RuntimeConfig::parse(
        "fleet_signing_key = \"/etc/vsnap/fleet.key\"\nfleet_trusted_keys = [\"/etc/vsnap/a.pub\", \"/etc/vsnap/b.pub\"]\nfleet_fingerprint_key = \"/etc/vsnap/fingerprint.key\"\nfleet_encryption_key = \"/etc/vsnap/enc.key\"\nfleet_decryption_keys = [\"/etc/vsnap/enc-old.key\"]\n",
        "inline",
    )
    .unwrap();
    assert_eq!(
        c.fleet_signing_key,
        Some(PathBuf::from("/etc/vsnap/fleet.key"))
    );
    assert_eq!(c.fleet_trusted_keys.len(), 2);
    assert_eq!(
        c.fleet_fingerprint_key,
        Some(PathBuf::from("/etc/vsnap/fingerprint.key"))
    );
    assert_eq!(
        c.fleet_encryption_key,
        Some(PathBuf::from("/etc/vsnap/enc.key"))
    );
    assert_eq!(
        c.fleet_decryption_keys,
        [PathBuf::from("/etc/vsnap/enc-old.key")]
    );
    for body in [
        "fleet_signing_key = \"fleet.key\"",
        "fleet_trusted_keys = [\"/a.pub\", \"b.pub\"]",
        "fleet_fingerprint_key = \"k\"",
        "fleet_encryption_key = \"enc.key\"",
        "fleet_decryption_keys = [\"/a.key\", \"old.key\"]",
    ] {
        let err = RuntimeConfig::parse(body, "inline")
            .unwrap_err()
            .to_string();
        let key = body.split(' ').next().unwrap();
        assert!(
            err.contains(key) && err.contains("not an absolute path"),
            "{err}"
        );
    }
    let err = RuntimeConfig::parse("fleet_trusted_keys = \"/a.pub\"", "inline")
        .unwrap_err()
        .to_string();
    assert!(err.contains("sequence"), "a list: {err}");
}

#[test]
fn registries_are_read_and_checked() {
    let c = RuntimeConfig::parse(
        "[registries.\"127.0.0.1:5000\"]\nplain_http = true\n\
         [registries.\"reg.example:443\"]\nusername = \"ci\"\npassword_file = \"/etc/vsnap/reg.pw\"\n",
        "inline",
    )
    .unwrap();
    assert!(c.registries["127.0.0.1:5000"].plain_http);
    assert_eq!(
        c.registries["reg.example:443"].username.as_deref(),
        Some("ci")
    );
    for (body, named) in [
        (
            "[registries.\"r:1\"]\nusername = \"u\"\n",
            "username without password_file",
        ),
        ("[registries.\"r:1\"]\npassword = \"p\"\n", "password"),
        ("[registries.\"https://r\"]\n", "no scheme"),
        (
            "[registries.\"r\"]\nusername = \"u\"\npassword_file = \"pw\"\n",
            "absolute",
        ),
    ] {
        let err = RuntimeConfig::parse(body, "inline")
            .unwrap_err()
            .to_string();
        assert!(err.contains(named), "{body}: {err}");
    }
}

#[test]
fn the_registry_config_path_is_containerds_list_of_absolute_folders() {
    assert_eq!(
        RuntimeConfig::default().registry_config_path,
        "/etc/containerd/certs.d"
    );
    let c = RuntimeConfig::parse(
        "registry_config_path = \"/etc/containerd/certs.d:/run/mirrors\"\n",
        "inline",
    )
    .unwrap();
    assert_eq!(
        c.registry_config_path,
        "/etc/containerd/certs.d:/run/mirrors"
    );
    let none = RuntimeConfig::parse("registry_config_path = \"\"\n", "inline").unwrap();
    assert_eq!(none.registry_config_path, "");
    let err = RuntimeConfig::parse("registry_config_path = \"/a:certs.d\"\n", "inline")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("registry_config_path: certs.d is not an absolute path"),
        "{err}"
    );
}

#[test]
fn missing_file_names_the_path() {
    let err = RuntimeConfig::load(Path::new("/nonexistent/vsnap.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/vsnap.toml"), "{err}");
}

#[test]
fn per_pod_env_names_variables_and_refuses_what_is_not_a_name() {
    assert!(RuntimeConfig::default().per_pod_env.is_empty());
    let c = RuntimeConfig::parse("per_pod_env = [\"POD_NAME\", \"POD_IP\"]\n", "inline").unwrap();
    assert_eq!(c.per_pod_env, ["POD_NAME", "POD_IP"]);
    let e = RuntimeConfig::parse("per_pod_env = [\"POD_IP=1\"]\n", "inline").unwrap_err();
    assert!(e.to_string().contains("per_pod_env: \"POD_IP=1\""), "{e}");
}
