//! A restore given up for a cold start in the same Start (`auto`): the
//! container made again as a create would have made it without the
//! artifact (its own spec, or the spec of the capture that replaces the
//! artifact; its writable layer empty; a fresh control dir) and its init
//! created anew, on the stdio the restore had, so that what the container
//! prints still reaches containerd. The caller starts it (a plain start,
//! with the capture in the background).

use std::path::Path;

use vsnap_protocol::ControlDir;

use super::Container;
use crate::error::{Error, Result};
use crate::exits::Exit;
use crate::init_start::InitStart;
use crate::prepared::Prepared;
use crate::process::Transition;
use crate::runc::ChildStdio;
use crate::snapshot::criu::BUNDLE_CONFIG;
use crate::snapshot::plan::{ColdCapture, ColdStart, WriteLock};

/// How a failed restore goes on.
pub enum ColdWay {
    /// A cold start that captures the artifact anew, under the lock the
    /// artifact was set aside under.
    Capture(ColdCapture, WriteLock),
    /// A cold start of the container's own spec, capturing nothing.
    Plain,
}

/// What becomes of a restored copy's exit. Under `auto`, while the copy
/// activates, its exit is held back: should the restore fail, the start
/// goes on cold and the copy's exit is no exit of the container's (it
/// never was visible); should it not, the exit is the container's.
#[derive(Debug, Default)]
pub enum CopyExit {
    #[default]
    Publish,
    Hold(Option<Exit>),
}

fn step(what: &str) -> String {
    format!("start: cold start after the restore: {what}")
}

impl Container {
    /// Whether the exit of the init `pid` is held back (and now held).
    pub fn holds_exit(&mut self, pid: i32, exit: Exit) -> bool {
        match &mut self.copy_exit {
            CopyExit::Hold(held) if pid == self.init.pid => {
                *held = Some(exit);
                true
            }
            _ => false,
        }
    }

    /// The copy's exit no longer held back: the exit it held, recorded as
    /// the init's (to be published), if any.
    pub fn release_exit(&mut self) -> Option<Exit> {
        match std::mem::take(&mut self.copy_exit) {
            CopyExit::Hold(Some(exit)) if self.init.pid != 0 => {
                self.init.set_exited(exit).then_some(exit)
            }
            _ => None,
        }
    }

    /// After a failed restore whose leftovers (runc's state, CRIU's mounts,
    /// the copy) are gone: the init created again, `way`. `stdio`: the
    /// pipes the restore was given, kept open by the shim (None with a
    /// terminal: a new console).
    pub async fn create_cold(
        &mut self,
        cold: &ColdStart,
        way: ColdWay,
        stdio: Option<ChildStdio>,
    ) -> Result<()> {
        if let Some(exit) = self.init.exit() {
            let exited = format!("the init exited ({}) before", exit.code);
            return Err(Error::FailedPrecondition(step(&exited)));
        }
        self.respec(cold, way)?;
        if let Some(upper) = &cold.upper {
            self.empty_layer(upper)?;
        }
        for file in &cold.shm {
            match std::fs::remove_file(file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(step(&format!("remove {}", file.display())), e))
                }
                _ => {}
            }
        }
        self.init.pid = 0;
        self.init.transition("start", Transition::Abandon)?;
        let prepared = match stdio {
            Some(stdio) if !self.init.stdio.terminal => Prepared {
                console_path: None,
                receive: None,
                child_stdio: Some(stdio),
            },
            _ => Prepared::new(&mut self.init)?,
        };
        self.runc_create_with(prepared).await
    }

    /// The bundle's spec (and CRIU config) and the container's start
    /// become those of `way`; the restore's control dir goes, and a
    /// capture gets a fresh one.
    fn respec(&mut self, cold: &ColdStart, way: ColdWay) -> Result<()> {
        self.start.cleanup();
        let (spec, start) = match way {
            ColdWay::Capture(capture, lock) => {
                let criu = self.bundle.join(BUNDLE_CONFIG);
                rename(&capture.criu_config, &criu)?;
                let common = &capture.plan.common;
                let (uid, gid) = common.control_owner;
                ControlDir::create_owned_by(&common.control_dir, uid, Some(gid)).map_err(|e| {
                    Error::FailedPrecondition(step(&format!(
                        "control dir {}: {e}",
                        common.control_dir.display()
                    )))
                })?;
                let mut plan = capture.plan;
                plan.lock = Some(lock);
                (capture.spec, InitStart::Capture(plan))
            }
            ColdWay::Plain => (cold.spec.clone(), InitStart::Plain),
        };
        rename(&spec, &self.bundle.join("config.json"))?;
        self.start = start;
        Ok(())
    }

    /// The carried layer unpacked into `upper` taken out again: the
    /// overlay is unmounted, its upper dir emptied and mounted again.
    fn empty_layer(&mut self, upper: &Path) -> Result<()> {
        self.unmount_rootfs();
        let rootfs = self.bundle.join("rootfs");
        if crate::mounts::has_mounts_under(&rootfs) {
            return Err(Error::FailedPrecondition(step(&format!(
                "{} is still mounted: its upper dir cannot be emptied",
                rootfs.display()
            ))));
        }
        empty(upper).map_err(|e| Error::io(step(&format!("empty {}", upper.display())), e))?;
        self.mount_rootfs()
    }

    /// A cold start that failed: runc's state of it goes (the init, if
    /// created, with it), and the stdio with it.
    pub async fn cold_start_failed(&mut self) {
        if let Err(e) = self.runc.delete(&self.id, true).await {
            log::debug!("{}: after a failed cold start: {e}", self.id);
        }
        self.init.io.abort().await;
    }
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| {
        Error::io(
            step(&format!("rename {} to {}", from.display(), to.display())),
            e,
        )
    })
}

/// Removes everything in `dir`, leaving it.
fn empty(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_removes_files_folders_and_links_but_keeps_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("tmp/sub")).unwrap();
        std::fs::write(d.join("tmp/sub/f"), "x").unwrap();
        std::fs::write(d.join("g"), "y").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("link")).unwrap();
        empty(d).unwrap();
        assert!(d.is_dir());
        assert_eq!(std::fs::read_dir(d).unwrap().count(), 0);
        assert!(
            Path::new("/etc").is_dir(),
            "a link is removed, not followed"
        );
    }
}
