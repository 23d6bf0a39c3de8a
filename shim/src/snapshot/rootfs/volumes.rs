//! Files the captured tree holds open on volumes: fingerprinted at the
//! capture, held to their bytes before a restore's CRIU runs.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde_json::Value;
use vsnap_artifact::rootfs::{self as record, OpenFile};

use crate::error::{Error, Result};
use vsnap_host::fds::open_fds;

/// The bind mounts of a spec: (destination inside, source on the host).
fn volumes(spec: &Value) -> Vec<(String, String)> {
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["type"].as_str() == Some("bind")
                || m["options"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
        })
        .filter_map(|m| {
            Some((
                m["destination"].as_str()?.trim_end_matches('/').to_string(),
                m["source"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The volume (destination, source) of `path`: the innermost bind mount.
fn volume_of<'a>(path: &str, volumes: &'a [(String, String)]) -> Option<&'a (String, String)> {
    volumes
        .iter()
        .filter(|(dest, _)| {
            path.strip_prefix(dest.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .max_by_key(|(dest, _)| dest.len())
}

/// Mounts whose files vsnap carries another way (or that CRIU handles).
fn carried_elsewhere(volume: &str, control_mount: &str) -> bool {
    volume == control_mount
        || volume == "/dev/shm"
        || volume.starts_with("/dev/")
        || volume == "/dev"
}

/// The regular files the tree `pids` holds open or mapped on volumes of
/// `spec`, fingerprinted through `/proc/<pid>/root`.
pub fn open_volume_files(pids: &[i32], spec: &Value, control_mount: &str) -> Result<Vec<OpenFile>> {
    let volumes = volumes(spec);
    let mut seen: HashMap<String, i32> = HashMap::new();
    for pid in pids {
        let mut paths: Vec<String> = open_fds(*pid)
            .into_iter()
            .map(|f| f.target.to_string_lossy().into_owned())
            .collect();
        if let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) {
            for line in maps.lines() {
                // address perms offset dev inode pathname
                if let Some(p) = line.split_whitespace().nth(5) {
                    if p.starts_with('/') {
                        paths.push(line[line.find(p).unwrap_or(0)..].to_string());
                    }
                }
            }
        }
        for p in paths {
            if !p.starts_with('/') || p.ends_with(" (deleted)") {
                continue;
            }
            seen.entry(p).or_insert(*pid);
        }
    }
    let mut out = Vec::new();
    for (path, pid) in seen {
        let Some((volume, _)) = volume_of(&path, &volumes) else {
            continue; // the image or the writable layer
        };
        if carried_elsewhere(volume, control_mount) {
            continue;
        }
        let inside = format!("/proc/{pid}/root{path}");
        let Ok(md) = fs::symlink_metadata(&inside) else {
            continue; // gone meanwhile, or not a path of its root
        };
        if !md.is_file() {
            continue;
        }
        let digest = fs::File::open(&inside)
            .and_then(|mut f| record::file_digest(&mut f, md.len()))
            .map_err(|e| Error::io(format!("capture: volume files: read {path}"), e))?;
        out.push(OpenFile {
            path,
            volume: volume.clone(),
            size: md.len(),
            digest,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Before CRIU: each file the capture's tree held open on a volume is at
/// the same path of a volume of the restore's `spec`, with the same bytes.
pub fn check_volume_files(files: &[OpenFile], spec: &Value) -> Result<()> {
    let volumes = volumes(spec);
    let fail =
        |m: String| Error::FailedPrecondition(format!("restore: preflight: volume file {m}"));
    for f in files {
        let Some((dest, source)) = volume_of(&f.path, &volumes) else {
            return Err(fail(format!(
                "{}: no volume of this container holds it (the capture's tree had it open on the volume at {}): mount the same volume",
                f.path, f.volume
            )));
        };
        let rest = f.path[dest.len()..].trim_start_matches('/');
        let host = Path::new(source).join(rest);
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&host);
        let mut file = match opened {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(fail(format!(
                    "{} ({}) vanished since the capture, which had it open",
                    f.path,
                    host.display()
                )))
            }
            Err(e) => {
                return Err(Error::io(
                    format!("restore: preflight: volume file {}", host.display()),
                    e,
                ))
            }
        };
        let size = file
            .metadata()
            .map_err(|e| {
                Error::io(
                    format!("restore: preflight: volume file {}", host.display()),
                    e,
                )
            })?
            .len();
        let digest = record::file_digest(&mut file, size).map_err(|e| {
            Error::io(
                format!("restore: preflight: volume file {}", host.display()),
                e,
            )
        })?;
        if size != f.size || digest != f.digest {
            return Err(fail(format!(
                "{} ({}) changed since the capture, which had it open ({} bytes then, {size} now); the restored engine would read other bytes than it did: re-create the artifact",
                f.path,
                host.display(),
                f.size
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_files_are_held_to_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        fs::create_dir(&model).unwrap();
        fs::write(model.join("w.bin"), b"weights").unwrap();
        let spec = serde_json::json!({"mounts": [
            {"destination": "/model", "type": "bind", "source": model, "options": ["rbind", "ro"]},
            {"destination": "/proc", "type": "proc", "source": "proc"}
        ]});
        let mut f = fs::File::open(model.join("w.bin")).unwrap();
        let files = vec![OpenFile {
            path: "/model/w.bin".into(),
            volume: "/model".into(),
            size: 7,
            digest: record::file_digest(&mut f, 7).unwrap(),
        }];
        check_volume_files(&files, &spec).unwrap();
        fs::write(model.join("w.bin"), b"weightz").unwrap();
        let err = check_volume_files(&files, &spec).unwrap_err().to_string();
        assert!(
            err.starts_with("restore: preflight: volume file /model/w.bin")
                && err.contains("changed"),
            "{err}"
        );
        fs::remove_file(model.join("w.bin")).unwrap();
        let err = check_volume_files(&files, &spec).unwrap_err().to_string();
        assert!(err.contains("vanished"), "{err}");
        let err = check_volume_files(&files, &serde_json::json!({}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no volume of this container holds it"),
            "{err}"
        );
    }

    #[test]
    fn files_a_process_holds_open_on_a_volume_are_found() {
        // This process's root is the host's: a volume's destination is its
        // source's path.
        let dir = tempfile::tempdir().unwrap();
        let held = dir.path().join("held.bin");
        fs::write(&held, b"weights").unwrap();
        fs::write(dir.path().join("closed.bin"), b"x").unwrap();
        let _open = fs::File::open(&held).unwrap();
        let at = dir.path().to_str().unwrap();
        let spec = serde_json::json!({"mounts": [
            {"destination": at, "type": "bind", "source": at, "options": ["rbind"]}
        ]});
        let files = open_volume_files(&[std::process::id() as i32], &spec, "/run/vsnap").unwrap();
        assert_eq!(
            files.len(),
            1,
            "{:?}",
            files.iter().map(|f| &f.path).collect::<Vec<_>>()
        );
        assert_eq!(files[0].path, held.to_str().unwrap());
        assert_eq!((files[0].volume.as_str(), files[0].size), (at, 7));
    }

    #[test]
    fn the_innermost_volume_holds_a_path() {
        let v = vec![
            ("/data".to_string(), "/a".to_string()),
            ("/data/cache".to_string(), "/b".to_string()),
        ];
        assert_eq!(volume_of("/data/cache/x", &v).unwrap().1, "/b");
        assert_eq!(volume_of("/data/x", &v).unwrap().1, "/a");
        assert!(volume_of("/database/x", &v).is_none());
    }
}
