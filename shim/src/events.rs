//! Task events published to containerd, in the order containerd expects.
//!
//! containerd-shim's `RemotePublisher` reconnects only on some ttrpc errors
//! and drops an event after five tries; once containerd restarts, its client
//! fails with "channel closed", which it never reconnects on, so every later
//! event (TaskExit and TaskDelete included) is lost. Kubernetes learns of
//! container exits only through those events.
//!
//! This publisher keeps one bounded queue and one sender task. The sender
//! delivers strictly in queue order: on any failure it drops the connection,
//! waits (a capped backoff), reconnects to containerd's ttrpc address and
//! retries the same event, for as long as the shim lives. Only an event that
//! containerd itself rejects as invalid is given up on, since retrying it
//! could never succeed and would hold back every event behind it.
//!
//! The shim sends through [`Events`], a handle on an [`EventSender`]: the
//! publisher here, or in unit tests a fake that records each event (the
//! order of TaskCreate, TaskStart and TaskExit is then a unit's to prove).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::any::{pack, Named};
use async_trait::async_trait;
use containerd_shim::event::Event;
use containerd_shim::util::timestamp;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::shim::event::Envelope;
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::{Client, EventsClient};
use containerd_shim_protos::ttrpc;
use containerd_shim_protos::ttrpc::context;
use containerd_shim_protos::ttrpc::r#async::transport::Socket;
use log::{debug, error, info, warn};
use tokio::sync::mpsc;

/// Events waiting for delivery; far more than a shim's containers produce
/// while containerd restarts.
const QUEUE_CAPACITY: usize = 1024;
/// How long `send` waits for room in a full queue before dropping the event.
const ENQUEUE_WAIT: Duration = Duration::from_secs(5);
/// One connection attempt to containerd.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One Forward request, so a hung containerd cannot stall the queue forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The wait after the first failed attempt, doubling up to `BACKOFF_MAX`.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// While one event keeps failing, a warning every this many attempts
/// (about once a minute at the capped backoff); debug in between.
const WARN_EVERY: u32 = 30;

/// Where the shim's events go, each packed, in the order they are sent.
#[async_trait]
pub trait EventSender: Send + Sync {
    /// Queues `event`, published under `topic` after every event sent
    /// before it.
    async fn send_packed(&self, topic: String, event: Any);
}

/// The shim's handle on its event sender.
#[derive(Clone)]
pub struct Events(Arc<dyn EventSender>);

impl Events {
    /// Publishes to containerd's ttrpc `address` (its `TTRPC_ADDRESS`),
    /// connecting when the first event is sent: the server serves before it.
    pub fn new(address: String, namespace: &str) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(deliver_in_order(
            pending,
            Containerd::new(address),
            Backoff::new(BACKOFF_FIRST, BACKOFF_MAX),
        ));
        Self::through(Arc::new(Publisher {
            queue,
            namespace: namespace.into(),
        }))
    }

    /// Events sent through `sender`.
    pub fn through(sender: Arc<dyn EventSender>) -> Self {
        Self(sender)
    }

    /// Queues an event and returns; it is delivered after every event
    /// queued before it.
    pub async fn send<E: Event + Named>(&self, event: E) {
        let topic = event.topic();
        match pack(&event) {
            Ok(packed) => self.0.send_packed(topic, packed).await,
            Err(e) => error!("dropped event {topic}: cannot encode it: {e}"),
        }
    }
}

/// The publisher: one bounded queue, drained by one sender task that
/// retries each event until containerd takes it.
struct Publisher {
    queue: mpsc::Sender<Envelope>,
    namespace: Arc<str>,
}

#[async_trait]
impl EventSender for Publisher {
    async fn send_packed(&self, topic: String, event: Any) {
        let envelope = match envelope(&topic, &self.namespace, event) {
            Ok(envelope) => envelope,
            Err(e) => {
                error!("dropped event {topic}: cannot stamp it: {e}");
                return;
            }
        };
        match self.queue.send_timeout(envelope, ENQUEUE_WAIT).await {
            Ok(()) => {}
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => error!(
                "dropped event {topic}: the queue stayed full ({QUEUE_CAPACITY} events) for {ENQUEUE_WAIT:?}"
            ),
            Err(mpsc::error::SendTimeoutError::Closed(_)) => {
                error!("dropped event {topic}: the event sender has stopped")
            }
        }
    }
}

/// The envelope containerd's `Events.Forward` takes, as `RemotePublisher`
/// builds it: stamped when queued, not when delivered.
fn envelope(topic: &str, namespace: &str, event: Any) -> containerd_shim::error::Result<Envelope> {
    let mut envelope = Envelope::new();
    envelope.set_topic(topic.to_owned());
    envelope.set_namespace(namespace.to_owned());
    envelope.set_timestamp(timestamp()?);
    envelope.set_event(event);
    Ok(envelope)
}

/// Capped exponential backoff between attempts at one event.
#[derive(Debug, Clone)]
struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next attempt.
    fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    /// After a delivery: the next failure starts from `first` again.
    fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Why one delivery attempt failed.
#[derive(Debug)]
enum Failure {
    /// Not delivered (no connection, a transport error, a timeout, or an
    /// error status that may pass); the same event is tried again.
    Retry(String),
    /// containerd answered that the event itself is invalid; retrying
    /// cannot succeed.
    Rejected(String),
}

/// Where events go: one attempt at one envelope, connecting first if
/// needed; after a failure the next attempt starts from a new connection.
trait Sink {
    fn deliver(&mut self, envelope: &Envelope) -> impl Future<Output = Result<(), Failure>> + Send;
}

/// Takes events off the queue one at a time and does not take the next
/// until this one is delivered (or rejected): order is the queue's order.
/// Ends when every `Events` handle is gone and the queue is empty.
async fn deliver_in_order(
    mut pending: mpsc::Receiver<Envelope>,
    mut sink: impl Sink,
    mut backoff: Backoff,
) {
    while let Some(envelope) = pending.recv().await {
        let topic = envelope.topic();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match sink.deliver(&envelope).await {
                Ok(()) => {
                    if attempts > 1 {
                        info!("delivered event {topic} after {attempts} attempts");
                    }
                    break;
                }
                Err(Failure::Rejected(e)) => {
                    error!("dropped event {topic}: containerd rejected it: {e}");
                    break;
                }
                Err(Failure::Retry(e)) => {
                    let delay = backoff.next_delay();
                    if attempts % WARN_EVERY == 1 {
                        warn!("publish {topic} (attempt {attempts}) failed, retrying in {delay:?}: {e}");
                    } else {
                        debug!("publish {topic} (attempt {attempts}) failed, retrying in {delay:?}: {e}");
                    }
                    tokio::time::sleep(delay).await;
                }
            }
        }
        backoff.reset();
    }
    debug!("event sender stopped: no more events");
}

/// containerd's ttrpc events service.
struct Containerd {
    address: String,
    client: Option<EventsClient>,
}

impl Containerd {
    fn new(address: String) -> Self {
        Self {
            address,
            client: None,
        }
    }

    async fn connect(&self) -> Result<EventsClient, String> {
        let path = self
            .address
            .strip_prefix("unix://")
            .unwrap_or(&self.address);
        // A non-blocking connect: a blocking one could hang the shim's only
        // thread on a containerd that does not accept.
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
            .await
            .map_err(|_| format!("connect {path}: timed out after {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("connect {path}: {e}"))?;
        Ok(EventsClient::new(Client::new(Socket::from(stream))))
    }
}

impl Sink for Containerd {
    async fn deliver(&mut self, envelope: &Envelope) -> Result<(), Failure> {
        let client = match &self.client {
            Some(client) => client,
            None => self
                .client
                .insert(self.connect().await.map_err(Failure::Retry)?),
        };
        let mut req = ForwardRequest::new();
        req.set_envelope(envelope.clone());
        let ctx = context::with_timeout(REQUEST_TIMEOUT.as_nanos() as i64);
        match client.forward(ctx, &req).await {
            Ok(_) => Ok(()),
            Err(ttrpc::Error::RpcStatus(status))
                if status.code() == ttrpc::Code::INVALID_ARGUMENT =>
            {
                Err(Failure::Rejected(format!("{status:?}")))
            }
            Err(e) => {
                // Whatever broke, the next attempt starts from a fresh connection.
                self.client = None;
                Err(Failure::Retry(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    #[test]
    fn backoff_doubles_from_50ms_to_a_2s_cap_and_resets() {
        let mut b = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
        let ms: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(50));
    }

    fn env(topic: &str) -> Envelope {
        let mut e = Envelope::new();
        e.set_topic(topic.to_owned());
        e
    }

    /// Answers attempts from a script (then succeeds), recording each one.
    #[derive(Clone, Default)]
    struct Scripted {
        answers: Arc<Mutex<VecDeque<Result<(), Failure>>>>,
        attempts: Arc<Mutex<Vec<String>>>,
        delivered: Arc<Mutex<Vec<String>>>,
    }

    impl Sink for Scripted {
        async fn deliver(&mut self, envelope: &Envelope) -> Result<(), Failure> {
            let topic = envelope.topic().to_string();
            self.attempts.lock().unwrap().push(topic.clone());
            let answer = self.answers.lock().unwrap().pop_front().unwrap_or(Ok(()));
            if answer.is_ok() {
                self.delivered.lock().unwrap().push(topic);
            }
            answer
        }
    }

    fn run(sink: Scripted, topics: &[&str]) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
            for t in topics {
                tx.send(env(t)).await.unwrap();
            }
            drop(tx);
            let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
            tokio::time::timeout(Duration::from_secs(10), deliver_in_order(rx, sink, backoff))
                .await
                .expect("the sender finishes once the queue is drained");
        });
    }

    fn retry() -> Result<(), Failure> {
        Err(Failure::Retry("containerd is away".into()))
    }

    #[test]
    fn a_failing_event_is_retried_before_any_later_one() {
        let sink = Scripted::default();
        sink.answers
            .lock()
            .unwrap()
            .extend([retry(), retry(), retry(), Ok(()), retry(), Ok(())]);
        run(
            sink.clone(),
            &["/tasks/exit", "/tasks/delete", "/tasks/create"],
        );
        assert_eq!(
            *sink.attempts.lock().unwrap(),
            [
                "/tasks/exit",
                "/tasks/exit",
                "/tasks/exit",
                "/tasks/exit",
                "/tasks/delete",
                "/tasks/delete",
                "/tasks/create",
            ]
        );
        assert_eq!(
            *sink.delivered.lock().unwrap(),
            ["/tasks/exit", "/tasks/delete", "/tasks/create"]
        );
    }

    #[test]
    fn retries_do_not_give_up() {
        let sink = Scripted::default();
        sink.answers
            .lock()
            .unwrap()
            .extend((0..200).map(|_| retry()));
        run(sink.clone(), &["/tasks/exit"]);
        assert_eq!(sink.attempts.lock().unwrap().len(), 201);
        assert_eq!(*sink.delivered.lock().unwrap(), ["/tasks/exit"]);
    }

    #[test]
    fn an_event_containerd_rejects_does_not_hold_back_the_rest() {
        let sink = Scripted::default();
        sink.answers
            .lock()
            .unwrap()
            .push_back(Err(Failure::Rejected("invalid".into())));
        run(sink.clone(), &["/tasks/bad", "/tasks/exit"]);
        assert_eq!(
            *sink.attempts.lock().unwrap(),
            ["/tasks/bad", "/tasks/exit"]
        );
        assert_eq!(*sink.delivered.lock().unwrap(), ["/tasks/exit"]);
    }

    #[test]
    fn envelopes_carry_topic_namespace_timestamp_and_the_event() {
        use containerd_shim_protos::events::task::TaskExit;
        let exit = TaskExit {
            container_id: "c1".into(),
            exit_status: 137,
            ..Default::default()
        };
        let e = envelope("/tasks/exit", "k8s.io", pack(&exit).unwrap()).unwrap();
        assert_eq!(e.topic(), "/tasks/exit");
        assert_eq!(e.namespace(), "k8s.io");
        assert!(e.timestamp().seconds > 0);
        assert_eq!(e.event().type_url, "containerd.events.TaskExit");
        assert!(!e.event().value.is_empty());
    }
}
