//! A container's snapshot plan: what its annotations ask
//! ([`annotations`]), and what create prepares from that, once, for the
//! init's start: a [`CapturePlan`] (cold start, capture, publish) or a
//! [`RestorePlan`] (restore, activation), each holding only what its
//! direction uses, over a [`Common`] part (the artifact's name and the
//! engine). `auto` is a choice between the two (choose.rs). The engine's
//! command is read by engine_argv/, the bundle's spec by
//! crate::bundle_spec: this room asks them.

pub mod annotations;
mod bundle;
mod capture;
mod choose;
mod cold;
pub(crate) mod common;
mod engine;
pub(crate) mod fallback;
mod hooks;
mod lock;
mod preflight;
mod prepare;
mod prepared_plan;
pub(crate) mod refusal;
mod restore;
pub(crate) mod spec;
pub(crate) mod tenant;

pub use annotations::{from_annotations, AfterCapture, PLAN};
pub use capture::CapturePlan;
pub use common::Common;
pub use engine::Inputs;
pub use lock::{ReadLock, WriteLock};
pub use prepare::prepare;
pub use prepared_plan::PreparedPlan;
pub use restore::{ColdCapture, ColdStart, RestorePlan};
