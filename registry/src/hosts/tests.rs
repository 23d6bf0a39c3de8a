//! containerd's host resolution, as pure logic: folders, file order,
//! capabilities, paths, TLS settings, and where credentials may go.

use super::*;

const REG: &str = "registry.test:5000";

fn write(dir: &Path, rel: &str, text: &str) -> PathBuf {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

fn parsed(text: &str) -> Vec<Endpoint> {
    parse(
        REG,
        Path::new("/etc/hosts.d/registry.test:5000"),
        text,
        false,
    )
    .unwrap()
}

fn names(hosts: &[&Endpoint]) -> Vec<String> {
    hosts.iter().map(|e| e.name()).collect()
}

fn hosts_of(text: &str) -> Hosts {
    Hosts {
        registry: REG.into(),
        source: Some("/x/hosts.toml".into()),
        endpoints: parsed(text),
    }
}

#[test]
fn a_port_is_looked_for_as_containerd_spells_it_then_as_written_then_default() {
    assert_eq!(
        dir_names("registry.test:5000"),
        ["registry.test_5000_", "registry.test:5000", "_default"]
    );
    assert_eq!(dir_names("registry.test"), ["registry.test", "_default"]);
    assert_eq!(
        dir_names("[::1]:5000"),
        ["[::1]_5000_", "[::1]:5000", "_default"]
    );
}

#[test]
fn the_first_root_with_any_matching_folder_wins_default_included() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let roots = vec![a.clone(), b.clone()];
    assert_eq!(find_dir(&roots, REG).unwrap(), None);
    std::fs::create_dir_all(b.join("registry.test:5000")).unwrap();
    assert_eq!(
        find_dir(&roots, REG).unwrap(),
        Some(b.join("registry.test:5000"))
    );
    // containerd searches one root completely (its _default included)
    // before the next.
    std::fs::create_dir_all(a.join("_default")).unwrap();
    assert_eq!(find_dir(&roots, REG).unwrap(), Some(a.join("_default")));
    std::fs::create_dir_all(a.join("registry.test:5000")).unwrap();
    assert_eq!(
        find_dir(&roots, REG).unwrap(),
        Some(a.join("registry.test:5000"))
    );
    std::fs::create_dir_all(a.join("registry.test_5000_")).unwrap();
    assert_eq!(
        find_dir(&roots, REG).unwrap(),
        Some(a.join("registry.test_5000_"))
    );
    // Another port is another registry: only _default applies to it.
    assert_eq!(
        find_dir(&roots, "registry.test:5001").unwrap(),
        Some(a.join("_default"))
    );
}

#[test]
fn a_config_path_is_a_colon_separated_list() {
    assert_eq!(
        roots("/etc/containerd/certs.d::/run/m:"),
        [
            PathBuf::from("/etc/containerd/certs.d"),
            PathBuf::from("/run/m")
        ]
    );
    assert!(roots("").is_empty());
}

#[test]
fn without_a_folder_the_registry_alone_serves_everything() {
    let t = tempfile::tempdir().unwrap();
    let hosts = load(REG, &[t.path().to_path_buf()], false).unwrap();
    assert_eq!(hosts.source, None);
    assert_eq!(hosts.endpoints.len(), 1);
    let o = &hosts.endpoints[0];
    assert_eq!(
        o.url("fleet/m", "manifests/v1"),
        "https://registry.test:5000/v2/fleet/m/manifests/v1"
    );
    assert!(o.origin && o.capabilities == Capabilities::ALL);
    assert_eq!(hosts.namespace(o), None);
    assert!(hosts.sends_credentials(o));
    let plain = load(REG, &[], true).unwrap();
    assert_eq!(plain.endpoints[0].name(), "http://registry.test:5000");
}

#[test]
fn mirrors_come_in_file_order_and_the_origin_last() {
    let e = parsed(
        "[host.\"https://zeta.test\"]\ncapabilities = [\"pull\", \"resolve\"]\n\
         [host.\"http://alpha.test:30020\"]\ncapabilities = [\"pull\"]\n\
         [host.\"mid.test\"]\n",
    );
    let all: Vec<String> = e.iter().map(|e| e.name()).collect();
    assert_eq!(
        all,
        [
            "https://zeta.test",
            "http://alpha.test:30020",
            "https://mid.test",
            "https://registry.test:5000"
        ]
    );
    assert_eq!(e.iter().filter(|e| e.origin).count(), 1);
    assert!(e[3].origin, "the registry itself is the last host");
    assert_eq!(
        e[2].capabilities,
        Capabilities::ALL,
        "no list: every capability"
    );
}

#[test]
fn server_replaces_the_registry_as_the_origin_with_the_root_settings() {
    let e = parsed(
        "server = \"https://upstream.test:8443\"\ncapabilities = [\"pull\", \"resolve\"]\n\
         skip_verify = true\n[host.\"https://m.test\"]\n",
    );
    let o = e.last().unwrap();
    assert_eq!(o.name(), "https://upstream.test:8443");
    assert!(o.origin && o.skip_verify);
    assert!(!o.capabilities.push);
    assert!(!e[0].skip_verify, "root settings are the origin's only");
    // Without server the root settings still go to the registry itself,
    // which keeps every capability.
    let e = parsed("capabilities = [\"pull\"]\nskip_verify = true\n");
    assert!(e[0].skip_verify && e[0].capabilities == Capabilities::ALL);
    // A server named without scheme is HTTPS; vsnap's plain_http is for
    // the registry itself only.
    let e = parse(REG, Path::new("/d"), "server = \"upstream.test\"\n", true).unwrap();
    assert_eq!(e[0].name(), "https://upstream.test");
    let e = parse(REG, Path::new("/d"), "[host.\"http://m.test\"]\n", true).unwrap();
    assert_eq!(e[1].name(), "http://registry.test:5000");
}

#[test]
fn capabilities_decide_which_hosts_are_asked() {
    let h = hosts_of(
        "[host.\"https://public.test\"]\ncapabilities = [\"pull\"]\n\
         [host.\"https://private.test\"]\ncapabilities = [\"pull\", \"resolve\"]\n\
         [host.\"https://writer.test\"]\ncapabilities = [\"push\"]\n",
    );
    let ask = |n| names(&h.for_need(n).unwrap());
    // A tag is resolved only where resolve is trusted.
    assert_eq!(
        ask(Need::Resolve),
        ["https://private.test", "https://registry.test:5000"]
    );
    // Content by digest from any host that pulls.
    assert_eq!(
        ask(Need::Pull),
        [
            "https://public.test",
            "https://private.test",
            "https://registry.test:5000"
        ]
    );
    // A push goes to one host: the first that may push.
    assert_eq!(ask(Need::Push), ["https://writer.test"]);
    let h = hosts_of("[host.\"https://m.test\"]\ncapabilities = [\"pull\", \"resolve\"]\n");
    assert_eq!(
        names(&h.for_need(Need::Push).unwrap()),
        ["https://registry.test:5000"]
    );
    // Case does not matter; referrers is known (and unused); others fail.
    let e = parsed("[host.\"https://m.test\"]\ncapabilities = [\"PULL\", \"referrers\"]\n");
    assert!(e[0].capabilities.pull && !e[0].capabilities.resolve);
    let err = parse(
        REG,
        Path::new("/d"),
        "[host.\"https://m.test\"]\ncapabilities = [\"fetch\"]\n",
        false,
    )
    .unwrap_err();
    assert!(
        err.contains("host.\"https://m.test\": capabilities: unknown capability \"fetch\""),
        "{err}"
    );
}

#[test]
fn an_origin_that_may_not_push_leaves_no_push_host() {
    let h = hosts_of("server = \"https://m.test\"\ncapabilities = [\"pull\", \"resolve\"]\n");
    let err = h.for_need(Need::Push).unwrap_err();
    assert_eq!(
        err,
        "no host of registry.test:5000 (/x/hosts.toml) may push"
    );
}

#[test]
fn credentials_go_to_the_registry_itself_never_to_a_mirror() {
    let h = hosts_of(
        "[host.\"http://127.0.0.1:30020\"]\n[host.\"https://registry.test:5000\"]\n\
         capabilities = [\"pull\"]\n",
    );
    let [mirror, itself, origin] = &h.endpoints[..] else {
        panic!("{:?}", h.endpoints)
    };
    assert!(!h.sends_credentials(mirror));
    assert!(
        h.sends_credentials(itself),
        "a host section naming the registry is the registry"
    );
    assert!(h.sends_credentials(origin));
    // A server elsewhere (a mirror as the only host) gets none either.
    let h = hosts_of("server = \"https://m.test\"\n");
    assert!(!h.sends_credentials(&h.endpoints[0]));
    // A mirror is told which registry it serves.
    let h = hosts_of("[host.\"http://127.0.0.1:30020\"]\n");
    assert_eq!(h.namespace(&h.endpoints[0]), Some(REG));
    assert_eq!(h.namespace(&h.endpoints[1]), None);
}

#[test]
fn paths_get_v2_unless_they_end_so_or_override_path_says() {
    let e = parsed(
        "[host.\"https://a.test\"]\n[host.\"https://b.test/prefix/\"]\n\
         [host.\"https://c.test/x/v2\"]\n\
         [host.\"https://d.test/v2/upstream\"]\noverride_path = true\n\
         [host.\"https://e.test\"]\noverride_path = true\n\
         [host.\"https://f.test/a/./b/../c\"]\n",
    );
    let paths: Vec<&str> = e.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v2",
            "/prefix/v2",
            "/x/v2",
            "/v2/upstream",
            "",
            "/a/c/v2",
            "/v2"
        ]
    );
    assert_eq!(
        e[3].url("fleet/m", "manifests/v1"),
        "https://d.test/v2/upstream/fleet/m/manifests/v1"
    );
    assert_eq!(
        e[4].url("fleet/m", "blobs/uploads/"),
        "https://e.test/fleet/m/blobs/uploads/"
    );
    assert_eq!(e[1].root(), "https://b.test/prefix/v2/");
    assert_eq!(e[4].root(), "https://e.test/");
}

#[test]
fn tls_files_are_taken_against_the_files_folder() {
    let e = parse(
        REG,
        Path::new("/etc/certs.d/registry.test:5000"),
        "ca = \"root.pem\"\nclient = \"/abs/both.pem\"\n\
         [host.\"https://m.test\"]\nca = [\"a.pem\", \"/abs/b.pem\"]\n\
         client = [[\"c.cert\", \"c.key\"], [\"d.pem\", \"\"], \"e.pem\"]\n",
        false,
    )
    .unwrap();
    let d = Path::new("/etc/certs.d/registry.test:5000");
    assert_eq!(e[0].ca, [d.join("a.pem"), PathBuf::from("/abs/b.pem")]);
    assert_eq!(
        e[0].client,
        [
            (d.join("c.cert"), Some(d.join("c.key"))),
            (d.join("d.pem"), None),
            (d.join("e.pem"), None)
        ]
    );
    assert_eq!(e[1].ca, [d.join("root.pem")]);
    assert_eq!(e[1].client, [(PathBuf::from("/abs/both.pem"), None)]);
    for (bad, named) in [
        ("ca = 1\n", "ca: must be a string or a list of strings"),
        ("client = [[\"a\"]]\n", "client: must be a path"),
        ("client = true\n", "client: must be a path"),
    ] {
        let err = parse(REG, d, bad, false).unwrap_err();
        assert!(err.contains(named), "{bad}: {err}");
    }
}

#[test]
fn headers_dial_timeouts_and_unknown_keys() {
    let e = parsed(
        "some_future_key = 1\n[host.\"http://dragonfly.test:4001\"]\ncapabilities = [\"pull\", \"resolve\"]\n\
         dial_timeout = \"1m30s\"\n\
         [host.\"http://dragonfly.test:4001\".header]\nX-Dragonfly-Registry = \"https://registry.test:5000\"\n\
         x-multi = [\"a\", \"b\"]\n",
    );
    assert_eq!(e.len(), 2, "a header table is not a host");
    let mut header = e[0].header.clone();
    header.sort();
    assert_eq!(
        header,
        [
            (
                "X-Dragonfly-Registry".to_string(),
                vec!["https://registry.test:5000".to_string()]
            ),
            (
                "x-multi".to_string(),
                vec!["a".to_string(), "b".to_string()]
            )
        ]
    );
    assert_eq!(e[0].dial_timeout, Some(Duration::from_secs(90)));
    assert_eq!(go_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(go_duration("1.5s").unwrap(), Duration::from_millis(1500));
    assert!(go_duration("5").is_err() && go_duration("5x").is_err() && go_duration("").is_err());
    let err = parse(REG, Path::new("/d"), "dial_timeout = \"soon\"\n", false).unwrap_err();
    assert!(err.contains("dial_timeout \"soon\""), "{err}");
}

#[test]
fn a_url_with_credentials_is_refused_without_showing_them() {
    let err = parse(
        REG,
        Path::new("/d"),
        "[host.\"https://u:hunter2@m.test\"]\n",
        false,
    )
    .unwrap_err();
    assert!(err.contains("credentials"), "{err}");
    let err = parse(REG, Path::new("/d"), "server = \"ftp://m.test\"\n", false).unwrap_err();
    assert!(err.contains("server: scheme \"ftp\""), "{err}");
}

#[test]
fn a_broken_hosts_toml_fails_naming_the_file() {
    let t = tempfile::tempdir().unwrap();
    let file = write(
        t.path(),
        "_default/hosts.toml",
        "[host.\"https://m.test\"\n",
    );
    let err = load(REG, &[t.path().to_path_buf()], false).unwrap_err();
    assert!(
        err.starts_with(&format!("hosts.toml {}: ", file.display())),
        "{err}"
    );
}

#[test]
fn a_folder_without_hosts_toml_gives_the_origin_its_certificate_files() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("registry.test_5000_");
    for name in [
        "ca.crt",
        "b.crt",
        "me.cert",
        "me.key",
        "other.cert",
        "notes.txt",
    ] {
        write(&dir, name, "x");
    }
    let hosts = load(REG, &[t.path().to_path_buf()], false).unwrap();
    assert_eq!(hosts.source.as_deref(), Some(dir.as_path()));
    let [o] = &hosts.endpoints[..] else {
        panic!("{:?}", hosts.endpoints)
    };
    assert!(o.origin);
    assert_eq!(o.ca, [dir.join("b.crt"), dir.join("ca.crt")]);
    assert_eq!(
        o.client,
        [
            (dir.join("me.cert"), Some(dir.join("me.key"))),
            (dir.join("other.cert"), None)
        ]
    );
    // An empty hosts.toml counts as none (containerd reads it so).
    write(&dir, "hosts.toml", "");
    assert_eq!(
        load(REG, &[t.path().to_path_buf()], false)
            .unwrap()
            .endpoints
            .len(),
        1
    );
    // A hosts.toml is read from the folder found, mirrors and all.
    let file = write(&dir, "hosts.toml", "[host.\"http://127.0.0.1:30020\"]\n");
    let hosts = load(REG, &[t.path().to_path_buf()], false).unwrap();
    assert_eq!(hosts.source, Some(file));
    assert_eq!(
        names(&hosts.for_need(Need::Resolve).unwrap()),
        ["http://127.0.0.1:30020", "https://registry.test:5000"]
    );
}

#[test]
fn one_host_is_one_name_and_port_whatever_the_spelling() {
    assert!(same_host("https", "Registry.Test", "registry.test:443"));
    assert!(same_host("http", "registry.test:80", "registry.test"));
    assert!(!same_host("https", "registry.test:5000", "registry.test"));
    assert!(!same_host("https", "registry.test", "mirror.test"));
    // A reference naming the default port is the registry its URL reaches.
    let h = Hosts {
        registry: "registry.test:443".into(),
        source: None,
        endpoints: parse(
            "registry.test:443",
            Path::new("/d"),
            "server = \"https://REGISTRY.test\"\n",
            false,
        )
        .unwrap(),
    };
    assert!(h.sends_credentials(&h.endpoints[0]));
    assert_eq!(h.namespace(&h.endpoints[0]), None);
}
