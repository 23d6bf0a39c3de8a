//! A snapshot plan's network namespace of the container's own
//! (netns_holder.rs): made and bound at Create, before runc sees the
//! container; its holder gone once the init holds it (a capture's `runc
//! create`) or the restore begins; its bind gone at delete.

use super::Container;
use crate::error::{Error, Result};
use crate::netns_holder::NetnsHold;

impl Container {
    /// Makes the namespace the plan's spec names, if it names one.
    pub(super) fn hold_netns(&mut self) -> Result<()> {
        let Some(file) = self.start.common().and_then(|c| c.netns.clone()) else {
            return Ok(());
        };
        let hold = NetnsHold::make(&file).map_err(|e| {
            Error::io(
                format!("create: a network namespace at {}", file.display()),
                e,
            )
        })?;
        self.netns = Some(hold);
        Ok(())
    }

    /// The pid Create reports: the init's, or before a restore made one,
    /// the namespace's holder (dockerd configures the network through it).
    pub fn created_pid(&self) -> i32 {
        match self.init.pid {
            0 => self.netns.as_ref().and_then(NetnsHold::holder).unwrap_or(0),
            pid => pid,
        }
    }

    pub(super) fn release_netns_holder(&mut self) {
        if let Some(n) = &mut self.netns {
            n.release_holder();
        }
    }

    pub(super) fn remove_netns(&mut self) {
        if let Some(mut n) = self.netns.take() {
            n.remove();
        }
    }
}
