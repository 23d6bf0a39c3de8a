//! What preparing a container's plan yields: a capture's plan or a
//! restore's, each boxed (they differ much in size); and a plan of either
//! direction borrowed, for what preparation does to both (the spec's edits,
//! the preflight hooks) before the plan is handed on.

use super::capture::CapturePlan;
use super::common::Common;
use super::restore::RestorePlan;

/// A prepared plan: what the init's start runs. Made in one place,
/// [`super::prepare`], from the plan of the direction it chose.
#[derive(Debug)]
pub enum PreparedPlan {
    Capture(Box<CapturePlan>),
    Restore(Box<RestorePlan>),
}

impl PreparedPlan {
    pub fn common(&self) -> &Common {
        match self {
            PreparedPlan::Capture(c) => &c.common,
            PreparedPlan::Restore(r) => &r.common,
        }
    }

    /// Removes what create prepared (the control dir).
    pub fn cleanup(&self) {
        self.common().cleanup();
    }
}

/// A plan of either direction, borrowed while it is being prepared.
#[derive(Clone, Copy, Debug)]
pub enum PlanRef<'a> {
    Capture(&'a CapturePlan),
    Restore(&'a RestorePlan),
}

impl<'a> PlanRef<'a> {
    pub fn common(self) -> &'a Common {
        match self {
            PlanRef::Capture(c) => &c.common,
            PlanRef::Restore(r) => &r.common,
        }
    }

    /// Removes what create prepared (the control dir).
    pub fn cleanup(self) {
        self.common().cleanup();
    }
}
