//! The controller process: leader election, the reconcilers, shutdown.
//!
//! [`run`] starts, in this order: the metrics/health server, leader election (a
//! `coordination.k8s.io/v1` Lease [`LEADER_LEASE`] through `kube-lease-manager`), the shared
//! caches (ByoHosts and Leases: host selection reads them instead of listing the pool on every
//! reconcile), the ByoCluster and ByoMachine controllers, and alongside them the CSR approver
//! ([`crate::csr`]), the BootstrapKubeconfig reconciler ([`crate::bootstrapkubeconfig`]) and the
//! per-host access reconciler ([`crate::hostaccess`]). It returns when `shutdown`
//! resolves (SIGTERM in `main`): the controllers finish the reconciles in flight, and the
//! leader Lease is released so that a successor takes over at once. Losing leadership is an
//! error (the process exits and its Pod restarts), as in controller-runtime.

use crate::metrics::Metrics;
use byoh_api::ByoHost;
use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Field manager of every server-side apply and update the controller makes.
pub const FIELD_MANAGER: &str = "byoh-controller";

/// Name of the leader-election Lease (in the controller's namespace).
pub const LEADER_LEASE: &str = "byoh-controller-leader";

/// Reconciles running at once per controller.
pub const CONCURRENCY: u16 = 32;

/// How long an in-process reservation of a host (a claim in flight, or made but not yet seen
/// in the cache) keeps other reconciles of this process away from it.
pub const RESERVATION_TTL: Duration = Duration::from_secs(30);

/// What `byoh-controller run` was asked to do.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace; `None` watches all.
    pub namespace: Option<String>,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// How long a release waits for the agent's clean-up before the claim is dropped and the
    /// host marked `needsCleanup` (reason `ReleaseTimedOut`).
    pub release_timeout: Duration,
    /// Address of `/metrics`, `/healthz`, `/readyz`; `None` serves nothing.
    pub metrics_address: Option<SocketAddr>,
    /// Take part in leader election before reconciling.
    pub leader_elect: bool,
    /// Namespace of the leader Lease; `None` uses the Pod's namespace (service account file)
    /// or the client's default namespace.
    pub leader_election_namespace: Option<String>,
    /// Identity in the leader Lease (and the reporting instance of Events); `None` uses the
    /// host name plus a random suffix.
    pub identity: Option<String>,
    /// Never approve host CSRs; they wait for `kubectl certificate approve`.
    pub manual_csr_approval: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            release_timeout: Duration::from_secs(600),
            metrics_address: None,
            leader_elect: false,
            leader_election_namespace: None,
            identity: None,
            manual_csr_approval: false,
        }
    }
}

/// Errors of a reconcile; [`Error::metric_label`] names the kind in
/// `byoh_controller_reconcile_errors_total`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, to which object.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// The finalizer helper failed (adding or removing a finalizer, or the reconcile inside).
    #[error("finalizer of {object}: {source}")]
    Finalizer {
        /// The object.
        object: String,
        /// The error.
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },
    /// An object lacks something the reconcile needs (a name, a namespace, a UID).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// The error kind as a metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Finalizer { .. } => "finalizer",
            Error::Invalid(_) => "invalid",
        }
    }

    /// A closure wrapping a [`kube::Error`] with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}

/// Whether a client error is `409 Conflict`.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Whether a client error is `404 Not Found`.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Shared state of the reconcilers.
pub struct Context {
    /// Client of the management cluster.
    pub client: Client,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings of this run.
    pub settings: Settings,
    /// Cache of every watched ByoHost.
    pub hosts: Store<ByoHost>,
    /// Cache of every watched Lease (a host's Lease has the host's name and namespace).
    pub leases: Store<Lease>,
    /// Cache of CAPI Clusters (read by the ByoMachine reconciler; confirmed with a read from
    /// the API server before it decides to wait).
    pub clusters: Store<crate::capi::Cluster>,
    /// Cache of CAPI Machines (as [`Context::clusters`]).
    pub machines: Store<crate::capi::Machine>,
    /// Whether [`Context::machines`] holds its first full list: until then a Machine missing
    /// from it may still exist, so hosts held for a previous Machine stay held.
    pub machines_ready: CacheReady,
    /// Whether [`Context::hosts`] holds its first full list (after a start or a leader change,
    /// selection and release wait for it).
    pub hosts_ready: CacheReady,
    /// Whether [`Context::leases`] holds its first full list: until then a missing Lease would
    /// read as "host offline" and a release would skip the agent's graceful clean-up.
    pub leases_ready: CacheReady,
    /// In-process bookkeeping of claims (see [`Claims`]).
    pub claims: Mutex<Claims>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// In-process bookkeeping of claims. The API server's optimistic concurrency is what makes
/// claims safe; this only keeps this process's own reconciles from racing each other for the
/// same host and bridges the time until the cache shows a claim just made.
#[derive(Debug, Default)]
pub struct Claims {
    /// Hosts (`namespace/name`) with a claim in flight or just made, and since when.
    pub reserved: HashMap<String, Instant>,
    /// Claims this process made, by ByoMachine UID: the host as the claim update returned it.
    pub made: HashMap<String, (Arc<ByoHost>, Instant)>,
    /// When each ByoMachine (by UID) was first seen ready to claim (claim latency metric).
    pub ready_since: HashMap<String, Instant>,
}

impl Claims {
    /// Drops reservations and remembered claims older than [`RESERVATION_TTL`].
    pub fn expire(&mut self, now: Instant) {
        self.reserved
            .retain(|_, t| now.duration_since(*t) < RESERVATION_TTL);
        self.made
            .retain(|_, (_, t)| now.duration_since(*t) < RESERVATION_TTL);
    }

    /// The reserved host keys.
    pub fn reserved_keys(&self) -> HashSet<String> {
        self.reserved.keys().cloned().collect()
    }
}

impl Context {
    /// Locks [`Context::claims`], recovering from a poisoned lock (the data stays consistent:
    /// every update is a single map operation).
    pub fn claims(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Watcher configuration for the reconciled kinds, with the `--watch-filter` label.
    pub fn watch_config(&self) -> watcher::Config {
        watch_config(&self.settings)
    }

    /// Api of a namespaced kind in the watched namespace (or all namespaces).
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        scoped_api(&self.client, &self.settings)
    }
}

/// Api of a namespaced kind in the watched namespace (`--namespace`), or all namespaces.
fn scoped_api<K>(client: &Client, settings: &Settings) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    match &settings.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn watch_config(settings: &Settings) -> watcher::Config {
    let wc = watcher::Config::default().any_semantic();
    match &settings.watch_filter {
        Some(v) => wc.labels(&format!("{}={v}", crate::capi::WATCH_FILTER_LABEL)),
        None => wc,
    }
}

/// Errors that end [`run`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The metrics server could not start.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::ServeError),
    /// Leader election failed.
    #[error("leader election with Lease {namespace}/{LEADER_LEASE}: {source}")]
    LeaderElection {
        /// Namespace of the Lease.
        namespace: String,
        /// The error.
        source: kube_lease_manager::LeaseManagerError,
    },
    /// A component (CSR approver, bootstrap kubeconfigs) stopped with an error.
    #[error("{component} stopped: {message}")]
    Component {
        /// The component.
        component: &'static str,
        /// Its error, with context.
        message: String,
    },
    /// This instance lost the leader Lease; it stops so that only the new leader reconciles.
    #[error(
        "lost the leader Lease {namespace}/{LEADER_LEASE}; exiting so that only the new leader reconciles"
    )]
    LostLeadership {
        /// Namespace of the Lease.
        namespace: String,
    },
}

/// A clonable, `Sync` shutdown future.
pub type Shutdown = Shared<BoxFuture<'static, ()>>;

/// Runs the controller until `shutdown` resolves.
///
/// # Errors
/// [`RunError`] when the metrics address cannot be bound, leader election fails, or leadership
/// is lost.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let shutdown: Shutdown = shutdown.boxed().shared();
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let server = match settings.metrics_address {
        Some(addr) => {
            let (bound, task) =
                crate::metrics::serve(addr, metrics.clone(), ready.clone(), shutdown.clone())
                    .await?;
            tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");
            Some(task)
        }
        None => None,
    };

    let identity = settings.identity.clone().unwrap_or_else(default_identity);
    let mut leader = None;
    if settings.leader_elect {
        let namespace = leader_namespace(&client, &settings);
        let identity = settings
            .identity
            .clone()
            .unwrap_or_else(|| identity.clone());
        let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), LEADER_LEASE)
            .with_namespace(&namespace)
            .with_identity(&identity)
            .with_duration(15)
            .with_grace(5)
            .with_field_manager(FIELD_MANAGER)
            .build()
            .await
            .map_err(|source| RunError::LeaderElection {
                namespace: namespace.clone(),
                source,
            })?;
        let (mut is_leader, task) = manager.watch().await;
        tracing::info!(%identity, lease = %format!("{namespace}/{LEADER_LEASE}"), "waiting for leadership");
        loop {
            if *is_leader.borrow_and_update() {
                break;
            }
            tokio::select! {
                () = shutdown.clone() => {
                    drop(is_leader);
                    let _ = task.await;
                    return Ok(());
                }
                changed = is_leader.changed() => if changed.is_err() {
                    return Err(RunError::LostLeadership { namespace });
                },
            }
        }
        tracing::info!(%identity, "became leader");
        leader = Some((is_leader, task, namespace));
    }

    let result = {
        let controllers = run_controllers(
            client.clone(),
            settings,
            identity,
            metrics,
            ready,
            shutdown.clone(),
        );
        match &mut leader {
            Some((is_leader, _, namespace)) => {
                let lost = async {
                    while is_leader.changed().await.is_ok() {
                        if !*is_leader.borrow() {
                            break;
                        }
                    }
                };
                tokio::select! {
                    r = controllers => r,
                    () = lost => Err(RunError::LostLeadership { namespace: namespace.clone() }),
                }
            }
            None => controllers.await,
        }
    };
    if let Some((is_leader, task, _)) = leader {
        // Closing the channel makes the lease manager release the Lease.
        drop(is_leader);
        let _ = task.await;
    }
    if let Some(task) = server {
        task.abort();
    }
    result
}

/// Events of a shared cache as a reconciler receives them: each object the cache changed or
/// deleted, after the cache holds the change.
pub type Events<K> = futures::channel::mpsc::Receiver<Arc<K>>;

/// Objects buffered per subscriber of a cache's events before the cache waits for it.
const EVENT_BUFFER: usize = 1024;

/// The subscribers of a cache's events.
struct FanOut<K> {
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
    fn subscribe(&mut self) -> Events<K> {
        let (tx, rx) = futures::channel::mpsc::channel(EVENT_BUFFER);
        self.subscribers.push(tx);
        rx
    }

    /// Hands `obj` to every subscriber (waiting while one's buffer is full); a subscriber
    /// that has stopped is skipped.
    async fn publish(mut self, obj: K) -> Self {
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

fn leader_namespace(client: &Client, settings: &Settings) -> String {
    settings
        .leader_election_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| client.default_namespace().to_string())
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "byoh-controller".into());
    format!("{host}-{}", crate::byomachine::random_suffix(6))
}

async fn run_controllers(
    client: Client,
    settings: Settings,
    identity: String,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let (hosts, hosts_writer) = reflector::store::<ByoHost>();
    let (leases, leases_writer) = reflector::store::<Lease>();
    let clusters_writer = reflector::store::Writer::new(crate::capi::cluster_resource());
    let machines_writer = reflector::store::Writer::new(crate::capi::machine_resource());
    let (clusters, machines) = (clusters_writer.as_reader(), machines_writer.as_reader());
    let (cluster_api, machine_api) = match &settings.namespace {
        Some(ns) => (
            crate::capi::clusters(client.clone(), ns),
            crate::capi::machines(client.clone(), ns),
        ),
        None => (
            Api::all_with(client.clone(), &crate::capi::cluster_resource()),
            Api::all_with(client.clone(), &crate::capi::machine_resource()),
        ),
    };
    let (cluster_cache, _) = cache_stream(
        clusters_writer,
        watcher(cluster_api, watch_config(&settings)),
        "Cluster",
    );
    let (machine_cache, machines_ready) = cache_stream(
        machines_writer,
        watcher(machine_api, watch_config(&settings)),
        "Machine",
    );
    let host_api: Api<ByoHost> = scoped_api(&client, &settings);
    let (host_cache, hosts_ready) = cache_stream(
        hosts_writer,
        watcher(host_api, watcher::Config::default().any_semantic()),
        "ByoHost",
    );
    // Only the hosts' Leases (labelled by the agent), not every Lease of the cluster.
    let lease_api: Api<Lease> = scoped_api(&client, &settings);
    let (lease_cache, leases_ready) = cache_stream(
        leases_writer,
        watcher(
            lease_api,
            watcher::Config::default()
                .labels(byoh_api::labels::HOST)
                .any_semantic(),
        ),
        "Lease",
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics,
        hosts,
        leases,
        clusters,
        machines,
        machines_ready,
        hosts_ready: hosts_ready.clone(),
        leases_ready: leases_ready.clone(),
        claims: Mutex::new(Claims::default()),
        settings,
    });

    // The shared caches. Each cache's stream hands every object it changes (or deletes), once
    // the cache holds the change, to the reconcilers that react to it: they never see an
    // event before the cache they read, and each kind is watched once. The host stream also
    // clears clean-up marks the agent has honoured.
    let mut host_events = FanOut::default();
    let mut lease_events = FanOut::default();
    let mut cluster_events = FanOut::default();
    let mut machine_events = FanOut::default();
    let byomachine_events = crate::byomachine::Events {
        hosts: host_events.subscribe(),
        leases: lease_events.subscribe(),
        clusters: cluster_events.subscribe(),
        machines: machine_events.subscribe(),
    };
    let byocluster_clusters = cluster_events.subscribe();
    let hostaccess_hosts = host_events.subscribe();

    let host_ctx = ctx.clone();
    let host_cache = host_cache
        .map(move |host| {
            crate::byomachine::on_host_event(&host_ctx, &host);
            host
        })
        .fold(host_events, FanOut::publish);
    let lease_cache = lease_cache.fold(lease_events, FanOut::publish);

    let cluster_cache = cluster_cache.fold(cluster_events, FanOut::publish);
    let machine_cache = machine_cache.fold(machine_events, FanOut::publish);

    let gauges_ctx = ctx.clone();
    let gauges = async move {
        loop {
            crate::byomachine::update_host_gauges(&gauges_ctx);
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    };

    let readiness = async move {
        futures::future::join(hosts_ready.wait(), leases_ready.wait()).await;
        ready.store(true, Ordering::Relaxed);
        tracing::info!("ByoHost and Lease caches are filled");
    };

    let byocluster =
        crate::byocluster::controller(ctx.clone(), byocluster_clusters, shutdown.clone());
    let byomachine =
        crate::byomachine::controller(ctx.clone(), byomachine_events, shutdown.clone());
    // The other reconcilers (their own modules; they run until dropped).
    let csr = crate::csr::run(
        client.clone(),
        crate::csr::CsrOptions {
            manual: ctx.settings.manual_csr_approval,
            instance: Some(identity),
        },
    );
    let bootstrap_kubeconfigs = crate::bootstrapkubeconfig::run(
        client.clone(),
        crate::bootstrapkubeconfig::BootstrapKubeconfigOptions {
            namespace: ctx.settings.namespace.clone(),
        },
    );
    let host_access = crate::hostaccess::run_shared(
        client.clone(),
        crate::hostaccess::HostAccessOptions {
            namespace: ctx.settings.namespace.clone(),
        },
        ctx.hosts.clone(),
        hostaccess_hosts,
    );
    let component = |component: &'static str, r: anyhow::Result<()>| match r {
        Ok(()) => Ok(()),
        Err(e) => Err(RunError::Component {
            component,
            message: format!("{e:#}"),
        }),
    };

    // The controllers end on `shutdown` after finishing the reconciles in flight; the
    // caches and gauges never end on their own.
    tokio::select! {
        () = async { tokio::join!(byocluster, byomachine); } => {}
        _ = host_cache => {}
        _ = lease_cache => {}
        _ = cluster_cache => {}
        _ = machine_cache => {}
        () = gauges => {}
        () = readiness.then(|()| futures::future::pending::<()>()) => {}
        r = csr => return component("CSR approver", r),
        r = bootstrap_kubeconfigs => return component("BootstrapKubeconfig reconciler", r),
        r = host_access => return component("per-host access reconciler", r),
    }
    tracing::info!("controllers stopped");
    Ok(())
}
