//! An artifact pulled from or pushed to a registry (`vsnap.io/artifact-ref`,
//! `push_created`) through the `vsnap` CLI (fetch.rs). Not the artifact
//! store: that is the artifact root, which vsnap_artifact keeps.

pub(crate) mod fetch;
pub(crate) mod stream;
