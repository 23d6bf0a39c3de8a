//! The container state an OCI runtime writes to a hook's stdin (runtime spec,
//! "State"): read lazily, only by the checks that need it, so that a check
//! run by hand without a state does not wait on a terminal.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Failure;

const MAX_BYTES: u64 = 1 << 20;

/// The fields of the state the checks use; others are ignored (runtimes add
/// their own).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct State {
    #[serde(rename = "ociVersion", default)]
    pub oci_version: String,
    pub id: String,
    #[serde(default)]
    pub status: String,
    /// The container's init (at `createRuntime`: runc's init, or the root of
    /// the tree CRIU restores).
    #[serde(default)]
    pub pid: Option<i32>,
    pub bundle: PathBuf,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl State {
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Self, Failure> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(Failure::Input(format!(
                "no container state on {origin} (the OCI runtime writes it to a hook's stdin); give --bundle DIR or --state FILE"
            )));
        }
        serde_json::from_slice(bytes)
            .map_err(|e| Failure::Input(format!("container state on {origin}: {e}")))
    }
}

/// Where the state comes from: `--state FILE`, else stdin; read once.
pub struct StateSource<'a> {
    file: Option<PathBuf>,
    stdin: &'a mut dyn Read,
    state: Option<State>,
}

impl<'a> StateSource<'a> {
    pub fn new(file: Option<PathBuf>, stdin: &'a mut dyn Read) -> Self {
        Self {
            file,
            stdin,
            state: None,
        }
    }

    pub fn get(&mut self) -> Result<&State, Failure> {
        if self.state.is_none() {
            let mut bytes = Vec::new();
            let origin = match &self.file {
                Some(path) => {
                    std::fs::File::open(path)
                        .and_then(|f| f.take(MAX_BYTES + 1).read_to_end(&mut bytes))
                        .map_err(|e| Failure::Input(format!("read {}: {e}", path.display())))?;
                    path.display().to_string()
                }
                None => {
                    (&mut self.stdin)
                        .take(MAX_BYTES + 1)
                        .read_to_end(&mut bytes)
                        .map_err(|e| Failure::Input(format!("read the state on stdin: {e}")))?;
                    "stdin".to_string()
                }
            };
            if bytes.len() as u64 > MAX_BYTES {
                return Err(Failure::Input(format!(
                    "container state on {origin}: larger than {MAX_BYTES} bytes"
                )));
            }
            self.state = Some(State::parse(&bytes, &origin)?);
        }
        Ok(self.state.as_ref().expect("just read"))
    }

    /// `--bundle DIR` when given, else the state's bundle.
    pub fn bundle(&mut self, flag: Option<&Path>) -> Result<PathBuf, Failure> {
        match flag {
            Some(b) => Ok(b.to_path_buf()),
            None => Ok(self.get()?.bundle.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_state_is_read_once_and_extra_fields_are_ignored() {
        let text = br#"{"ociVersion":"1.0.2-dev","id":"c1","status":"creating","pid":42,"bundle":"/run/b","annotations":{"vsnap.io/plan":"restore"},"x":1}"#;
        let mut stdin = &text[..];
        let mut src = StateSource::new(None, &mut stdin);
        let s = src.get().unwrap().clone();
        assert_eq!((s.id.as_str(), s.pid), ("c1", Some(42)));
        assert_eq!(s.annotations["vsnap.io/plan"], "restore");
        assert_eq!(src.bundle(None).unwrap(), PathBuf::from("/run/b"));
        assert_eq!(
            src.bundle(Some(Path::new("/x"))).unwrap(),
            PathBuf::from("/x")
        );
    }

    #[test]
    fn no_state_says_what_to_give_instead() {
        let mut stdin = &b""[..];
        let e = StateSource::new(None, &mut stdin).get().unwrap_err();
        assert!(e.message().contains("--bundle DIR"), "{e:?}");
        let mut stdin = &b"{\"id\":1}"[..];
        let e = StateSource::new(None, &mut stdin).get().unwrap_err();
        assert_eq!(e.code(), crate::EXIT_INPUT);
    }
}
