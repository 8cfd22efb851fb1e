//! The shared caches: each kind is watched once (without `managedFields`), and every object a
//! cache changes or deletes is handed, after the cache holds the change, to the reconcilers
//! that subscribed to it (`FanOut`); plus each cache's readiness ([`CacheReady`]).

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;

/// A reconciler's subscription to a shared cache (fed by `FanOut`): each object the cache changed or
/// deleted, after the cache holds the change.
pub type Subscription<K> = futures::channel::mpsc::Receiver<Arc<K>>;

/// Objects buffered per subscriber of a cache's events before the cache waits for it.
const EVENT_BUFFER: usize = 1024;

/// The subscribers of a cache's events.
pub(crate) struct FanOut<K> {
    subscribers: Vec<futures::channel::mpsc::Sender<Arc<K>>>,
}

impl<K> Default for FanOut<K> {
    fn default() -> Self {
        Self {
            subscribers: Vec::new(),
        }
    }
}

impl<K> FanOut<K> {
    pub(crate) fn subscribe(&mut self) -> Subscription<K> {
        let (tx, rx) = futures::channel::mpsc::channel(EVENT_BUFFER);
        self.subscribers.push(tx);
        rx
    }

    /// Hands `obj` to every subscriber (waiting while one's buffer is full); a subscriber
    /// that has stopped is skipped.
    pub(crate) async fn publish(mut self, obj: K) -> Self {
        use futures::SinkExt as _;
        let obj = Arc::new(obj);
        for tx in &mut self.subscribers {
            let _ = tx.send(obj.clone()).await;
        }
        self
    }
}

/// Readiness of a cache (its first list applied) that any number of tasks may wait for.
/// kube's `Store::wait_until_ready` wakes only one of several concurrent waiters (it polls
/// one `futures` oneshot receiver, which keeps the last waker only), and the controllers
/// built on a store already wait on it.
#[derive(Clone, Debug)]
pub struct CacheReady(tokio::sync::watch::Receiver<bool>);

impl CacheReady {
    /// A readiness flag and the function that raises it on a watch's `InitDone` event.
    pub(crate) fn new<K>() -> (Self, impl FnMut(&watcher::Result<watcher::Event<K>>)) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let raise = move |event: &watcher::Result<watcher::Event<K>>| {
            if matches!(event, Ok(watcher::Event::InitDone)) {
                tx.send_replace(true);
            }
        };
        (Self(rx), raise)
    }

    /// Whether the cache holds its first full list.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the cache holds its first full list (never, if its watch stopped
    /// before).
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        if rx.wait_for(|ready| *ready).await.is_err() {
            futures::future::pending::<()>().await;
        }
    }
}

/// The stream of a shared cache: the watch, without `managedFields`, applied to `writer`'s
/// store, then each changed or deleted object (watch errors are logged and retried with
/// backoff); and the cache's readiness.
pub(crate) fn cache_stream<K>(
    writer: reflector::store::Writer<K>,
    watch: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
    kind: &'static str,
) -> (impl futures::Stream<Item = K> + Send, CacheReady)
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (ready, raise) = CacheReady::new();
    let stream = reflector::reflector(writer, watch.modify(drop_managed_fields))
        .default_backoff()
        .inspect(raise)
        .touched_objects()
        .filter_map(move |obj| {
            futures::future::ready(match obj {
                Ok(obj) => Some(obj),
                Err(e) => {
                    tracing::warn!(error = %e, "{kind} watch (retrying)");
                    None
                }
            })
        });
    (stream, ready)
}

/// Runs `results` (a controller's reconcile results) to their end, logging each failed
/// reconcile of `what` at debug level: the reconciler's error policy has counted and logged it
/// already.
pub(crate) async fn drain<T, E: std::fmt::Display>(
    results: impl futures::Stream<Item = Result<T, E>>,
    what: &'static str,
) {
    results
        .for_each(|result| {
            if let Err(error) = result {
                tracing::debug!(%error, "{what} reconcile");
            }
            futures::future::ready(())
        })
        .await;
}

/// A `Controller` of `api`'s kind whose own cache does without `managedFields` (as
/// `Controller::new` otherwise).
pub(crate) fn controller_for<K>(api: Api<K>, wc: watcher::Config) -> kube::runtime::Controller<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, wc).modify(drop_managed_fields))
        .default_backoff()
        .applied_objects();
    kube::runtime::Controller::for_stream(stream, store)
}

/// Cached objects do without `metadata.managedFields` (often the larger part of an object).
/// An update built from a cached object then omits the field, which leaves the server's
/// record as it is.
pub(crate) fn drop_managed_fields<K: kube::Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}
