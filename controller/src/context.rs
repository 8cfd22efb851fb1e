//! Shared state of the reconcilers: what `byoh-controller run` was asked to do ([`Settings`]),
//! the clients and caches they read ([`Context`]) and this process's claim bookkeeping
//! ([`Claims`]).

use crate::cache::CacheReady;
use crate::metrics::Metrics;
use byoh_api::ByoHost;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Field manager of every server-side apply and update the controller makes.
pub const FIELD_MANAGER: &str = "byoh-controller";

/// `PostParams` of the controller's creates and replaces: field manager [`FIELD_MANAGER`].
pub fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

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
    /// Address of `/metrics` (HTTPS, each caller's token reviewed: `crate::metrics_auth`);
    /// `None` serves nothing.
    pub metrics_address: Option<SocketAddr>,
    /// Serve `/metrics` as plain HTTP to anyone who connects (no TLS, no token).
    pub insecure_metrics: bool,
    /// Address of `/healthz` and `/readyz` (plain HTTP); `None` serves nothing.
    pub health_address: Option<SocketAddr>,
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
    /// Namespace of the hosts' Leases (the provider's namespace, labelled
    /// [`byoh_api::labels::HOST_LEASES`]); the Lease of host `<ns>/<name>` is
    /// `<ns>.<name>` there ([`byoh_api::names::host_lease_name`]).
    pub host_lease_namespace: String,
    /// How long hosts are held back after failed bootstraps.
    pub bootstrap_backoff: crate::bootstrap_failures::BackOff,
    /// How long an administrator's re-enrolment permission allows one enrolment after it was
    /// set ([`crate::csr::CsrOptions::re_enrolment_window`]).
    pub re_enrolment_window: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            release_timeout: Duration::from_secs(600),
            metrics_address: None,
            insecure_metrics: false,
            health_address: None,
            leader_elect: false,
            leader_election_namespace: None,
            identity: None,
            manual_csr_approval: false,
            host_lease_namespace: byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE.into(),
            bootstrap_backoff: Default::default(),
            re_enrolment_window: crate::csr::DEFAULT_RE_ENROLMENT_WINDOW,
        }
    }
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
    /// Cache of the hosts' Leases (in [`Settings::host_lease_namespace`]; look one up with
    /// [`Context::host_lease`]).
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
    /// Publishes the reconcilers' Events ([`crate::events`]).
    pub recorder: kube::runtime::events::Recorder,
}

impl Context {
    /// The cached Lease of host `namespace/name`, if any.
    pub fn host_lease(&self, namespace: &str, name: &str) -> Option<Arc<Lease>> {
        self.leases.get(
            &kube::runtime::reflector::ObjectRef::new(&byoh_api::names::host_lease_name(
                namespace, name,
            ))
            .within(&self.settings.host_lease_namespace),
        )
    }
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
pub(crate) fn scoped_api<K>(client: &Client, settings: &Settings) -> Api<K>
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

/// Watcher configuration for the reconciled kinds, with the `--watch-filter` label.
pub(crate) fn watch_config(settings: &Settings) -> watcher::Config {
    let wc = watcher::Config::default().any_semantic();
    match &settings.watch_filter {
        Some(v) => wc.labels(&format!("{}={v}", crate::capi::WATCH_FILTER_LABEL)),
        None => wc,
    }
}

/// A clonable, `Sync` shutdown future.
pub type Shutdown = Shared<BoxFuture<'static, ()>>;
