//! The lower-precedence sources of `vsnap.io/` settings, read from containerd
//! over its API: the container's labels, then its image's config labels (so
//! an image author can opt in). OCI annotations, which the shim reads from
//! the spec, win over both. This is an edge: protobuf stays here.

use std::collections::HashMap;
use std::time::Duration;

use containerd_client::services::v1::{
    containers_client::ContainersClient, content_client::ContentClient,
    images_client::ImagesClient, GetContainerRequest, GetImageRequest, ReadContentRequest,
};
use containerd_client::tonic::transport::Channel;
use containerd_client::tonic::Request;
use containerd_client::with_namespace;
use serde_json::Value;

const PREFIX: &str = "vsnap.io/";
/// containerd answers locally; anything slower is a problem to report, not wait on.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Manifests and image configs are small; refuse to buffer anything larger.
const MAX_BLOB: usize = 4 << 20;

/// `vsnap.io/` keys from the container's labels over its image's labels.
pub async fn vsnap_labels(
    address: &str,
    namespace: &str,
    id: &str,
) -> Result<HashMap<String, String>, String> {
    tokio::time::timeout(TIMEOUT, lookup(address, namespace, id))
        .await
        .map_err(|_| format!("containerd did not answer within {TIMEOUT:?}"))?
}

async fn lookup(address: &str, ns: &str, id: &str) -> Result<HashMap<String, String>, String> {
    let (channel, container) = container(address, ns, id).await?;
    let mut labels = HashMap::new();
    if !container.image.is_empty() {
        labels.extend(image_labels(&channel, ns, &container.image).await?);
    }
    labels.extend(vsnap_only(container.labels));
    Ok(labels)
}

async fn container(
    address: &str,
    ns: &str,
    id: &str,
) -> Result<(Channel, containerd_client::services::v1::Container), String> {
    let address = address.trim_start_matches("unix://");
    let channel = containerd_client::connect(address)
        .await
        .map_err(|e| format!("connect {address}: {e}"))?;
    let request = GetContainerRequest { id: id.to_string() };
    let container = ContainersClient::new(channel.clone())
        .get(with_namespace!(request, ns))
        .await
        .map_err(|e| format!("get container {id}: {}", e.message()))?
        .into_inner()
        .container
        .ok_or_else(|| format!("container {id} not found"))?;
    Ok((channel, container))
}

/// The digest of the container's image (its index or manifest), or `None`
/// for a container without an image (`ctr run --rootfs`).
pub async fn image_digest(address: &str, ns: &str, id: &str) -> Result<Option<String>, String> {
    let find = async {
        let (channel, container) = container(address, ns, id).await?;
        if container.image.is_empty() {
            return Ok(None);
        }
        let request = GetImageRequest {
            name: container.image.clone(),
        };
        let image = ImagesClient::new(channel)
            .get(with_namespace!(request, ns))
            .await
            .map_err(|e| format!("get image {}: {}", container.image, e.message()))?
            .into_inner()
            .image;
        Ok(image.and_then(|i| i.target).map(|t| t.digest))
    };
    tokio::time::timeout(TIMEOUT, find)
        .await
        .map_err(|_| format!("containerd did not answer within {TIMEOUT:?}"))?
}

async fn image_labels(
    channel: &Channel,
    ns: &str,
    name: &str,
) -> Result<HashMap<String, String>, String> {
    let request = GetImageRequest {
        name: name.to_string(),
    };
    let image = ImagesClient::new(channel.clone())
        .get(with_namespace!(request, ns))
        .await
        .map_err(|e| format!("get image {name}: {}", e.message()))?
        .into_inner()
        .image
        .ok_or_else(|| format!("image {name} not found"))?;
    let target = image
        .target
        .ok_or_else(|| format!("image {name} has no target"))?;
    let mut doc = read_json(channel, ns, &target.digest).await?;
    // An index: take the linux/amd64 manifest (else the first).
    if let Some(manifests) = doc["manifests"].as_array() {
        let pick = manifests
            .iter()
            .find(|m| {
                m["platform"]["os"] == "linux"
                    && m["platform"]["architecture"]
                        == std::env::consts::ARCH.replace("x86_64", "amd64").as_str()
            })
            .or_else(|| manifests.first())
            .ok_or_else(|| format!("image {name}: empty index"))?;
        let digest = pick["digest"].as_str().unwrap_or_default().to_string();
        doc = read_json(channel, ns, &digest).await?;
    }
    let config = doc["config"]["digest"]
        .as_str()
        .ok_or_else(|| format!("image {name}: manifest has no config"))?
        .to_string();
    let config = read_json(channel, ns, &config).await?;
    let labels = config["config"]["Labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    Ok(vsnap_only(labels))
}

async fn read_json(channel: &Channel, ns: &str, digest: &str) -> Result<Value, String> {
    let request = ReadContentRequest {
        digest: digest.to_string(),
        offset: 0,
        size: 0,
    };
    let mut stream = ContentClient::new(channel.clone())
        .read(with_namespace!(request, ns))
        .await
        .map_err(|e| format!("read {digest}: {}", e.message()))?
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|e| format!("read {digest}: {}", e.message()))?
    {
        bytes.extend_from_slice(&chunk.data);
        if bytes.len() > MAX_BLOB {
            return Err(format!("{digest} is larger than {MAX_BLOB} bytes"));
        }
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("{digest} is not JSON: {e}"))
}

fn vsnap_only(labels: HashMap<String, String>) -> HashMap<String, String> {
    labels
        .into_iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .collect()
}

/// Spec annotations over labels, key by key.
pub fn merge(
    annotations: HashMap<String, String>,
    labels: HashMap<String, String>,
) -> HashMap<String, String> {
    let mut merged = labels;
    merged.extend(annotations);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_win_over_labels_key_by_key() {
        let a: HashMap<_, _> = [("vsnap.io/plan".to_string(), "restore".to_string())].into();
        let l: HashMap<_, _> = [
            ("vsnap.io/plan".to_string(), "create".to_string()),
            ("vsnap.io/artifact".to_string(), "x".to_string()),
        ]
        .into();
        let m = merge(a, l);
        assert_eq!(m["vsnap.io/plan"], "restore");
        assert_eq!(m["vsnap.io/artifact"], "x");
    }

    #[test]
    fn only_vsnap_labels_are_taken() {
        let l: HashMap<_, _> = [
            ("vsnap.io/plan".to_string(), "auto".to_string()),
            (
                "org.opencontainers.image.title".to_string(),
                "t".to_string(),
            ),
        ]
        .into();
        assert_eq!(vsnap_only(l).len(), 1);
    }
}
