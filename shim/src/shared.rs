//! What the task service and the work it spawns (exit watchers, restores,
//! captures) share: the containers by id, the event queue and the exit
//! reaper, with the exit and OOM watchers that publish through them. Its own
//! room, so the service (task.rs) and a start (lifecycle/) both use it without
//! importing each other.

use std::collections::HashMap;
use std::sync::Arc;

use containerd_shim::util::convert_to_timestamp;
use containerd_shim_protos::events::task::{TaskExit, TaskOOM};
use containerd_shim_protos::protobuf::MessageField;
use log::{debug, info, warn};
use tokio::sync::Mutex;

use crate::container::Container;
use crate::error::{Error, Result};
use crate::events::Events;
use crate::exits::{Exit, Exits, Mark};

/// One container, locked on its own.
pub type ContainerRef = Arc<Mutex<Container>>;
type Containers = Arc<std::sync::Mutex<HashMap<String, ContainerRef>>>;

/// What the service and the work it spawns (exit watchers, restores) share.
#[derive(Clone)]
pub struct Shared {
    pub(crate) containers: Containers,
    pub events: Events,
    pub exits: Exits,
}

impl Shared {
    pub(crate) fn get(&self, id: &str) -> Result<ContainerRef> {
        self.containers
            .lock()
            .expect("containers lock")
            .get(id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("container {id} not found")))
    }

    /// Publishes TaskOOM for every OOM kill in the memory cgroup of the
    /// init `pid` of `id`, until that cgroup goes.
    pub fn watch_oom(&self, id: &str, pid: i32) {
        let mut rx = match crate::oom::watch(pid as u32) {
            Ok(rx) => rx,
            Err(e) => {
                warn!("{id}: no OOM events: {e}");
                return;
            }
        };
        let (events, id) = (self.events.clone(), id.to_string());
        tokio::spawn(async move {
            while rx.recv().await.is_some() {
                info!("{id}: OOM kill in its memory cgroup");
                events
                    .send(TaskOOM {
                        container_id: id.clone(),
                        ..Default::default()
                    })
                    .await;
            }
        });
    }

    /// Records the exit of `pid` (spawned after `mark`) and publishes TaskExit.
    pub fn watch(&self, id: &str, exec_id: &str, pid: i32, mark: Mark) {
        let rx = self.exits.watch(pid, mark);
        let shared = self.clone();
        let (id, exec_id) = (id.to_string(), exec_id.to_string());
        tokio::spawn(async move {
            let Ok(exit) = rx.await else { return };
            let Ok(handle) = shared.get(&id) else { return };
            let mut c = handle.lock().await;
            if exec_id.is_empty() && c.holds_exit(pid, exit) {
                debug!(
                    "{id}: the restored copy (pid {pid}) exited with {}: held back",
                    exit.code
                );
                return;
            }
            let Ok(p) = c.process_mut(&exec_id) else {
                return;
            };
            if p.pid != pid || !p.set_exited(exit) {
                return;
            }
            debug!(
                "{id}/{}: pid {pid} exited with {}",
                p.display_id(),
                exit.code
            );
            shared.publish_exit(&id, &exec_id, pid, exit).await;
        });
    }

    /// TaskExit of process `exec_id` (empty: the init) of container `id`.
    pub async fn publish_exit(&self, id: &str, exec_id: &str, pid: i32, exit: Exit) {
        self.events
            .send(TaskExit {
                container_id: id.to_string(),
                id: if exec_id.is_empty() { id } else { exec_id }.to_string(),
                pid: pid as u32,
                exit_status: exit.code as u32,
                exited_at: MessageField::some(convert_to_timestamp(Some(exit.at))),
                ..Default::default()
            })
            .await;
    }

    /// The pod's sandbox is being killed (CRI's StopPodSandbox): restores
    /// of the pod's other containers in this shim are cancelled, as a kill
    /// of each would. CRI's StopContainer does nothing to a container whose
    /// StartContainer has not returned, so without this a restore would
    /// finish into a pod whose sandbox is gone and come up RUNNING, or fail
    /// on the vanished namespaces with a CRIU error instead of saying why.
    pub async fn cancel_restores_beside(&self, sandbox: &str) {
        let others: Vec<ContainerRef> = self
            .containers
            .lock()
            .expect("containers lock")
            .iter()
            .filter(|(id, _)| id.as_str() != sandbox)
            .map(|(_, c)| c.clone())
            .collect();
        for other in others {
            let c = other.lock().await;
            if let Some(cancel) = &c.starting {
                info!(
                    "{}: restore cancelled: pod sandbox {sandbox} is being stopped",
                    c.id
                );
                cancel.cancel();
            }
        }
    }
}
