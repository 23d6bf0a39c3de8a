//! Exit statuses of the shim's children, delivered by pid.
//!
//! The shim is a subreaper and containerd-shim's signal loop reaps every child
//! with `waitpid(-1)`. So nobody may wait for a child directly: a caller takes a
//! `mark()` BEFORE spawning, then `watch(pid, mark)` once it knows the pid. An
//! exit reaped in between is kept as unclaimed and handed over, so no status is
//! ever lost to the race between spawning and watching.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};
use time::OffsetDateTime;
use tokio::sync::oneshot;

/// How many exits of pids nobody watched are remembered.
const UNCLAIMED_LIMIT: usize = 1024;

#[derive(Clone, Copy, Debug)]
pub struct Exit {
    pub code: i32,
    pub at: OffsetDateTime,
}

#[derive(Default)]
struct Inner {
    seq: u64,
    watchers: HashMap<i32, oneshot::Sender<Exit>>,
    unclaimed: VecDeque<(u64, i32, Exit)>,
}

#[derive(Clone, Default)]
pub struct Exits(Arc<Mutex<Inner>>);

/// A point in the exit sequence: exits after it can still be claimed.
#[derive(Clone, Copy, Debug)]
pub struct Mark(u64);

impl Exits {
    /// Starts delivering the reaper's exit events.
    pub async fn start() -> Self {
        let exits = Exits::default();
        let mut sub = monitor_subscribe(Topic::All)
            .await
            .expect("subscribing to the reaper cannot fail");
        let delivering = exits.clone();
        tokio::spawn(async move {
            while let Some(event) = sub.rx.recv().await {
                if let Subject::Pid(pid) = event.subject {
                    delivering.deliver(pid, event.exit_code);
                }
            }
        });
        exits
    }

    pub fn mark(&self) -> Mark {
        Mark(self.0.lock().unwrap().seq)
    }

    /// The exit of `pid`, which must have been spawned after `mark`.
    pub fn watch(&self, pid: i32, mark: Mark) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.0.lock().unwrap();
        let found = inner
            .unclaimed
            .iter()
            .position(|(seq, p, _)| *p == pid && *seq > mark.0);
        match found {
            Some(i) => {
                let (_, _, exit) = inner.unclaimed.remove(i).expect("index is valid");
                let _ = tx.send(exit);
            }
            None => {
                inner.watchers.insert(pid, tx);
            }
        }
        rx
    }

    pub(crate) fn deliver(&self, pid: i32, code: i32) {
        let exit = Exit {
            code,
            at: OffsetDateTime::now_utc(),
        };
        let mut inner = self.0.lock().unwrap();
        inner.seq += 1;
        if let Some(tx) = inner.watchers.remove(&pid) {
            let _ = tx.send(exit);
            return;
        }
        let seq = inner.seq;
        inner.unclaimed.push_back((seq, pid, exit));
        if inner.unclaimed.len() > UNCLAIMED_LIMIT {
            inner.unclaimed.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn exit_before_watch_is_claimed() {
        let exits = Exits::default();
        let mark = exits.mark();
        exits.deliver(42, 7);
        let exit = exits.watch(42, mark).await.unwrap();
        assert_eq!(exit.code, 7);
    }

    #[tokio::test]
    async fn exit_after_watch_is_delivered() {
        let exits = Exits::default();
        let mark = exits.mark();
        let rx = exits.watch(43, mark);
        exits.deliver(43, 137);
        assert_eq!(rx.await.unwrap().code, 137);
    }

    #[tokio::test]
    async fn exit_from_before_the_mark_is_not_claimed() {
        let exits = Exits::default();
        exits.deliver(44, 1);
        let mark = exits.mark();
        let mut rx = exits.watch(44, mark);
        assert!(
            rx.try_recv().is_err(),
            "a reused pid must not inherit an old exit"
        );
        exits.deliver(44, 0);
        assert_eq!(rx.await.unwrap().code, 0);
    }
}
