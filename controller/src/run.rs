//! The controller process: wires the HTTP servers (`serve.rs`), leader election (`leader.rs`), the
//! shared caches ([`crate::cache`]) and the reconcilers together, and shuts them down.
//!
//! [`run`] starts, in this order: the health and metrics servers, leader election (a
//! `coordination.k8s.io/v1` Lease [`LEADER_LEASE`] through `kube-lease-manager`), the shared
//! caches (ByoHosts and Leases: host selection reads them instead of listing the pool on every
//! reconcile), the ByoCluster, ByoMachine and ByoMachineTemplate controllers, and alongside
//! them the CSR approver
//! ([`crate::csr`]), the BootstrapKubeconfig reconciler ([`crate::bootstrapkubeconfig`]) and the
//! per-host access reconciler ([`crate::hostaccess`]). It returns when `shutdown`
//! resolves (SIGTERM in `main`): the controllers finish the reconciles in flight, and the
//! leader Lease is released so that a successor takes over at once. Losing leadership is an
//! error (the process exits and its Pod restarts), as in controller-runtime.

use crate::cache::{FanOut, cache_stream};
use crate::context::{Claims, Context, Shutdown, scoped_api, watch_config};
use crate::leader::{self, LeaderError};
use crate::metrics::Metrics;
use byoh_api::ByoHost;
use futures::StreamExt;
use futures::future::FutureExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector;
use kube::runtime::watcher;
use kube::{Api, Client};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::context::Settings;
pub use crate::leader::LEADER_LEASE;

/// Errors that end [`run`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The health or metrics server could not start.
    #[error(transparent)]
    Metrics(#[from] crate::serve::ServeError),
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

impl From<LeaderError> for RunError {
    fn from(e: LeaderError) -> Self {
        match e {
            LeaderError::Election { namespace, source } => {
                RunError::LeaderElection { namespace, source }
            }
            LeaderError::Lost { namespace } => RunError::LostLeadership { namespace },
        }
    }
}

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
    let mut servers = Vec::new();
    if let Some(addr) = settings.health_address {
        let endpoints = crate::serve::Endpoints {
            ready: Some(ready.clone()),
            ..Default::default()
        };
        let (bound, task) = crate::serve::serve(addr, endpoints, shutdown.clone()).await?;
        tracing::info!(address = %bound, "serving /healthz, /readyz");
        servers.push(task);
    }
    if let Some(addr) = settings.metrics_address {
        let guard = if settings.insecure_metrics {
            None
        } else {
            Some(Arc::new(
                crate::metrics_auth::MetricsAuth::new(client.clone())
                    .map_err(crate::serve::ServeError::from)?,
            ))
        };
        let secure = guard.is_some();
        let endpoints = crate::serve::Endpoints {
            metrics: Some(metrics.clone()),
            guard,
            ..Default::default()
        };
        let (bound, task) = crate::serve::serve(addr, endpoints, shutdown.clone()).await?;
        if secure {
            tracing::info!(address = %bound, "serving /metrics over HTTPS to callers allowed to get /metrics");
        } else {
            tracing::warn!(address = %bound, "serving /metrics as plain HTTP to anyone (--insecure-metrics)");
        }
        servers.push(task);
    }

    let identity = settings
        .identity
        .clone()
        .unwrap_or_else(leader::default_identity);
    let mut leadership = None;
    if settings.leader_elect {
        match leader::acquire(&client, &settings, &identity, shutdown.clone()).await? {
            Some(l) => leadership = Some(l),
            None => return Ok(()),
        }
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
        match &mut leadership {
            Some(leadership) => {
                tokio::select! {
                    r = controllers => r,
                    lost = leadership.lost() => Err(lost.into()),
                }
            }
            None => controllers.await,
        }
    };
    if let Some(leadership) = leadership {
        leadership.release().await;
    }
    for task in servers {
        task.abort();
    }
    result
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
    // Only the hosts' Leases (labelled by the agent, in the host-lease namespace).
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), &settings.host_lease_namespace);
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
        recorder: crate::events::recorder(client.clone(), identity.clone()),
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
    let byomachine_triggers = crate::byomachine::Triggers {
        hosts: host_events.subscribe(),
        leases: lease_events.subscribe(),
        clusters: cluster_events.subscribe(),
        machines: machine_events.subscribe(),
    };
    let byocluster_clusters = cluster_events.subscribe();
    let hostaccess_hosts = host_events.subscribe();
    let template_hosts = host_events.subscribe();
    let (liveness_hosts, liveness_leases) = (host_events.subscribe(), lease_events.subscribe());

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
        crate::byomachine::controller(ctx.clone(), byomachine_triggers, shutdown.clone());
    let byomachinetemplate =
        crate::byomachinetemplate::controller(ctx.clone(), template_hosts, shutdown.clone());
    let remediation = crate::remediation::controller(ctx.clone(), shutdown.clone());
    let liveness = crate::liveness::controller(
        ctx.clone(),
        liveness_hosts,
        liveness_leases,
        shutdown.clone(),
    );
    // The other reconcilers (their own modules; they run until dropped).
    let csr = crate::csr::run(
        client.clone(),
        crate::csr::CsrOptions {
            manual: ctx.settings.manual_csr_approval,
            instance: Some(identity),
            host_lease_namespace: ctx.settings.host_lease_namespace.clone(),
            re_enrolment_window: ctx.settings.re_enrolment_window,
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
            provider_namespace: ctx.settings.host_lease_namespace.clone(),
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
        () = async { tokio::join!(byocluster, byomachine, byomachinetemplate, liveness, remediation); } => {}
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
