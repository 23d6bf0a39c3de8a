//! A `/dev/shm` bind-mounted from the host is an external mount to CRIU: its
//! files are not in the image, yet the engine's shared memory lives there.
//! vsnap copies them into the artifact right after the dump (the engine waits
//! for its activation then, touching nothing) and puts them back into the
//! new container's folder before the restore.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use vsnap_artifact::layout;

use crate::error::{Error, Result};

/// The artifact's folder for them.
pub const ARTIFACT_DIR: &str = "dev-shm";

/// Copies the regular files of `host_shm` into `to` (created 0700). CRIU's
/// link-remap files, kept past the dump by the post-dump script
/// (criu.rs), are carried as `link_remap.N`: when another name of the
/// folder is the same file (a semaphore's final name), as a link to it,
/// recorded in [`LINKS_FILE`], so a restore puts one file back under both
/// names. Nothing of them stays in `host_shm`.
pub fn carry(host_shm: &Path, to: &Path) -> Result<()> {
    let phase = "capture: /dev/shm";
    fs::create_dir_all(to)
        .map_err(|e| Error::io(format!("capture: create {}", to.display()), e))?;
    let mut names = Vec::new();
    let mut kept = Vec::new();
    for e in fs::read_dir(host_shm)
        .map_err(|e| Error::io(format!("{phase}: read {}", host_shm.display()), e))?
    {
        let e = e.map_err(|e| Error::io(phase.to_string(), e))?;
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(remap) = name.strip_prefix(KEPT_PREFIX) {
            kept.push((remap.to_string(), e.path()));
        } else if !name.starts_with(LINK_REMAP_PREFIX) {
            names.push(name);
        }
    }
    for name in &names {
        layout::copy_regular_nofollow(&host_shm.join(name), &to.join(name), FILE_LIMIT)
            .map_err(|err| Error::FailedPrecondition(format!("{phase}: {err}")))?;
    }
    let inode = |p: &Path| fs::symlink_metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let mut links = std::collections::BTreeMap::new();
    for (remap, path) in &kept {
        let same = inode(path).and_then(|ino| {
            names
                .iter()
                .find(|n| inode(&host_shm.join(n)) == Some(ino))
                .cloned()
        });
        match same {
            Some(name) => {
                links.insert(remap.clone(), name);
            }
            None => {
                layout::copy_regular_nofollow(path, &to.join(remap), FILE_LIMIT)
                    .map_err(|err| Error::FailedPrecondition(format!("{phase}: {err}")))?;
            }
        }
    }
    if !links.is_empty() {
        let text = serde_json::to_vec(&links).expect("names serialize");
        fs::write(to.join(LINKS_FILE), text)
            .map_err(|e| Error::io(format!("{phase}: write {LINKS_FILE}"), e))?;
    }
    for (_, path) in &kept {
        let _ = fs::remove_file(path);
    }
    remove_link_remaps(host_shm);
    Ok(())
}

/// Which carried link-remap file is another name of which file
/// (`{"link_remap.27": "sem.mp-x1y2"}`), in the artifact's `dev-shm/`.
pub const LINKS_FILE: &str = ".vsnap-links.json";
/// How the post-dump script names the links it keeps.
pub const KEPT_PREFIX: &str = ".vsnap-kept-";

/// What CRIU's `link-remap` names the links it makes for files open under
/// a name they lost (criu/files-reg.c: `link_remap.<id>`).
pub const LINK_REMAP_PREFIX: &str = "link_remap.";

/// Removes CRIU's link-remap files from a `/dev/shm` folder: after the
/// dump they are in the artifact (and the donor holds its files open);
/// after a restore CRIU opened them. Nothing of them stays on the host.
pub fn remove_link_remaps(host_shm: &Path) {
    let Ok(entries) = fs::read_dir(host_shm) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name()
            .to_string_lossy()
            .starts_with(LINK_REMAP_PREFIX)
        {
            if let Err(err) = fs::remove_file(e.path()) {
                if err.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("remove {}: {err}", e.path().display());
                }
            }
        }
    }
}

/// Copies the carried files into the new container's `/dev/shm` folder,
/// refusing to overwrite what is already there; a link-remap file that was
/// another name of a carried file becomes a hard link to it again. The
/// names put back.
pub fn put_back(from: &Path, host_shm: &Path) -> Result<Vec<String>> {
    let phase = "restore: /dev/shm";
    if !from.is_dir() {
        return Ok(Vec::new());
    }
    let links: std::collections::BTreeMap<String, String> = match fs::read(from.join(LINKS_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::FailedPrecondition(format!("{phase}: {LINKS_FILE}: {e}")))?,
        Err(_) => Default::default(),
    };
    let mut names = Vec::new();
    for e in
        fs::read_dir(from).map_err(|e| Error::io(format!("restore: read {}", from.display()), e))?
    {
        let e = e.map_err(|e| Error::io("restore: /dev/shm", e))?;
        let name = e.file_name().to_string_lossy().to_string();
        if name != LINKS_FILE {
            names.push(name);
        }
    }
    for name in names.iter().chain(links.keys()) {
        let target = host_shm.join(name);
        if fs::symlink_metadata(&target).is_ok() {
            return Err(Error::FailedPrecondition(format!(
                "restore: /dev/shm: {} already exists in the container's /dev/shm folder",
                target.display()
            )));
        }
    }
    for name in &names {
        layout::copy_regular_nofollow(&from.join(name), &host_shm.join(name), FILE_LIMIT)
            .map_err(|err| Error::FailedPrecondition(format!("{phase}: {err}")))?;
    }
    for (remap, name) in &links {
        let bad = |n: &str| n.contains('/') || n.starts_with('.') || !names.iter().any(|x| x == n);
        if !remap.starts_with(LINK_REMAP_PREFIX) || remap.contains('/') || bad(name) {
            return Err(Error::FailedPrecondition(format!(
                "{phase}: {LINKS_FILE}: {remap:?} -> {name:?} is not a link between carried files"
            )));
        }
        fs::hard_link(host_shm.join(name), host_shm.join(remap))
            .map_err(|e| Error::io(format!("{phase}: link {remap} to {name}"), e))?;
    }
    Ok(names.into_iter().chain(links.into_keys()).collect())
}

/// Most bytes of shared memory carried per file (as CRIU's ghost limit).
/// The container can write both folders: nothing is followed or
/// overwritten (artifact::layout::copy_regular_nofollow); the copies are
/// 0600, root's.
const FILE_LIMIT: u64 = 64 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_go_into_the_artifact_and_back_without_overwriting() {
        let dir = tempfile::tempdir().unwrap();
        let (shm, art, new) = (
            dir.path().join("shm"),
            dir.path().join("art"),
            dir.path().join("new"),
        );
        fs::create_dir_all(&shm).unwrap();
        fs::create_dir_all(&new).unwrap();
        fs::write(shm.join("psm_1"), b"shared").unwrap();
        // CRIU's link-remap files, kept by the post-dump script: one is
        // another name of a semaphore, one of a file no longer named.
        fs::write(shm.join("sem.mp-a"), b"sem").unwrap();
        fs::hard_link(shm.join("sem.mp-a"), shm.join(".vsnap-kept-link_remap.3")).unwrap();
        fs::write(shm.join(".vsnap-kept-link_remap.4"), b"orphan").unwrap();
        fs::write(shm.join("link_remap.3"), b"sem").unwrap();
        carry(&shm, &art).unwrap();
        let left: Vec<_> = fs::read_dir(&shm)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "only psm_1 and sem.mp-a stay: {left:?}");
        let mut put = put_back(&art, &new).unwrap();
        put.sort();
        let mut there: Vec<String> = fs::read_dir(&new)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        there.sort();
        assert_eq!(put, there, "every name put back is named");
        assert_eq!(fs::read(new.join("psm_1")).unwrap(), b"shared");
        assert_eq!(fs::read(new.join("link_remap.4")).unwrap(), b"orphan");
        let (a, b) = (
            fs::metadata(new.join("sem.mp-a")).unwrap(),
            fs::metadata(new.join("link_remap.3")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino(), "one semaphore under both names again");
        assert!(!new.join(LINKS_FILE).exists());
        let err = put_back(&art, &new).unwrap_err().to_string();
        assert!(err.contains("already exists"), "{err}");
        remove_link_remaps(&new);
        assert!(!new.join("link_remap.3").exists() && new.join("psm_1").exists());
    }
}
