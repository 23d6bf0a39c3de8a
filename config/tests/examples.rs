//! The examples under config/examples are what operators copy: every Kubernetes
//! manifest must be a valid object of its kind with no field the API does not know, and
//! the containerd drop-in must have the shape containerd 2.1 reads.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use vsnap_config::{RuntimeConfig, DEFAULT_CONFIG_PATH};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

/// The documents of a YAML text.
fn parse_documents(origin: &str, text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .enumerate()
        .map(|(i, doc)| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin} document {i}: {e}"))
        })
        .collect()
}

/// Every document of every YAML file under examples/, with where it came from.
fn documents() -> Vec<(String, Value)> {
    let mut files = Vec::new();
    yaml_files(&examples(), &mut files);
    assert!(!files.is_empty(), "no YAML under {}", examples().display());
    let mut docs = Vec::new();
    for file in files {
        let origin = file.display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, doc) in parse_documents(&origin, &text).into_iter().enumerate() {
            docs.push((format!("{origin} document {i}"), doc));
        }
    }
    docs
}

/// Parses `value` as `T` and serializes it back: k8s-openapi drops fields it does not
/// know, so a misspelled or misplaced field shows up as a difference.
fn round_trip<T: DeserializeOwned + Serialize>(origin: &str, value: &Value) {
    let name = std::any::type_name::<T>();
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{origin}: not a valid {name}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    if let Some(path) = first_difference(value, &back, String::new()) {
        panic!(
            "{origin}: {path} differs after a round trip through {name} \
             (a field the API does not have, or one in the wrong place)"
        );
    }
}

fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(u), Some(v)) => first_difference(u, v, format!("{at}.{k}")),
                _ => Some(format!("{at}.{k}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (u, v))| first_difference(u, v, format!("{at}[{i}]"))),
        _ if a == b => None,
        _ => Some(if at.is_empty() { ".".into() } else { at }),
    }
}

fn check_manifest(origin: &str, doc: &Value) {
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    match (api, doc["kind"].as_str().unwrap_or_default()) {
        ("node.k8s.io/v1", "RuntimeClass") => round_trip::<RuntimeClass>(origin, doc),
        ("v1", "Pod") => round_trip::<Pod>(origin, doc),
        ("v1", "Namespace") => round_trip::<Namespace>(origin, doc),
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(origin, doc),
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(origin, doc),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(origin, doc),
        (api, kind) => panic!("{origin}: {api} {kind}: add its type to this test"),
    }
}

#[test]
fn every_kubernetes_manifest_is_valid_with_no_unknown_field() {
    for (origin, doc) in documents() {
        check_manifest(&origin, &doc);
    }
}

#[test]
fn a_misspelled_or_misplaced_manifest_field_is_caught() {
    for bad in [
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: vsnap}\nhandlr: vsnap\n",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  runtimeClassName: vsnap\n  \
         containers: [{name: c, image: i, hostPID: true}]\n",
    ] {
        let doc = parse_documents("test", bad).remove(0);
        let caught = std::panic::catch_unwind(|| check_manifest("test", &doc));
        assert!(caught.is_err(), "passed the round trip:\n{bad}");
    }
}

/// The keys of a CRI runtime entry in containerd 2.1 (`containerd config dump`);
/// containerd ignores any other key without a word.
const RUNTIME_KEYS: &[&str] = &[
    "runtime_type",
    "runtime_path",
    "pod_annotations",
    "container_annotations",
    "privileged_without_host_devices",
    "privileged_without_host_devices_all_devices_allowed",
    "cgroup_writable",
    "base_runtime_spec",
    "cni_conf_dir",
    "cni_max_conf_num",
    "snapshotter",
    "sandboxer",
    "io_type",
    "options",
];

fn check_drop_in(origin: &str, body: &str) -> toml::Value {
    let config: toml::Value = toml::from_str(body).unwrap_or_else(|e| panic!("{origin}: {e}"));
    assert_eq!(config["version"].as_integer(), Some(3), "{origin}: version");
    let runtime = config
        .get("plugins")
        .and_then(|p| p.get("io.containerd.cri.v1.runtime"))
        .and_then(|p| p.get("containerd"))
        .and_then(|p| p.get("runtimes"))
        .and_then(|p| p.get("vsnap"))
        .and_then(|p| p.as_table())
        .unwrap_or_else(|| {
            panic!(
                "{origin}: no plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.vsnap"
            )
        });
    for key in runtime.keys() {
        assert!(
            RUNTIME_KEYS.contains(&key.as_str()),
            "{origin}: containerd has no runtime key {key:?}"
        );
    }
    assert_eq!(
        runtime["runtime_type"].as_str(),
        Some("io.vsnap.v1"),
        "{origin}"
    );
    for list in ["pod_annotations", "container_annotations"] {
        let allowed: Vec<&str> = runtime[list]
            .as_array()
            .unwrap_or_else(|| panic!("{origin}: {list} is not a list"))
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(
            allowed.contains(&"vsnap.io/*"),
            "{origin}: {list}: {allowed:?}"
        );
    }
    // runtimeoptions.v1.Options, which containerd sends to a runtime that is not runc.
    let options = runtime["options"].as_table().expect("options");
    let keys: Vec<&String> = options.keys().collect();
    assert_eq!(keys, ["ConfigPath"], "{origin}: options");
    assert_eq!(
        options["ConfigPath"].as_str(),
        Some(DEFAULT_CONFIG_PATH),
        "{origin}"
    );
    // A dead shim's delete gets more than containerd's default 5s.
    let cleanup = config
        .get("timeouts")
        .and_then(|t| t.get("io.containerd.timeout.shim.cleanup"))
        .and_then(|v| v.as_str());
    assert_eq!(cleanup, Some("30s"), "{origin}: timeouts");
    config
}

#[test]
fn the_containerd_drop_in_registers_the_vsnap_handler() {
    let path = examples().join("containerd-runtime.toml");
    check_drop_in(
        &path.display().to_string(),
        &std::fs::read_to_string(&path).unwrap(),
    );
}

#[test]
fn the_node_installer_writes_the_example_drop_in_and_a_valid_runtime_config() {
    let path = examples().join("kubernetes/node-installer.yaml");
    let origin = path.display().to_string();
    let map: ConfigMap = parse_documents(&origin, &std::fs::read_to_string(&path).unwrap())
        .into_iter()
        .find(|doc| doc["kind"] == "ConfigMap")
        .map(|doc| serde_json::from_value(doc).unwrap())
        .expect("a ConfigMap");
    let data = map.data.expect("data");
    let installed = check_drop_in(
        &format!("{origin} containerd-vsnap.toml"),
        &data["containerd-vsnap.toml"],
    );
    let example = std::fs::read_to_string(examples().join("containerd-runtime.toml")).unwrap();
    assert_eq!(
        installed,
        toml::from_str::<toml::Value>(&example).unwrap(),
        "the installer's drop-in and config/examples/containerd-runtime.toml differ"
    );
    RuntimeConfig::parse(&data["config.toml"], &format!("{origin} config.toml")).unwrap();
}

#[test]
fn the_node_installer_serves_metrics_on_the_port_its_scrape_annotations_name() {
    let path = examples().join("kubernetes/node-installer.yaml");
    let origin = path.display().to_string();
    let ds: DaemonSet = parse_documents(&origin, &std::fs::read_to_string(&path).unwrap())
        .into_iter()
        .find(|doc| doc["kind"] == "DaemonSet")
        .map(|doc| serde_json::from_value(doc).unwrap())
        .expect("a DaemonSet");
    let template = ds.spec.template;
    let annotations = template.metadata.unwrap().annotations.unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let port: i32 = annotations["prometheus.io/port"].parse().unwrap();
    let metrics = template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .find(|c| c.name == "metrics")
        .expect("a metrics container");
    let ports = metrics.ports.unwrap();
    assert!(
        ports.iter().any(|p| p.container_port == port),
        "containerPort {port}"
    );
    let command = metrics.command.unwrap().join(" ");
    assert!(
        command.ends_with(&format!("metrics --listen 0.0.0.0:{port}")),
        "{command}"
    );
    let mounts = metrics.volume_mounts.unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m.mount_path == "/var/lib/vsnap" && m.read_only != Some(true)),
        "the journal under the artifact root, writable for its lock"
    );
}
