//! ByoCluster reconciler (CAPI InfraCluster contract v1beta2).
//!
//! - Skips ByoClusters annotated `cluster.x-k8s.io/managed-by` and those without an owner
//!   Cluster yet (any ownerRef of kind `Cluster` in group `cluster.x-k8s.io`, any version).
//! - Adds the finalizer [`byoh_api::finalizers::BYOCLUSTER`].
//! - Paused (`Cluster.spec.paused` or the `cluster.x-k8s.io/paused` annotation on either
//!   object): reports `Paused=True` and does nothing else.
//! - Takes the endpoint from `spec.controlPlaneEndpoint`, else mirrors the Cluster's; the port
//!   defaults to 6443. `status.initialization.provisioned` becomes true once the endpoint host
//!   is known, and never flips back. `spec.failureDomains` is mirrored to the status.
//! - Deletion waits only while ByoMachines of the cluster exist (never on ByoHosts).

use crate::cache::Subscription;
use crate::capi::{self, Cluster};
use crate::context::{CONCURRENCY, Context, FIELD_MANAGER, Shutdown};
use crate::error::Error;
use byoh_api::common::{ApiEndpoint, Initialization};
use byoh_api::conditions::{self, reasons, types};
use byoh_api::{ByoCluster, ByoClusterStatus, ByoMachine, finalizers, labels};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// Default API server port of a control plane endpoint.
pub const DEFAULT_PORT: i32 = 6443;

/// Name of this reconciler in metrics and logs.
pub const NAME: &str = "byocluster";

/// The name of the Cluster owning `obj` (an ownerRef of kind `Cluster` in group
/// `cluster.x-k8s.io`, any version, controller or not).
pub fn owner_cluster(obj: &impl Resource) -> Option<String> {
    obj.meta().owner_references.as_ref()?.iter().find_map(|r| {
        (r.kind == "Cluster" && r.api_version.split('/').next() == Some(capi::GROUP))
            .then(|| r.name.clone())
    })
}

fn annotated(obj: &impl Resource, key: &str) -> bool {
    obj.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// The ByoCluster a CAPI Cluster's `spec.infrastructureRef` names, if it names one.
fn infrastructure_of(cluster: &Cluster) -> Option<ObjectRef<ByoCluster>> {
    let ns = cluster.namespace()?;
    let r = cluster.spec.infrastructure_ref.as_ref()?;
    (r.kind == "ByoCluster").then(|| ObjectRef::new(&r.name).within(&ns))
}

/// The ByoCluster controller, ending when `shutdown` resolves. `cluster_events` are the
/// shared Cluster cache's events (see [`crate::cache`]).
pub fn controller(
    ctx: Arc<Context>,
    cluster_events: Subscription<Cluster>,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let api: Api<ByoCluster> = ctx.api();
    let machines: Api<ByoMachine> = ctx.api();
    let controller = crate::cache::controller_for(api, ctx.watch_config())
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY));
    let store = controller.store();
    let machine_store = store.clone();
    let results = controller
        .reconcile_on(
            cluster_events
                .filter_map(|cluster| futures::future::ready(infrastructure_of(&cluster))),
        )
        .watches(
            machines,
            watcher::Config::default().any_semantic(),
            move |m: ByoMachine| {
                // A ByoMachine going away may let its ByoCluster's deletion finish.
                let ns = m.namespace();
                let cluster = m.labels().get(labels::CLUSTER_NAME).cloned();
                machine_store
                    .state()
                    .into_iter()
                    .filter(|bc| {
                        bc.namespace() == ns
                            && bc.meta().deletion_timestamp.is_some()
                            && cluster.is_some()
                            && cluster_name(bc).as_ref() == cluster.as_ref()
                    })
                    .map(|bc| ObjectRef::from_obj(&*bc))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    crate::cache::drain(results, "byocluster")
}

/// The cluster a ByoCluster belongs to: its `cluster.x-k8s.io/cluster-name` label, else its
/// owner Cluster.
pub fn cluster_name(bc: &ByoCluster) -> Option<String> {
    bc.labels()
        .get(labels::CLUSTER_NAME)
        .cloned()
        .or_else(|| owner_cluster(bc))
}

/// Requeue on errors after a short, fixed delay (kube-runtime adds no backoff here; errors
/// are API failures that usually pass quickly).
pub fn error_policy(bc: Arc<ByoCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(NAME, error.metric_label());
    tracing::warn!(byocluster = %bc.name_any(), namespace = %bc.namespace().unwrap_or_default(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one ByoCluster.
///
/// # Errors
/// [`Error`] when an API request fails.
pub async fn reconcile(bc: Arc<ByoCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    let ns = bc
        .namespace()
        .ok_or_else(|| Error::Invalid(format!("ByoCluster {} has no namespace", bc.name_any())))?;
    let name = bc.name_any();
    if annotated(&*bc, labels::MANAGED_BY) {
        return Ok(Action::await_change());
    }
    let api: Api<ByoCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(owner) = owner_cluster(&*bc) else {
        if bc.meta().deletion_timestamp.is_none() {
            tracing::debug!(byocluster = %name, "no owner Cluster yet");
            return Ok(Action::await_change());
        }
        return finish(&api, bc, &ctx).await;
    };
    let cluster = capi::clusters(ctx.client.clone(), &ns)
        .get_opt(&owner)
        .await
        .map_err(Error::kube(format!("reading Cluster {ns}/{owner}")))?;
    let paused =
        annotated(&*bc, labels::PAUSED) || cluster.as_ref().is_some_and(capi::cluster_paused);
    let mut status = bc.status.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let generation = bc.meta().generation;
    conditions::Marker::new(generation, now.clone()).mark_paused(
        &mut status.conditions,
        paused,
        "the Cluster or the ByoCluster is paused",
    );
    if paused {
        apply_status(&api, &name, &status).await?;
        return Ok(Action::await_change());
    }

    if bc.meta().deletion_timestamp.is_some() {
        let remaining = ByoMachineCount::of(&ctx, &ns, cluster_name(&bc).as_deref()).await?;
        if remaining > 0 {
            conditions::Marker::new(generation, now).mark_false(
                &mut status.conditions,
                types::READY,
                reasons::DELETING,
                &format!("waiting for {remaining} ByoMachines of the cluster to be deleted"),
            );
            apply_status(&api, &name, &status).await?;
            // ByoMachine deletions trigger this reconcile; the requeue is a safety net.
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
        return finish(&api, bc, &ctx).await;
    }

    let cluster_endpoint = cluster
        .as_ref()
        .and_then(|c| c.spec.control_plane_endpoint.clone());
    finalizer(&api, finalizers::BYOCLUSTER, bc, |event| async {
        match event {
            FinalizerEvent::Apply(bc) => provision(&api, &bc, cluster_endpoint, status).await,
            FinalizerEvent::Cleanup(_) => Ok(Action::await_change()),
        }
    })
    .await
    .map_err(|e| Error::Finalizer {
        object: format!("ByoCluster {ns}/{name}"),
        source: Box::new(e),
    })
}

async fn finish(
    api: &Api<ByoCluster>,
    bc: Arc<ByoCluster>,
    _ctx: &Context,
) -> Result<Action, Error> {
    let object = format!(
        "ByoCluster {}/{}",
        bc.namespace().unwrap_or_default(),
        bc.name_any()
    );
    finalizer(api, finalizers::BYOCLUSTER, bc, |event| async move {
        match event {
            FinalizerEvent::Apply(_) | FinalizerEvent::Cleanup(_) => {
                Ok::<_, Error>(Action::await_change())
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer {
        object,
        source: Box::new(e),
    })
}

struct ByoMachineCount;

impl ByoMachineCount {
    /// ByoMachines of `cluster` in `ns` (label `cluster.x-k8s.io/cluster-name`), read from the
    /// API server (a deletion must not finish on a stale cache).
    async fn of(ctx: &Context, ns: &str, cluster: Option<&str>) -> Result<usize, Error> {
        let Some(cluster) = cluster else {
            return Ok(0);
        };
        let list = Api::<ByoMachine>::namespaced(ctx.client.clone(), ns)
            .list_metadata(
                &ListParams::default().labels(&format!("{}={cluster}", labels::CLUSTER_NAME)),
            )
            .await
            .map_err(Error::kube(format!(
                "listing ByoMachines of cluster {ns}/{cluster}"
            )))?;
        Ok(list.items.len())
    }
}

async fn provision(
    api: &Api<ByoCluster>,
    bc: &ByoCluster,
    cluster_endpoint: Option<ApiEndpoint>,
    mut status: ByoClusterStatus,
) -> Result<Action, Error> {
    let name = bc.name_any();
    let generation = bc.meta().generation;
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    // The endpoint: our spec, else the Cluster's (a user may set it there, e.g. for kube-vip).
    let own = bc
        .spec
        .control_plane_endpoint
        .clone()
        .filter(|e| !e.host.is_empty());
    let endpoint = own
        .clone()
        .or(cluster_endpoint.filter(|e| !e.host.is_empty()));
    if let Some(ep) = &endpoint {
        let port = if ep.port == 0 { DEFAULT_PORT } else { ep.port };
        if own.as_ref().is_none_or(|o| o.port != port) {
            let patch = serde_json::json!({"spec": {"controlPlaneEndpoint": {"host": ep.host, "port": port}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(Error::kube(format!(
                    "setting spec.controlPlaneEndpoint of ByoCluster {name}"
                )))?;
            // The spec change bumps the generation; its event brings the next reconcile,
            // which reports status with the new observedGeneration.
            return Ok(Action::await_change());
        }
    }
    let was_provisioned = status.initialization.as_ref().and_then(|i| i.provisioned) == Some(true);
    let provisioned = was_provisioned || endpoint.is_some();
    if provisioned {
        status.initialization = Some(Initialization {
            provisioned: Some(true),
        });
    }
    status.failure_domains = bc.spec.failure_domains.clone();
    if provisioned {
        conditions::Marker::new(generation, now).mark_true(
            &mut status.conditions,
            types::READY,
            reasons::AS_EXPECTED,
            "",
        );
    } else {
        conditions::Marker::new(generation, now).mark_false(
            &mut status.conditions,
            types::READY,
            reasons::WAITING_FOR_CONTROL_PLANE_ENDPOINT,
            "set spec.controlPlaneEndpoint.host on the ByoCluster or the Cluster",
        );
    }
    apply_status(api, &name, &status).await?;
    Ok(Action::await_change())
}

async fn apply_status(
    api: &Api<ByoCluster>,
    name: &str,
    status: &ByoClusterStatus,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "ByoCluster",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!("applying status of ByoCluster {name}")))?;
    Ok(())
}
