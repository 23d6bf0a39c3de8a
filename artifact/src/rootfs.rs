//! What an artifact records of the container's root filesystem: how its
//! writable layer travelled (carried as `rootfs/upper.tar`, or nothing to
//! carry), and the files the captured tree held open on volumes, which a
//! restore must find unchanged before CRIU runs.

use serde::{Deserialize, Serialize};

/// The artifact folder of the carried layer (covered by the content digests).
pub const DIR: &str = "rootfs";
/// The writable layer as a tar of the overlay upper dir.
pub const UPPER_TAR: &str = "upper.tar";

/// How the container's writable layer reaches a restore.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum RootfsLayer {
    /// The overlay upper dir of the container's snapshot, carried in
    /// `rootfs/upper.tar` and unpacked into the restore's fresh upper dir.
    OverlayUpper {
        /// Bytes of regular files in the layer.
        bytes: u64,
        /// Entries (files, folders, links, whiteouts).
        entries: u64,
        /// Unix socket files of the layer, left out of the tar (a socket
        /// file is no data): CRIU binds the tree's live ones again at
        /// their paths; a stale one (nobody held it) is gone after a
        /// restore. Paths inside the container, sorted.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        sockets: Vec<String>,
    },
    /// No rootfs mounts: the spec's root is a folder the create and its
    /// restores share (`ctr run --rootfs DIR`); nothing to carry.
    SharedFolder,
    /// A read-only rootfs: nothing can have changed.
    ReadOnly,
    /// A layer vsnap cannot tell apart from the image (e.g. a bind-mounted
    /// native snapshot): not carried; why.
    NotCarried { reason: String },
}

/// A regular file the captured tree held open or mapped on a volume (a
/// bind mount of the container), as it was at capture.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OpenFile {
    /// The path inside the container.
    pub path: String,
    /// The volume's mount point inside the container.
    pub volume: String,
    pub size: u64,
    /// `sha256:<hex>` of the whole file, or, for files over
    /// [`SAMPLED_ABOVE`], of its size, first and last [`SAMPLE_BYTES`].
    pub digest: String,
}

/// Files larger than this are fingerprinted by their ends (a model's
/// weights: hashing GiBs at every restore would cost more than CRIU).
pub const SAMPLED_ABOVE: u64 = 64 << 20;
pub const SAMPLE_BYTES: u64 = 4 << 20;

/// The rootfs record of a manifest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Rootfs {
    pub layer: RootfsLayer,
    /// Files on volumes the tree held open, sorted by path.
    #[serde(default)]
    pub open_files: Vec<OpenFile>,
}

/// The fingerprint of a file's bytes read from `f` (`size` bytes long).
pub fn file_digest(f: &mut std::fs::File, size: u64) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Seek, SeekFrom};
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut read_range =
        |f: &mut std::fs::File, h: &mut Sha256, mut n: u64| -> std::io::Result<()> {
            while n > 0 {
                let want = n.min(buf.len() as u64) as usize;
                let got = f.read(&mut buf[..want])?;
                if got == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was read",
                    ));
                }
                h.update(&buf[..got]);
                n -= got as u64;
            }
            Ok(())
        };
    if size <= SAMPLED_ABOVE {
        read_range(f, &mut h, size)?;
        return Ok(format!("sha256:{}", hex(&h.finalize())));
    }
    h.update(size.to_le_bytes());
    f.seek(SeekFrom::Start(0))?;
    read_range(f, &mut h, SAMPLE_BYTES)?;
    f.seek(SeekFrom::Start(size - SAMPLE_BYTES))?;
    read_range(f, &mut h, SAMPLE_BYTES)?;
    Ok(format!("sha256-ends:{}", hex(&h.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_record_round_trips_and_names_its_kind() {
        let r = Rootfs {
            layer: RootfsLayer::OverlayUpper {
                bytes: 10,
                entries: 3,
                sockets: vec!["/tmp/0c1d".into()],
            },
            open_files: vec![OpenFile {
                path: "/model/w.bin".into(),
                volume: "/model".into(),
                size: 4,
                digest: "sha256:00".into(),
            }],
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["layer"]["kind"], "overlay-upper");
        assert_eq!(v["layer"]["sockets"][0], "/tmp/0c1d");
        assert_eq!(serde_json::from_value::<Rootfs>(v).unwrap(), r);
        // A record written before sockets were left out reads as none.
        let old: Rootfs =
            serde_json::from_str(r#"{"layer":{"kind":"overlay-upper","bytes":1,"entries":1}}"#)
                .unwrap();
        assert!(
            matches!(old.layer, RootfsLayer::OverlayUpper { ref sockets, .. } if sockets.is_empty())
        );
        let shared: Rootfs = serde_json::from_str(r#"{"layer":{"kind":"shared-folder"}}"#).unwrap();
        assert_eq!(shared.layer, RootfsLayer::SharedFolder);
    }

    #[test]
    fn small_files_hash_whole_and_large_ones_by_their_ends() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let d = file_digest(&mut std::fs::File::open(&p).unwrap(), 3).unwrap();
        assert_eq!(
            d,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let big = SAMPLED_ABOVE + 1;
        let mut f = std::fs::File::create(&p).unwrap();
        f.set_len(big).unwrap();
        let a = file_digest(&mut std::fs::File::open(&p).unwrap(), big).unwrap();
        assert!(a.starts_with("sha256-ends:"), "{a}");
        // A change at the end is seen.
        use std::io::{Seek, SeekFrom};
        f.seek(SeekFrom::Start(big - 1)).unwrap();
        f.write_all(b"x").unwrap();
        let b = file_digest(&mut std::fs::File::open(&p).unwrap(), big).unwrap();
        assert_ne!(a, b);
    }
}
