//! Where `start` puts the server it spawned: the runtime options'
//! `shim_cgroup`, and an OOM score one above containerd's (so the kernel's
//! OOM killer takes a shim before containerd), as containerd's shims do.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const OOM_SCORE_ADJ_MAX: i64 = 1000;

/// Writes `pid` into `cgroup` (a path from the hierarchy's root): its
/// `cgroup.procs` under cgroup v2, under v1 that of every hierarchy that
/// has the cgroup. A cgroup that no hierarchy has is an error.
pub fn join_cgroup(root: &Path, cgroup: &str, pid: u32) -> Result<()> {
    let relative = cgroup.trim_start_matches('/');
    let context = |what: &Path, e| {
        Error::io(
            format!(
                "start: move the shim into cgroup {cgroup}: {}",
                what.display()
            ),
            e,
        )
    };
    let procs: Vec<PathBuf> = if root.join("cgroup.controllers").exists() {
        vec![root.join(relative).join("cgroup.procs")]
    } else {
        let hierarchies = std::fs::read_dir(root).map_err(|e| context(root, e))?;
        hierarchies
            .flatten()
            // cpu,cpuacct and its links: one hierarchy is written once.
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path().join(relative).join("cgroup.procs"))
            .filter(|procs| procs.exists())
            .collect()
    };
    if procs.is_empty() {
        return Err(Error::NotFound(format!(
            "start: move the shim into cgroup {cgroup}: no hierarchy under {} has it",
            root.display()
        )));
    }
    for p in procs {
        std::fs::write(&p, pid.to_string()).map_err(|e| context(&p, e))?;
    }
    Ok(())
}

/// Sets `pid`'s `oom_score_adj` to `parent`'s plus one (at most the maximum).
pub fn adjust_oom_score(parent: u32, pid: u32) -> Result<()> {
    let read = format!("/proc/{parent}/oom_score_adj");
    let score =
        std::fs::read_to_string(&read).map_err(|e| Error::io(format!("start: read {read}"), e))?;
    let score: i64 = score
        .trim()
        .parse()
        .map_err(|e| Error::Other(format!("start: {read}: {score:?}: {e}")))?;
    if score >= OOM_SCORE_ADJ_MAX {
        return Ok(());
    }
    let write = format!("/proc/{pid}/oom_score_adj");
    std::fs::write(&write, (score + 1).to_string())
        .map_err(|e| Error::io(format!("start: write {write}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn procs(path: &Path) -> String {
        std::fs::read_to_string(path.join("cgroup.procs")).unwrap()
    }

    #[test]
    fn v2_writes_the_cgroup_under_the_one_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory").unwrap();
        let cg = root.path().join("shims/a");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cgroup.procs"), "").unwrap();
        join_cgroup(root.path(), "/shims/a", 42).unwrap();
        assert_eq!(procs(&cg), "42");
    }

    #[test]
    fn v1_writes_every_hierarchy_that_has_the_cgroup() {
        let root = tempfile::tempdir().unwrap();
        for h in ["cpu", "memory", "pids"] {
            let cg = root.path().join(h).join("shims");
            std::fs::create_dir_all(&cg).unwrap();
            std::fs::write(cg.join("cgroup.procs"), "").unwrap();
        }
        // A hierarchy without the cgroup is left alone, a link is not walked.
        std::fs::create_dir_all(root.path().join("freezer")).unwrap();
        std::os::unix::fs::symlink("cpu", root.path().join("cpu,cpuacct")).unwrap();
        join_cgroup(root.path(), "shims", 7).unwrap();
        for h in ["cpu", "memory", "pids"] {
            assert_eq!(procs(&root.path().join(h).join("shims")), "7", "{h}");
        }
        assert!(!root.path().join("freezer/shims").exists());
    }

    #[test]
    fn a_cgroup_no_hierarchy_has_is_an_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("cpu")).unwrap();
        let err = join_cgroup(root.path(), "/nowhere", 7).unwrap_err();
        assert!(err.to_string().contains("cgroup /nowhere"), "{err}");
    }

    #[test]
    fn a_real_process_lands_in_a_real_cgroup() {
        let root = Path::new(CGROUP_ROOT);
        let name = format!("vsnap-confine-test-{}", std::process::id());
        let dirs: Vec<PathBuf> = if root.join("cgroup.controllers").exists() {
            vec![root.join(&name)]
        } else {
            ["pids", "memory"]
                .iter()
                .map(|h| root.join(h))
                .filter(|h| h.join("cgroup.procs").exists())
                .map(|h| h.join(&name))
                .collect()
        };
        assert!(!dirs.is_empty(), "no cgroup hierarchy under {CGROUP_ROOT}");
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let result = join_cgroup(root, &format!("/{name}"), child.id());
        let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", child.id())).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        for d in &dirs {
            let _ = std::fs::remove_dir(d);
        }
        result.unwrap();
        let joined = cgroups
            .lines()
            .filter(|l| l.ends_with(&format!(":/{name}")));
        assert_eq!(joined.count(), dirs.len(), "{cgroups}");
    }

    #[test]
    fn oom_score_is_one_above_the_parent() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let before: i64 = std::fs::read_to_string(format!("/proc/{me}/oom_score_adj"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let result = adjust_oom_score(me, child.id());
        let after = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", child.id())).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        result.unwrap();
        assert_eq!(
            after.trim(),
            (before + 1).min(OOM_SCORE_ADJ_MAX).to_string()
        );
    }
}
