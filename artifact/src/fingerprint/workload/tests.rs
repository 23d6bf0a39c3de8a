use super::super::testing::{fleet_key, test_key};
use super::*;
use serde_json::json;

#[test]
fn a_shared_fleet_key_fingerprints_alike_on_every_host() {
    let spec = json!({"process": {"args": ["serve", "--api-key", "k1"], "env": ["HF_TOKEN=hf_secret", "MODEL=m"]}, "root": {"path": "rootfs"}});
    // Two hosts: each its own host key, both the fleet's key.
    let (a, host_a) = test_key();
    let (b, host_b) = test_key();
    let on_a = Workload::from_spec(&spec, "/run/vsnap/control", &host_a);
    let on_b = Workload::from_spec(&spec, "/run/vsnap/control", &host_b);
    assert_eq!(on_a.fingerprint_key, "host");
    assert!(!on_a.diff(&on_b).is_empty(), "host keys differ per host");
    let fleet_a = Workload::from_spec(&spec, "/run/vsnap/control", &fleet_key(a.path(), 5));
    let fleet_b = Workload::from_spec(&spec, "/run/vsnap/control", &fleet_key(b.path(), 5));
    assert!(fleet_a.fingerprint_key.starts_with("fleet:"));
    assert_eq!(fleet_a.diff(&fleet_b), Vec::<String>::new());
    assert_eq!(fleet_a.key(), fleet_b.key(), "auto names agree");
    assert_ne!(fleet_a.key(), on_a.key());
    // One host's manifest JSON is as before fleets.
    let text = serde_json::to_string(&on_a).unwrap();
    assert!(!text.contains("fingerprint_key"), "{text}");
    let back: Workload = serde_json::from_str(&text).unwrap();
    assert_eq!(back, on_a);
}

#[test]
fn another_fingerprint_key_is_named_not_every_value() {
    let spec = json!({"process": {"args": ["serve", "--api-key", "k1"], "env": ["HF_TOKEN=hf_secret", "MODEL=m"]}, "root": {"path": "rootfs"}});
    let (dir, host) = test_key();
    let fleet = fleet_key(dir.path(), 5);
    let captured = Workload::from_spec(&spec, "/run/vsnap/control", &fleet);
    let live = Workload::from_spec(&spec, "/run/vsnap/control", &host);
    let diff = captured.diff(&live);
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(
        diff[0].starts_with(&format!(
            "workload.fingerprint_key: captured \"{}\", live \"host\"",
            captured.fingerprint_key
        )),
        "{diff:?}"
    );
    assert!(diff[0].contains("fleet_fingerprint_key"), "{diff:?}");
    // Another fleet key, and a real difference beside it: both named.
    let mut other = spec.clone();
    other["process"]["env"] = json!(["HF_TOKEN=hf_secret", "MODEL=m", "EXTRA=1"]);
    other["root"]["path"] = json!("/elsewhere");
    let live = Workload::from_spec(&other, "/run/vsnap/control", &fleet_key(dir.path(), 6));
    let fields: Vec<&str> = captured
        .diff(&live)
        .iter()
        .map(|d| d.split(':').next().unwrap())
        .map(|f| match f {
            "workload.fingerprint_key" => "key",
            "workload.env.EXTRA" => "env",
            "workload.rootfs" => "rootfs",
            _ => "other",
        })
        .collect();
    assert_eq!(fields, ["key", "env", "rootfs"]);
}

#[test]
fn env_is_fingerprinted_never_stored() {
    let spec = json!({"process": {"args": ["x"], "env": ["HF_TOKEN=hf_secret", "VSNAP_SNAPSHOT_CONFIG={}"]}, "root": {"path": "rootfs"}});
    let (_d, key) = test_key();
    let w = Workload::from_spec(&spec, "/run/vsnap/control", &key);
    let text = serde_json::to_string(&w).unwrap();
    assert!(!text.contains("hf_secret"), "{text}");
    assert_eq!(w.env.len(), 1, "vsnap's own variable is not identity");
    assert_eq!(
        w.env["HF_TOKEN"],
        env_fingerprint(&key, "HF_TOKEN", "hf_secret")
    );
    let mut unkeyed = <Sha256 as Digest>::new();
    unkeyed.update(b"HF_TOKEN\0hf_secret");
    assert_ne!(
        w.env["HF_TOKEN"],
        hex(&unkeyed.finalize()),
        "keyed, not a bare sha256"
    );
}

#[test]
fn every_security_field_change_is_named() {
    let (_d, key) = test_key();
    let base = json!({
        "process": {"args": ["x"], "user": {"uid": 1000, "gid": 1000}, "capabilities": {"bounding": []}, "noNewPrivileges": true},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/run/vsnap/control", "source": "/a"}],
        "linux": {"namespaces": [{"type": "pid"}]},
    });
    let captured = Workload::from_spec(&base, "/run/vsnap/control", &key);
    let mut same = base.clone();
    same["mounts"][0]["source"] = json!("/b");
    assert!(
        captured
            .diff(&Workload::from_spec(&same, "/run/vsnap/control", &key))
            .is_empty(),
        "the control mount is not identity"
    );
    // A bind's source may differ; its destination, type and options may not.
    let mut with_shm = base.clone();
    with_shm["mounts"] = json!([{"destination": "/dev/shm", "type": "bind", "source": "/pod-a", "options": ["rbind", "rw"]}]);
    let shm = Workload::from_spec(&with_shm, "/run/vsnap/control", &key);
    let mut other_pod = with_shm.clone();
    other_pod["mounts"][0]["source"] = json!("/pod-b");
    assert!(shm
        .diff(&Workload::from_spec(&other_pod, "/run/vsnap/control", &key))
        .is_empty());
    let mut read_only = with_shm.clone();
    read_only["mounts"][0]["options"] = json!(["rbind", "ro"]);
    let diff = shm.diff(&Workload::from_spec(&read_only, "/run/vsnap/control", &key));
    assert_eq!(diff, ["workload.security.mounts: /dev/shm: rw -> ro"]);
    for (path, value, field) in [
        (
            &["process", "user"][..],
            json!({"uid": 0, "gid": 1000}),
            "workload.security.user",
        ),
        (
            &["process", "capabilities"],
            json!({"bounding": ["CAP_SYS_ADMIN"]}),
            "workload.security.capabilities",
        ),
        (
            &["process", "noNewPrivileges"],
            json!(false),
            "workload.security.no_new_privileges",
        ),
        (
            &["linux", "seccomp"],
            json!({"defaultAction": "SCMP_ACT_ALLOW"}),
            "workload.security.seccomp",
        ),
        (&["process", "args"], json!(["y"]), "workload.argv"),
        (&["root", "path"], json!("/other"), "workload.rootfs"),
    ] {
        let mut live = base.clone();
        let mut slot = &mut live;
        for p in &path[..path.len() - 1] {
            slot = &mut slot[*p];
        }
        slot[path[path.len() - 1]] = value;
        let diff = captured.diff(&Workload::from_spec(&live, "/run/vsnap/control", &key));
        assert_eq!(diff.len(), 1, "{field}: {diff:?}");
        assert!(diff[0].starts_with(field), "{field}: {diff:?}");
    }
    // What changed is readable (the seccomp profile is a digest).
    let mut live = base.clone();
    live["process"]["user"]["uid"] = json!(0);
    let diff = captured.diff(&Workload::from_spec(&live, "/run/vsnap/control", &key));
    assert_eq!(diff, ["workload.security.user.uid: captured 1000, live 0"]);
    assert!(captured.security["seccomp"].starts_with("sha256:"));
}

/// A spec as containerd's defaults make one, with ctr's default
/// capabilities, its usual mounts, and `extra` set at `path`.
fn spec_with(path: &[&str], extra: Value) -> Value {
    let caps = json!([
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE"
    ]);
    let mut spec = json!({
        "process": {"args": ["serve", "--api-key", "k1"], "capabilities": {"bounding": caps, "effective": caps, "permitted": caps}},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/data", "type": "bind", "source": "/host/data", "options": ["rbind", "rw"]},
            {"destination": "/run/vsnap/control", "type": "bind", "source": "/x", "options": ["rbind", "ro"]},
        ],
        "linux": {
            "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "maskedPaths": ["/proc/kcore", "/proc/keys"],
            "readonlyPaths": ["/proc/sys"],
        },
    });
    let mut slot = &mut spec;
    for p in path {
        slot = &mut slot[*p];
    }
    *slot = extra;
    spec
}

#[test]
fn list_differences_are_named_by_element_whole() {
    let (_d, key) = test_key();
    let from = |spec: &Value| Workload::from_spec(spec, "/run/vsnap/control", &key);
    let captured = from(&spec_with(&["annotations"], json!({})));
    let mut live = spec_with(&["annotations"], json!({}));
    for set in ["bounding", "effective", "permitted"] {
        live["process"]["capabilities"][set]
            .as_array_mut()
            .unwrap()
            .push(json!("CAP_NET_ADMIN"));
    }
    live["process"]["capabilities"]["effective"]
        .as_array_mut()
        .unwrap()
        .retain(|c| c != "CAP_KILL");
    live["mounts"][2]["options"] = json!(["rbind", "ro"]);
    live["mounts"][2]["source"] = json!("/elsewhere");
    live["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/models", "type": "bind", "source": "/m", "options": ["rbind", "ro"]}));
    live["linux"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}));
    live["linux"]["resources"]["devices"] = json!([]);
    live["linux"]["maskedPaths"] = json!(["/proc/kcore"]);
    live["linux"]["readonlyPaths"] = json!(["/proc/sys", "/proc/bus"]);
    assert_eq!(
        captured.diff(&from(&live)),
        [
            "workload.security.capabilities.bounding: live adds CAP_NET_ADMIN",
            "workload.security.capabilities.effective: live adds CAP_NET_ADMIN and drops CAP_KILL",
            "workload.security.capabilities.permitted: live adds CAP_NET_ADMIN",
            "workload.security.devices.cgroup: live drops {access: rwm, allow: false}",
            "workload.security.devices.nodes: live adds /dev/nvidia1 (major 195, minor 1, type c)",
            "workload.security.masked_paths.masked: live drops /proc/keys",
            "workload.security.masked_paths.readonly: live adds /proc/bus",
            "workload.security.mounts: /data: rw -> ro",
            "workload.security.mounts: live adds /models (options [rbind, ro], type bind)",
        ]
    );
    // Taken away whole, a field is named with its whole value.
    let no_caps = spec_with(&["process", "capabilities"], Value::Null);
    let diff = captured.diff(&from(&no_caps));
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(
        diff[0]
            .starts_with("workload.security.capabilities: captured {\"bounding\":[\"CAP_CHOWN\"")
            && diff[0].ends_with("\"CAP_AUDIT_WRITE\"]}, live null"),
        "{diff:?}"
    );
}

#[test]
fn a_difference_never_shows_a_secret() {
    let (_d, key) = test_key();
    let from = |spec: &Value| Workload::from_spec(spec, "/run/vsnap/control", &key);
    let captured = from(&spec_with(&["process", "env"], json!(["HF_TOKEN=hf_one"])));
    let mut live = spec_with(&["process", "env"], json!(["HF_TOKEN=hf_two"]));
    live["process"]["args"] = json!(["serve", "--api-key", "k2", "--port", "8001"]);
    let diff = captured.diff(&from(&live));
    assert_eq!(diff.len(), 2, "{diff:?}");
    let text = diff.join("; ");
    for secret in ["hf_one", "hf_two", "k1", "k2"] {
        assert!(!text.contains(secret), "{secret}: {text}");
    }
    // argv whole, its secret as the keyed tag; env by its fingerprints.
    let tag = |v: &str| format!("***:{}", &key.mac(v.as_bytes())[..16]);
    assert_eq!(
        diff[0],
        format!(
            "workload.argv: captured [\"serve\",\"--api-key\",\"{}\"], live [\"serve\",\"--api-key\",\"{}\",\"--port\",\"8001\"]",
            tag("k1"),
            tag("k2")
        )
    );
    assert_eq!(
        diff[1],
        format!(
            "workload.env.HF_TOKEN: captured \"{}\", live \"{}\"",
            env_fingerprint(&key, "HF_TOKEN", "hf_one"),
            env_fingerprint(&key, "HF_TOKEN", "hf_two")
        )
    );
}

#[test]
fn a_field_recorded_as_a_digest_is_named_by_its_digests() {
    let (_d, key) = test_key();
    let from = |spec: &Value| Workload::from_spec(spec, "/run/vsnap/control", &key);
    let seccomp = |action: &str| spec_with(&["linux", "seccomp"], json!({"defaultAction": action}));
    let (a, b) = (
        from(&seccomp("SCMP_ACT_ERRNO")),
        from(&seccomp("SCMP_ACT_ALLOW")),
    );
    assert_eq!(
        a.diff(&b),
        [format!(
            "workload.security.seccomp: captured \"{}\", live \"{}\"",
            a.security["seccomp"], b.security["seccomp"]
        )]
    );
}

#[test]
fn the_tenant_keys_auto_names_and_is_left_to_the_policy_in_a_diff() {
    let (_d, key) = test_key();
    let spec = json!({"process": {"args": ["x"]}, "root": {"path": "rootfs"}});
    let base = Workload::from_spec(&spec, "/run/vsnap/control", &key);
    let tenant = |t: &str| base.clone().with_tenant(&Tenant::parse(t).unwrap());
    let (a, b, plain) = (
        tenant("k8s.io/team-a"),
        tenant("k8s.io/team-b"),
        tenant("k8s.io"),
    );
    assert_eq!(a.tenant().to_string(), "k8s.io/team-a");
    assert_ne!(a.key(), b.key(), "two tenants' auto names never meet");
    assert_ne!(a.key(), plain.key());
    assert!(a.diff(&b).is_empty(), "the tenant policy compares owners");
    // A container without CRI serializes as before tenants: its auto
    // name is the one it had.
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json.get("kubernetes_namespace").is_none(), "{json}");
    assert_eq!(json["namespace"], "k8s.io");
    // A manifest from before tenants: the containerd namespace alone.
    let old: Workload = serde_json::from_value(json).unwrap();
    assert_eq!(old.tenant(), Tenant::parse("k8s.io").unwrap());
    let json = serde_json::to_value(&a).unwrap();
    assert_eq!(json["kubernetes_namespace"], "team-a");
}

/// Two pods of one Deployment: each its own HOSTNAME (CRI, dockerd) and
/// the downward API's POD_NAME and POD_IP, named per pod by annotation.
fn pod_spec(pod: &str, ip: &str, per_pod: Option<&str>) -> Value {
    let mut spec = json!({"process": {"args": ["serve"], "env": [
        format!("HOSTNAME={pod}"), format!("POD_NAME={pod}"), format!("POD_IP={ip}"), "MODEL=m",
    ]}, "root": {"path": "rootfs"}, "annotations": {}});
    if let Some(names) = per_pod {
        spec["annotations"][per_pod::ANNOTATION] = json!(names);
    }
    spec
}

#[test]
fn what_each_pod_is_given_is_not_the_workload() {
    let (_d, key) = test_key();
    let w = |pod, ip, names| Workload::from_spec(&pod_spec(pod, ip, names), "/c", &key);
    // HOSTNAME alone is always the pod's: the other two still differ.
    let (a, b) = (
        w("vllm-7d9f8-abcde", "10.1.0.2", None),
        w("vllm-7d9f8-xyz12", "10.1.0.3", None),
    );
    assert_eq!(a.per_pod_env, ["HOSTNAME"]);
    let fields: Vec<String> = a
        .diff(&b)
        .iter()
        .map(|d| d.split(':').next().unwrap().to_string())
        .collect();
    assert_eq!(fields, ["workload.env.POD_IP", "workload.env.POD_NAME"]);
    // Named per pod: one workload, one `auto` name; MODEL still compared.
    let names = Some("POD_NAME,POD_IP");
    let (a, b) = (
        w("vllm-7d9f8-abcde", "10.1.0.2", names),
        w("vllm-7d9f8-xyz12", "10.1.0.3", names),
    );
    assert_eq!(a.per_pod_env, ["HOSTNAME", "POD_IP", "POD_NAME"]);
    // Still fingerprinted (a format 5 manifest compares them), not compared.
    assert!(a.env.contains_key("POD_IP") && a.env.contains_key("MODEL"));
    assert_eq!(a.diff(&b), Vec::<String>::new());
    assert_eq!(a.key(), b.key(), "one auto name for the Deployment");
    let mut other_model = pod_spec("vllm-7d9f8-xyz12", "10.1.0.3", names);
    other_model["process"]["env"][3] = json!("MODEL=n");
    let diff = a.diff(&Workload::from_spec(&other_model, "/c", &key));
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(diff[0].starts_with("workload.env.MODEL:"), "{diff:?}");
    // Another list is another workload, named by the list.
    let c = w("vllm-7d9f8-xyz12", "10.1.0.3", Some("POD_NAME"));
    assert!(
        a.diff(&c)
            .iter()
            .any(|d| d.starts_with("workload.per_pod_env:")),
        "{:?}",
        a.diff(&c)
    );
    assert_ne!(a.key(), c.key());
    // The runtime config's names join the annotation's.
    let d = w("p", "10.1.0.4", Some("POD_NAME")).with_per_pod_env(["POD_IP"]);
    assert_eq!(d.per_pod_env, a.per_pod_env);
    assert_eq!(a.diff(&d), Vec::<String>::new());
}

#[test]
fn a_manifest_from_before_per_pod_names_compares_every_variable() {
    let (_d, key) = test_key();
    // Format 5: no list, every variable fingerprinted and compared.
    let mut legacy = Workload::from_spec(&pod_spec("donor", "10.1.0.2", None), "/c", &key);
    legacy.per_pod_env.clear();
    let text = serde_json::to_string(&legacy).unwrap();
    assert!(!text.contains("per_pod_env"), "{text}");
    // Its twin (the same hostname, as a host-network pod has) restores.
    let twin = Workload::from_spec(&pod_spec("donor", "10.1.0.2", None), "/c", &key);
    assert_eq!(legacy.diff(&twin), Vec::<String>::new());
    // Another pod is another workload to it, named by the variable.
    let other = Workload::from_spec(&pod_spec("copy", "10.1.0.2", Some("POD_NAME")), "/c", &key);
    let diff = legacy.diff(&other);
    assert_eq!(diff.len(), 2, "{diff:?}");
    assert!(diff[0].starts_with("workload.env.HOSTNAME:"), "{diff:?}");
    assert!(diff[1].starts_with("workload.env.POD_NAME:"), "{diff:?}");
}
