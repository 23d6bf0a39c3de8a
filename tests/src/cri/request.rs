//! What tests hand CRI: the namespace, the images and handlers the instance
//! is set up with, and the configs of containers.

use std::collections::HashMap;

use k8s_cri::v1::*;

/// The containerd namespace of CRI.
pub const NAMESPACE: &str = "k8s.io";
pub const PAUSE_IMAGE: &str = "localhost/vsnap-pause:test";
pub const BUSYBOX_IMAGE: &str = "localhost/vsnap-busybox:cri";
pub const ENGINE_IMAGE: &str = "localhost/vsnap-engine:cri";
/// containerd's runc shim.
pub const RUNC: &str = "runc";
/// `io.vsnap.v1`: the handler of the example config.
pub const VSNAP: &str = "vsnap";
/// The vsnap shim under an `io.containerd.runc.v2`-typed handler.
pub const VSNAP_FEATURES: &str = "vsnap-features";

/// A container config: `image`, `args` as its command, logs to `<name>.log`.
pub fn container_config(name: &str, image: &str, args: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: args.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig::default()),
        ..Default::default()
    }
}

/// `k=v` environment entries for a container config.
pub fn envs(kvs: &[(&str, &str)]) -> Vec<KeyValue> {
    kvs.iter()
        .map(|(k, v)| KeyValue {
            key: k.to_string(),
            value: v.to_string(),
        })
        .collect()
}

/// Annotations as CRI takes them.
pub fn annotations(kvs: &[(&str, &str)]) -> HashMap<String, String> {
    kvs.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
