//! Task events published to containerd, in the order containerd expects.

use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::event::Event;
use containerd_shim_protos::ttrpc::context;
use log::warn;

#[derive(Clone)]
pub struct Events {
    publisher: std::sync::Arc<RemotePublisher>,
    namespace: String,
}

impl Events {
    pub fn new(publisher: RemotePublisher, namespace: &str) -> Self {
        Self {
            publisher: std::sync::Arc::new(publisher),
            namespace: namespace.to_string(),
        }
    }

    /// Queues an event; the publisher delivers in queue order and retries.
    pub async fn send(&self, event: impl Event + 'static) {
        let topic = event.topic();
        if let Err(e) = self
            .publisher
            .publish(
                context::Context::default(),
                &topic,
                &self.namespace,
                Box::new(event),
            )
            .await
        {
            warn!("publish {topic}: {e}");
        }
    }
}
