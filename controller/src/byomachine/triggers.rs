//! What makes a ByoMachine reconcile (watch mapping from Machines, Clusters, ByoHosts and
//! Leases), and the ByoHost cache callback that clears honoured clean-up marks.

use super::{error_policy, host_key, is_previous_machine, machine_cached, reconcile};
use crate::capi::{Cluster, Machine};
use crate::context::{CONCURRENCY, Context, Shutdown};
use crate::error::{is_conflict, is_not_found};
use byoh_api::byohost::MachineReference;
use byoh_api::{ByoHost, ByoMachine, labels};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;

/// What triggers ByoMachine reconciles: its subscriptions to the shared caches (see
/// [`crate::cache`]).
#[derive(Debug)]
pub struct Triggers {
    /// ByoHost changes: a claimed host concerns its claimer, a free one every ByoMachine
    /// waiting for a host.
    pub hosts: crate::cache::Subscription<ByoHost>,
    /// Lease changes: a free host's Lease may make it available to waiting ByoMachines; a
    /// claimed host's Lease matters to its claimer only while it is being released.
    pub leases: crate::cache::Subscription<Lease>,
    /// CAPI Cluster changes concern the Cluster's ByoMachines.
    pub clusters: crate::cache::Subscription<Cluster>,
    /// CAPI Machine changes concern the Machine's ByoMachine.
    pub machines: crate::cache::Subscription<Machine>,
}

/// The ByoMachine controller, ending when `shutdown` resolves.
pub fn controller(
    ctx: Arc<Context>,
    triggers: Triggers,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let api: Api<ByoMachine> = ctx.api();
    let controller = crate::cache::controller_for(api, ctx.watch_config())
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY));
    let store = controller.store();
    let (by_cluster, by_host, by_lease, by_machine) =
        (store.clone(), store.clone(), store.clone(), store);
    let (lease_ctx, machine_ctx) = (ctx.clone(), ctx.clone());
    let each = |refs: Vec<ObjectRef<ByoMachine>>| futures::stream::iter(refs);
    let results = controller
        .reconcile_on(triggers.machines.flat_map(move |m| {
            // The Machine's own ByoMachine; and, once a Machine is gone, every ByoMachine
            // waiting for a host if a host was held back for it (spec.previousMachineRef).
            let mut refs: Vec<ObjectRef<ByoMachine>> = infrastructure_of(&m).into_iter().collect();
            if releases_a_held_host(&machine_ctx, &m) {
                let ns = m.namespace();
                refs.extend(
                    by_machine
                        .state()
                        .into_iter()
                        .filter(|bm| bm.namespace() == ns && waiting_for_host(bm))
                        .map(|bm| ObjectRef::from_obj(&*bm)),
                );
            }
            each(refs)
        }))
        .reconcile_on(triggers.clusters.flat_map(move |c| {
            let ns = c.namespace();
            let name = c.name_any();
            each(
                by_cluster
                    .state()
                    .into_iter()
                    .filter(|bm| {
                        bm.namespace() == ns && bm.labels().get(labels::CLUSTER_NAME) == Some(&name)
                    })
                    .map(|bm| ObjectRef::from_obj(&*bm))
                    .collect(),
            )
        }))
        .reconcile_on(triggers.hosts.flat_map(move |host| {
            let ns = host.namespace();
            let claimer = host.claimed_by().map(str::to_string);
            each(
                by_host
                    .state()
                    .into_iter()
                    .filter(|bm| {
                        bm.namespace() == ns
                            && match &claimer {
                                Some(uid) => bm.uid().as_deref() == Some(uid.as_str()),
                                None => waiting_for_host(bm),
                            }
                    })
                    .map(|bm| ObjectRef::from_obj(&*bm))
                    .collect(),
            )
        }))
        .reconcile_on(triggers.leases.flat_map(move |lease| {
            // A host's Lease is `<pool>.<host>` in the host-lease namespace.
            let name = lease.name_any();
            let Some((pool, host_name)) = byoh_api::names::parse_host_lease_name(&name) else {
                return each(Vec::new());
            };
            let ns = Some(pool.to_string());
            let host = lease_ctx.hosts.get(&ObjectRef::new(host_name).within(pool));
            let Some(host) = host else {
                return each(Vec::new());
            };
            let claimer = host.claimed_by().map(str::to_string);
            let free = claimer.is_none() && host.spec.needs_cleanup.is_none();
            each(
                by_lease
                    .state()
                    .into_iter()
                    .filter(|bm| {
                        bm.namespace() == ns
                            && match &claimer {
                                Some(uid) => {
                                    bm.meta().deletion_timestamp.is_some()
                                        && bm.uid().as_deref() == Some(uid.as_str())
                                }
                                None => free && waiting_for_host(bm),
                            }
                    })
                    .map(|bm| ObjectRef::from_obj(&*bm))
                    .collect(),
            )
        }))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    crate::cache::drain(results, "byomachine")
}

fn waiting_for_host(bm: &ByoMachine) -> bool {
    bm.meta().deletion_timestamp.is_none()
        && bm.status.as_ref().is_none_or(|s| s.host_ref.is_none())
}

/// The ByoMachine a CAPI Machine's `spec.infrastructureRef` names, if it names one.
fn infrastructure_of(machine: &Machine) -> Option<ObjectRef<ByoMachine>> {
    let ns = machine.namespace()?;
    let r = machine.spec.infrastructure_ref.as_ref()?;
    (r.kind == "ByoMachine").then(|| ObjectRef::new(&r.name).within(&ns))
}

/// Whether `machine` is gone from the Machine cache while a host of its namespace is held
/// back for it (`spec.previousMachineRef` names it, see [`is_previous_machine`]): that host is
/// free now.
fn releases_a_held_host(ctx: &Context, machine: &Machine) -> bool {
    let (Some(ns), Some(uid)) = (machine.namespace(), machine.uid()) else {
        return false;
    };
    let this = MachineReference {
        name: machine.name_any(),
        uid,
    };
    if machine_cached(ctx, &ns, &this) {
        return false;
    }
    ctx.hosts.state().iter().any(|h| {
        h.namespace().as_deref() == Some(ns.as_str())
            && h.spec
                .previous_machine_ref
                .as_ref()
                .is_some_and(|p| is_previous_machine(machine, &h.name_any(), p))
    })
}

/// Called for every ByoHost the cache sees: clears a clean-up mark the agent has honoured
/// (`status.cleanedMachineUID == spec.needsCleanup.machineUID`) and forgets reservations the
/// cache now reflects.
pub fn on_host_event(ctx: &Arc<Context>, host: &ByoHost) {
    let (Some(ns), Some(name)) = (host.namespace(), host.metadata.name.clone()) else {
        return;
    };
    if let Some(claim) = &host.spec.claim {
        let mut claims = ctx.claims();
        claims.reserved.remove(&host_key(&ns, &name));
        if claims
            .made
            .get(&claim.machine_ref.uid)
            .is_some_and(|(h, _)| h.metadata.name.as_deref() == Some(name.as_str()))
        {
            claims.made.remove(&claim.machine_ref.uid);
        }
    }
    let cleaned = host
        .status
        .as_ref()
        .and_then(|s| s.cleaned_machine_uid.as_deref());
    if let Some(mark) = &host.spec.needs_cleanup
        && cleaned == Some(mark.machine_uid.as_str())
    {
        let ctx = ctx.clone();
        let mut host = host.clone();
        tokio::spawn(async move {
            let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &ns);
            host.spec.needs_cleanup = None;
            match api
                .replace(&name, &crate::context::post_params(), &host)
                .await
            {
                Ok(_) => {
                    tracing::info!(host = %name, namespace = %ns, "clean-up confirmed by the agent; needsCleanup cleared")
                }
                // A newer version will come through the cache again.
                Err(e) if is_conflict(&e) || is_not_found(&e) => {}
                Err(e) => tracing::warn!(host = %name, error = %e, "clearing needsCleanup"),
            }
        });
    }
}
