//! A plain start: `runc start`, then, for a capture plan, the capture in
//! the background (a cold start can take minutes: Start must not wait).

use std::sync::Arc;

use containerd_shim_protos::events::task::TaskStart;

use super::capture::CaptureRun;
use crate::container::Container;
use crate::error::Result;
use crate::init_start::InitStart;
use crate::shared::Shared;

pub async fn start(shared: &Shared, c: &mut Container) -> Result<i32> {
    let started = c.run_start().await;
    if started.is_ok() {
        if let InitStart::Capture(plan) = &c.start {
            // The capture holds its own clone of the artifact lock; the
            // container holds the capture, to cancel it (capture_task.rs).
            let capture = CaptureRun::new(
                &c.id,
                c.bundle.clone(),
                c.runc.clone(),
                c.init.pid,
                c.init.stdio.terminal,
                plan,
            );
            let owner = shared.get(&c.id).map(|h| Arc::downgrade(&h));
            let owner = owner.unwrap_or_default();
            c.capture = Some(super::capture::spawn(capture, shared.exits.clone(), owner));
        }
    }
    c.start.release_lock();
    started?;
    shared.watch_oom(&c.id, c.init.pid);
    // Queued under the container's lock: before any exit of the capture's.
    publish_start(shared, c).await;
    Ok(c.init.pid)
}

/// TaskStart of `c`'s init; the caller holds the container's lock.
pub async fn publish_start(shared: &Shared, c: &Container) {
    shared
        .events
        .send(TaskStart {
            container_id: c.id.clone(),
            pid: c.init.pid as u32,
            ..Default::default()
        })
        .await;
}
