//! Test root filesystems and images, built from the host's static busybox.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::containerd::Containerd;

pub const IMAGE_REF: &str = "localhost/vsnap-busybox:test";

/// A folder `rootfs` in `dir` holding a busybox root filesystem
/// (`vsnap_busybox_rootfs` of `scripts/lib.sh`).
pub fn busybox_rootfs(dir: &Path) -> PathBuf {
    let root = dir.join("rootfs");
    crate::lib_sh::busybox_rootfs(&root);
    root
}

fn digest(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let mut s = String::from("sha256:");
    for b in d.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn blob(layout: &Path, bytes: &[u8]) -> (String, usize) {
    let d = digest(bytes);
    let path = layout
        .join("blobs/sha256")
        .join(d.trim_start_matches("sha256:"));
    std::fs::write(path, bytes).unwrap();
    (d, bytes.len())
}

/// Imports a one-layer busybox OCI image as [`IMAGE_REF`] into `containerd`.
pub fn import_busybox_image(containerd: &Containerd) {
    let dir = containerd.dir.join("image");
    let root = busybox_rootfs(&dir);
    import_image(containerd, &dir, &root, IMAGE_REF, serde_json::json!({}));
}

/// Imports the folder `root` as a one-layer OCI image `reference` whose
/// config carries `labels`; `work` holds the layout while it is built.
pub fn import_image(
    containerd: &Containerd,
    work: &Path,
    root: &Path,
    reference: &str,
    labels: serde_json::Value,
) {
    let config = serde_json::json!({"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"], "Labels": labels});
    import_image_to(containerd, "default", work, root, reference, config);
}

/// Imports the folder `root` as a one-layer OCI image `reference` with the
/// image config `config` into containerd's `namespace` (CRI uses `k8s.io`).
pub fn import_image_to(
    containerd: &Containerd,
    namespace: &str,
    work: &Path,
    root: &Path,
    reference: &str,
    config: serde_json::Value,
) {
    let layout = work.join("layout");
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    let layer_path = work.join("layer.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(root)
        .arg("--numeric-owner")
        .arg("-cf")
        .arg(&layer_path)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar the layer");
    let layer = std::fs::read(&layer_path).unwrap();
    let (layer_digest, layer_size) = blob(&layout, &layer);
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    });
    let (config_digest, config_size) = blob(&layout, config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = blob(&layout, manifest.to_string().as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest_size,
            "annotations": {"io.containerd.image.name": reference, "org.opencontainers.image.ref.name": "test"},
        }],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let tarball = work.join("image.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success(), "tar the image layout");
    containerd.ctr_ok(&[
        "-n",
        namespace,
        "images",
        "import",
        tarball.to_str().unwrap(),
    ]);
    let images = containerd.ctr_ok(&["-n", namespace, "images", "ls", "-q"]);
    assert!(images.contains(reference), "image imported: {images}");
}
