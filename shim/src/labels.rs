//! The lower-precedence sources of `vsnap.io/` settings, read from containerd
//! over its API: the container's labels, then its image's config labels (so
//! an image author can opt in). OCI annotations, which the shim reads from
//! the spec, win over both. This is an edge: protobuf stays here; the
//! calls go through the shim's own small gRPC client (grpc.rs).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256, Sha512};

use crate::grpc::Connection;

const PREFIX: &str = "vsnap.io/";
/// containerd answers locally; anything slower is a problem to report, not wait on.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Manifests and image configs are small; refuse to buffer anything larger.
const MAX_BLOB: usize = 4 << 20;

const GET_CONTAINER: &str = "/containerd.services.containers.v1.Containers/Get";
const GET_IMAGE: &str = "/containerd.services.images.v1.Images/Get";
const READ_CONTENT: &str = "/containerd.services.content.v1.Content/Read";

/// The fields of containerd's API messages that are read here (prost skips
/// the others); numbers as in containerd's api/services/*/v1/*.proto.
mod api {
    use std::collections::HashMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetContainerRequest {
        #[prost(string, tag = "1")]
        pub id: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetContainerResponse {
        #[prost(message, optional, tag = "1")]
        pub container: Option<Container>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Container {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(map = "string, string", tag = "2")]
        pub labels: HashMap<String, String>,
        #[prost(string, tag = "3")]
        pub image: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetImageRequest {
        #[prost(string, tag = "1")]
        pub name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct GetImageResponse {
        #[prost(message, optional, tag = "1")]
        pub image: Option<Image>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Image {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "3")]
        pub target: Option<Descriptor>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Descriptor {
        #[prost(string, tag = "1")]
        pub media_type: String,
        #[prost(string, tag = "2")]
        pub digest: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReadContentRequest {
        #[prost(string, tag = "1")]
        pub digest: String,
        #[prost(int64, tag = "2")]
        pub offset: i64,
        #[prost(int64, tag = "3")]
        pub size: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReadContentResponse {
        #[prost(int64, tag = "1")]
        pub offset: i64,
        #[prost(bytes = "vec", tag = "2")]
        pub data: Vec<u8>,
    }
}

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
    let (mut conn, container) = container(address, ns, id).await?;
    let mut labels = HashMap::new();
    if !container.image.is_empty() {
        labels.extend(image_labels(&mut conn, ns, &container.image).await?);
    }
    labels.extend(vsnap_only(container.labels));
    Ok(labels)
}

async fn container(
    address: &str,
    ns: &str,
    id: &str,
) -> Result<(Connection, api::Container), String> {
    let address = address.trim_start_matches("unix://");
    let mut conn = Connection::connect(Path::new(address)).await?;
    let request = api::GetContainerRequest { id: id.to_string() };
    let container = one::<_, api::GetContainerResponse>(&mut conn, GET_CONTAINER, ns, &request)
        .await
        .map_err(|e| format!("get container {id}: {e}"))?
        .container
        .ok_or_else(|| format!("container {id} not found"))?;
    Ok((conn, container))
}

/// The one answer of a unary call.
async fn one<Req: prost::Message, Resp: prost::Message + Default>(
    conn: &mut Connection,
    path: &str,
    ns: &str,
    request: &Req,
) -> Result<Resp, String> {
    let mut answers = conn.call::<Req, Resp>(path, ns, request).await?;
    match answers.len() {
        1 => Ok(answers.remove(0)),
        n => Err(format!("{path}: {n} answers to a unary call")),
    }
}

async fn get_image(conn: &mut Connection, ns: &str, name: &str) -> Result<api::Image, String> {
    let request = api::GetImageRequest {
        name: name.to_string(),
    };
    one::<_, api::GetImageResponse>(conn, GET_IMAGE, ns, &request)
        .await
        .map_err(|e| format!("get image {name}: {e}"))?
        .image
        .ok_or_else(|| format!("image {name} not found"))
}

/// The digest of the container's image (its index or manifest), or `None`
/// for a container without an image (`ctr run --rootfs`).
pub async fn image_digest(address: &str, ns: &str, id: &str) -> Result<Option<String>, String> {
    let find = async {
        let (mut conn, container) = container(address, ns, id).await?;
        if container.image.is_empty() {
            return Ok(None);
        }
        let image = get_image(&mut conn, ns, &container.image).await?;
        Ok(image.target.map(|t| t.digest))
    };
    tokio::time::timeout(TIMEOUT, find)
        .await
        .map_err(|_| format!("containerd did not answer within {TIMEOUT:?}"))?
}

async fn image_labels(
    conn: &mut Connection,
    ns: &str,
    name: &str,
) -> Result<HashMap<String, String>, String> {
    let image = get_image(conn, ns, name).await?;
    let target = image
        .target
        .ok_or_else(|| format!("image {name} has no target"))?;
    let mut doc = read_json(conn, ns, &target.digest).await?;
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
        doc = read_json(conn, ns, &digest).await?;
    }
    let config = doc["config"]["digest"]
        .as_str()
        .ok_or_else(|| format!("image {name}: manifest has no config"))?
        .to_string();
    let config = read_json(conn, ns, &config).await?;
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

async fn read_json(conn: &mut Connection, ns: &str, digest: &str) -> Result<Value, String> {
    let request = api::ReadContentRequest {
        digest: digest.to_string(),
        offset: 0,
        size: 0,
    };
    let chunks = conn
        .call::<_, api::ReadContentResponse>(READ_CONTENT, ns, &request)
        .await
        .map_err(|e| format!("read {digest}: {e}"))?;
    let mut bytes = Vec::new();
    for chunk in chunks {
        bytes.extend_from_slice(&chunk.data);
        if bytes.len() > MAX_BLOB {
            return Err(format!("{digest} is larger than {MAX_BLOB} bytes"));
        }
    }
    verify(digest, &bytes)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{digest} is not JSON: {e}"))
}

/// Whether `bytes` are the content `digest` (`sha256:<hex>` or
/// `sha512:<hex>`) names: what containerd's content store answered is
/// taken on its digest only after it is checked.
fn verify(digest: &str, bytes: &[u8]) -> Result<(), String> {
    let (algorithm, _) = digest
        .split_once(':')
        .ok_or_else(|| format!("{digest}: not a digest"))?;
    let sum = match algorithm {
        "sha256" => Sha256::digest(bytes).to_vec(),
        "sha512" => Sha512::digest(bytes).to_vec(),
        _ => return Err(format!("{digest}: cannot check a {algorithm} digest")),
    };
    let actual: String = sum.iter().map(|b| format!("{b:02x}")).collect();
    let actual = format!("{algorithm}:{actual}");
    if actual != digest {
        return Err(format!(
            "content {digest}: the {} bytes read have digest {actual}",
            bytes.len()
        ));
    }
    Ok(())
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
    fn content_is_checked_against_its_digest() {
        // sha256 of "abc" (FIPS 180-2's example).
        let abc = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert!(verify(abc, b"abc").is_ok());
        let e = verify(abc, b"abd").unwrap_err();
        assert!(
            e.starts_with(&format!("content {abc}: the 3 bytes read")),
            "{e}"
        );
        assert!(verify(&abc.to_uppercase(), b"abc").is_err());
        assert!(verify("md5:900150983cd24fb0d6963f7d28e17f72", b"abc")
            .unwrap_err()
            .contains("cannot check"));
        assert!(verify("abc", b"abc").is_err());
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
