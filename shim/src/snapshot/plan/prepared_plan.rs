//! What preparing a container's plan yields: a capture's plan or a
//! restore's, each boxed (they differ much in size).

use super::capture::CapturePlan;
use super::common::Common;
use super::restore::RestorePlan;

/// A prepared plan: what the init's start runs.
#[derive(Debug)]
pub enum Prepared {
    Capture(Box<CapturePlan>),
    Restore(Box<RestorePlan>),
}

impl Prepared {
    pub fn common(&self) -> &Common {
        match self {
            Prepared::Capture(c) => &c.common,
            Prepared::Restore(r) => &r.common,
        }
    }

    /// Removes what create prepared (the control dir).
    pub fn cleanup(&self) {
        self.common().cleanup();
    }
}
