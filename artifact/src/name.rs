//! An artifact's name: the one rule (of `vsnap.io/artifact`, the CLI, the
//! hooks and a pulled artifact) and the type that holds only names that
//! keep it: `[A-Za-z0-9_.-]`, 1-128 characters, not starting with a dot;
//! never a path, so `<root>/<name>` stays under the root.

use std::fmt;
use std::str::FromStr;

/// A name that keeps the artifact-name rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactName(String);

/// A string that is not an artifact name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an artifact name ([A-Za-z0-9_.-], 1-128 characters, not starting with '.'; paths are refused)")]
pub struct BadName(pub String);

impl ArtifactName {
    pub fn new(name: impl Into<String>) -> Result<Self, BadName> {
        let name = name.into();
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty()
            || name.len() > 128
            || name.starts_with('.')
            || !name.chars().all(ok_char)
        {
            return Err(BadName(name));
        }
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ArtifactName {
    type Err = BadName;

    fn from_str(s: &str) -> Result<Self, BadName> {
        Self::new(s)
    }
}

impl fmt::Display for ArtifactName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for ArtifactName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<std::path::Path> for ArtifactName {
    fn as_ref(&self) -> &std::path::Path {
        std::path::Path::new(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_the_rule_and_paths_never_do() {
        for ok in ["qwen3-0.6b", "a", "A_b.c-d", &"x".repeat(128)] {
            assert_eq!(ArtifactName::new(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            ".host-key",
            "..",
            "../etc",
            "a/b",
            "/abs",
            "a b",
            "ü",
            &"x".repeat(129),
        ] {
            let e = ArtifactName::new(bad).unwrap_err();
            assert_eq!(e.0, bad);
            assert!(e.to_string().contains("is not an artifact name"), "{e}");
        }
        assert_eq!("m1".parse::<ArtifactName>().unwrap().to_string(), "m1");
    }
}
