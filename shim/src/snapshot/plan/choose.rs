//! Which of the two plans a container gets: `create` always captures,
//! `restore` always restores (and fails closed when it cannot), `auto`
//! restores what can be restored and otherwise captures. A pure function
//! of what was asked and what the artifact root holds, so that every case
//! is a unit test.

use std::path::Path;

use vsnap_artifact::{ArtifactError, Manifest};

use super::annotations::Mode;

/// What the artifact root holds under the plan's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDisk {
    /// A published artifact (its manifest is there; nothing checked yet).
    Published,
    Absent,
}

/// The plan a container's init starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Cold start, capture, publish.
    Capture,
    /// Restore the published artifact.
    Restore,
}

/// The plan for `asked`; only `auto` looks at what is on disk (`look`).
pub fn choose(asked: Mode, look: impl FnOnce() -> OnDisk) -> Choice {
    match asked {
        Mode::Create => Choice::Capture,
        // A missing artifact is the restore preflight's refusal, by name.
        Mode::Restore => Choice::Restore,
        Mode::Auto => match look() {
            OnDisk::Published => Choice::Restore,
            OnDisk::Absent => Choice::Capture,
        },
    }
}

impl OnDisk {
    /// What `root` holds under `name`: nothing, or something published,
    /// readable or not. What is wrong with a manifest (its format, its MAC,
    /// its bytes) is the restore preflight's to say, and under `auto` the
    /// reason it is set aside.
    pub fn look(root: &Path, name: &str) -> Self {
        match Manifest::load_unverified(root, name) {
            Err(ArtifactError::NotFound(_)) => OnDisk::Absent,
            Ok(_) | Err(_) => OnDisk::Published,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never_looked() -> OnDisk {
        panic!("only auto looks at the artifact root")
    }

    #[test]
    fn create_and_restore_never_look_at_the_root() {
        assert_eq!(choose(Mode::Create, never_looked), Choice::Capture);
        // A missing artifact is then the preflight's refusal, by name.
        assert_eq!(choose(Mode::Restore, never_looked), Choice::Restore);
    }

    #[test]
    fn auto_restores_what_is_published_and_captures_otherwise() {
        let on = |d: OnDisk| move || d;
        assert_eq!(choose(Mode::Auto, on(OnDisk::Published)), Choice::Restore);
        assert_eq!(choose(Mode::Auto, on(OnDisk::Absent)), Choice::Capture);
    }

    #[test]
    fn an_empty_root_holds_nothing_and_any_manifest_is_published() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(OnDisk::look(dir.path(), "a"), OnDisk::Absent);
        let art = vsnap_artifact::path(dir.path(), "a");
        std::fs::create_dir_all(&art).unwrap();
        std::fs::write(art.join(vsnap_artifact::layout::MANIFEST), "{ not json").unwrap();
        assert_eq!(
            OnDisk::look(dir.path(), "a"),
            OnDisk::Published,
            "unreadable is the preflight's to name, not absent"
        );
    }
}
