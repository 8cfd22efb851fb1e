//! ByoMachine reconciler: waits, selects, claims, provisions and releases hosts.
//!
//! Provisioning (CAPI InfraMachine contract v1beta2):
//! 1. owner Machine (controller ownerRef of kind `Machine`) and Cluster (label
//!    `cluster.x-k8s.io/cluster-name`); finalizer [`byoh_api::finalizers::BYOMACHINE`];
//!    paused → `Paused=True`, nothing else;
//! 2. wait for `Cluster.status.initialization.infrastructureProvisioned`, for
//!    `Machine.spec.bootstrap.dataSecretName`, and (workers only) for the control plane to be
//!    initialized; each wait is a `Ready=False` reason;
//! 3. clone the installer config (see [`crate::installerconfig`]) when `spec.installerRef` is set;
//! 4. claim a host: [`crate::selection`] over the cached pool, then an update (PUT) of the
//!    ByoHost carrying the cached `resourceVersion`; on 409 Conflict the host is read again
//!    and, if still free, retried, else another is picked (bounded). After a claim, the hosts
//!    claimed for this ByoMachine's UID are listed: if two controllers raced for the same
//!    ByoMachine (only possible without leader election) the host with the lowest name is kept
//!    and the others are released, so a ByoMachine never keeps two hosts;
//! 5. once the host reports `BootstrapSucceeded=True` for this ByoMachine's UID: providerID,
//!    addresses, failure domain, `status.initialization.provisioned`, `Ready=True`.
//!
//! Release (the ByoMachine is deleted): `spec.claim.releaseRequested` on the host (time in the
//! host annotation `byoh.infrastructure.cluster.x-k8s.io/release-requested-at`); once the agent
//! reports `status.cleanedMachineUID` equal to the claim's UID the claim is dropped. A host whose
//! Lease expired, a release older than `--release-timeout`, or the force-release annotation
//! drop the claim at once and set `spec.needsCleanup`. Then the installer config's finalizer and
//! the ByoMachine's finalizer go. A ByoMachine whose host vanished is released at once.
//!
//! Triggers: the ByoMachine itself, its Machine (bootstrap data), its Cluster (provisioned,
//! control plane initialized, paused), and every ByoHost and Lease change in its namespace
//! for ByoMachines still waiting for a host — no fixed polling for hosts.

use crate::capi::{self, Cluster, Machine};
use crate::context::{CONCURRENCY, Context, FIELD_MANAGER, Shutdown};
use crate::error::{Error, is_conflict, is_not_found};
use crate::selection::{self, Request};
use byoh_api::byohost::{HostClaim, MachineReference, NeedsCleanup};
use byoh_api::byomachine::HostReference;
use byoh_api::common::{Initialization, LocalObjectReference};
use byoh_api::conditions::{self, reasons, types};
use byoh_api::{ByoHost, ByoMachine, ByoMachineStatus, finalizers, labels};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Name of this reconciler in metrics and logs.
pub const NAME: &str = "byomachine";

/// Host picks per claim attempt before giving up for now (each pick may be retried on
/// conflicts, see [`CONFLICT_RETRIES`]).
pub const MAX_PICKS: usize = 10;

/// Updates of one picked host retried after 409 Conflict while it is still free.
pub const CONFLICT_RETRIES: usize = 3;

/// Safety requeue of a ByoMachine waiting for a host (host and Lease events are the trigger).
pub const WAIT_FOR_HOST_REQUEUE: Duration = Duration::from_secs(60);

/// `n` random lower-case alphanumerics.
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

/// The providerID for a claim of `host`: `byoh://<host>/<6 random lower-case alnum>`.
pub fn provider_id(host: &str) -> String {
    format!("byoh://{host}/{}", random_suffix(6))
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn host_key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Name of the owner Machine: the controller ownerRef of kind `Machine` in `cluster.x-k8s.io`.
pub fn owner_machine(bm: &ByoMachine) -> Option<String> {
    owner_machine_ref(bm).map(|m| m.name)
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
/// back for it (`spec.previousMachineRef` names its UID): that host is free now.
fn releases_a_held_host(ctx: &Context, machine: &Machine) -> bool {
    let (Some(ns), Some(uid)) = (machine.namespace(), machine.uid()) else {
        return false;
    };
    let this = MachineReference {
        name: machine.name_any(),
        uid: uid.clone(),
    };
    if machine_cached(ctx, &ns, &this) {
        return false;
    }
    ctx.hosts.state().iter().any(|h| {
        h.namespace().as_deref() == Some(ns.as_str())
            && h.spec
                .previous_machine_ref
                .as_ref()
                .is_some_and(|p| p.uid == uid)
    })
}

/// Whether the Machine cache holds Machine `m` (same name and UID) in namespace `ns`.
fn machine_cached(ctx: &Context, ns: &str, m: &MachineReference) -> bool {
    ctx.machines
        .get(&ObjectRef::new_with(&m.name, capi::machine_resource()).within(ns))
        .is_some_and(|x| x.uid().as_deref() == Some(m.uid.as_str()))
}

/// The CAPI Machine owning `bm` (controller ownerRef of kind `Machine`), as name and UID.
fn owner_machine_ref(bm: &ByoMachine) -> Option<MachineReference> {
    bm.meta().owner_references.as_ref()?.iter().find_map(|r| {
        (r.kind == "Machine"
            && r.controller == Some(true)
            && r.api_version.split('/').next() == Some(capi::GROUP))
        .then(|| MachineReference {
            name: r.name.clone(),
            uid: r.uid.clone(),
        })
    })
}

/// The shared caches' events the ByoMachine controller reacts to (see [`crate::cache`]).
#[derive(Debug)]
pub struct Events {
    /// ByoHost changes: a claimed host concerns its claimer, a free one every ByoMachine
    /// waiting for a host.
    pub hosts: crate::cache::Events<ByoHost>,
    /// Lease changes: a free host's Lease may make it available to waiting ByoMachines; a
    /// claimed host's Lease matters to its claimer only while it is being released.
    pub leases: crate::cache::Events<Lease>,
    /// CAPI Cluster changes concern the Cluster's ByoMachines.
    pub clusters: crate::cache::Events<Cluster>,
    /// CAPI Machine changes concern the Machine's ByoMachine.
    pub machines: crate::cache::Events<Machine>,
}

/// The ByoMachine controller, ending when `shutdown` resolves.
pub fn controller(
    ctx: Arc<Context>,
    events: Events,
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
    controller
        .reconcile_on(events.machines.flat_map(move |m| {
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
        .reconcile_on(events.clusters.flat_map(move |c| {
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
        .reconcile_on(events.hosts.flat_map(move |host| {
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
        .reconcile_on(events.leases.flat_map(move |lease| {
            let ns = lease.namespace();
            let host = lease_ctx
                .hosts
                .get(&ObjectRef::new(&lease.name_any()).within(ns.as_deref().unwrap_or_default()));
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
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            if let Err(e) = result {
                tracing::debug!(error = %e, "byomachine reconcile");
            }
            futures::future::ready(())
        })
}

/// Requeue on errors after a short delay.
pub fn error_policy(bm: Arc<ByoMachine>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(NAME, error.metric_label());
    tracing::warn!(byomachine = %bm.name_any(), namespace = ?bm.namespace(), %error, "reconcile failed");
    Action::requeue(Duration::from_millis(500 + rand::random_range(0..1500)))
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
                .replace(
                    &name,
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &host,
                )
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

/// Recomputes the host gauges from the cache.
pub fn update_host_gauges(ctx: &Context) {
    let (mut free, mut claimed, mut dirty) = (0, 0, 0);
    for h in ctx.hosts.state() {
        if h.spec.claim.is_some() {
            claimed += 1;
        } else if h.spec.needs_cleanup.is_some() {
            dirty += 1;
        } else {
            free += 1;
        }
    }
    ctx.metrics.set_hosts(free, claimed, dirty);
}

struct Names {
    ns: String,
    name: String,
    uid: String,
}

fn names(bm: &ByoMachine) -> Result<Names, Error> {
    let name = bm.name_any();
    let ns = bm
        .namespace()
        .ok_or_else(|| Error::Invalid(format!("ByoMachine {name} has no namespace")))?;
    let uid = bm
        .uid()
        .ok_or_else(|| Error::Invalid(format!("ByoMachine {ns}/{name} has no UID")))?;
    Ok(Names { ns, name, uid })
}

/// Reconciles one ByoMachine.
///
/// # Errors
/// [`Error`] when an API request fails.
pub async fn reconcile(bm: Arc<ByoMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciled(NAME);
    // Selection and release decide from the host and Lease caches: after a start or a leader
    // change, an empty cache would read as "no host" or "host offline" (a release would then
    // skip the agent's graceful clean-up). Wait until both hold their first list.
    ctx.hosts_ready.wait().await;
    ctx.leases_ready.wait().await;
    let n = names(&bm)?;
    let api: Api<ByoMachine> = Api::namespaced(ctx.client.clone(), &n.ns);
    let cluster_name = bm.labels().get(labels::CLUSTER_NAME).cloned();
    let machine_name = owner_machine(&bm);
    // The cached Cluster and Machine decide, unless they say "wait" (paused, missing, not
    // ready): then the API server is asked, so a stale cache never parks a ByoMachine.
    let mut cluster = cluster_name.as_deref().and_then(|c| {
        ctx.clusters
            .get(&ObjectRef::new_with(c, capi::cluster_resource()).within(&n.ns))
    });
    let mut machine = machine_name.as_deref().and_then(|m| {
        ctx.machines
            .get(&ObjectRef::new_with(m, capi::machine_resource()).within(&n.ns))
    });
    let blocked = match (&cluster, &machine) {
        (Some(c), Some(m)) => capi::cluster_paused(c) || gate(m, c).is_some(),
        _ => true,
    };
    if blocked {
        if let Some(c) = &cluster_name {
            cluster = capi::clusters(ctx.client.clone(), &n.ns)
                .get_opt(c)
                .await
                .map_err(Error::kube(format!("reading Cluster {}/{c}", n.ns)))?
                .map(Arc::new);
        }
        if let Some(m) = &machine_name {
            machine = capi::machines(ctx.client.clone(), &n.ns)
                .get_opt(m)
                .await
                .map_err(Error::kube(format!("reading Machine {}/{m}", n.ns)))?
                .map(Arc::new);
        }
    }
    let paused = bm.annotations().contains_key(labels::PAUSED)
        || cluster.as_deref().is_some_and(capi::cluster_paused);
    let generation = bm.meta().generation;
    let mut status = bm.status.clone().unwrap_or_default();
    if paused {
        let changed = conditions::set(
            &mut status.conditions,
            types::PAUSED,
            true,
            reasons::PAUSED,
            "the Cluster or the ByoMachine is paused",
            generation,
            Time(now()),
        );
        if changed {
            apply_status(&api, &bm, &status).await?;
        }
        return Ok(Action::await_change());
    }
    conditions::set(
        &mut status.conditions,
        types::PAUSED,
        false,
        reasons::NOT_PAUSED,
        "",
        generation,
        Time(now()),
    );

    if bm.meta().deletion_timestamp.is_some() {
        if !bm.finalizers().iter().any(|f| f == finalizers::BYOMACHINE) {
            return Ok(Action::await_change());
        }
        if let Some(wait) = release(&ctx, &bm, &n, &mut status).await? {
            apply_status(&api, &bm, &status).await?;
            return Ok(wait);
        }
        crate::installerconfig::release(&ctx, &bm).await?;
        let object = format!("ByoMachine {}/{}", n.ns, n.name);
        ctx.claims().ready_since.remove(&n.uid);
        return finalizer(&api, finalizers::BYOMACHINE, bm, |_| async {
            Ok::<_, Error>(Action::await_change())
        })
        .await
        .map_err(|e| Error::Finalizer {
            object,
            source: Box::new(e),
        });
    }

    if machine_name.is_none() {
        tracing::debug!(byomachine = %n.name, "no owner Machine yet");
        return Ok(Action::await_change());
    }
    let (Some(machine), Some(cluster)) = (machine, cluster) else {
        return Ok(Action::requeue(Duration::from_secs(10)));
    };
    let object = format!("ByoMachine {}/{}", n.ns, n.name);
    let api_ref = &api;
    let ctx_ref = &ctx;
    finalizer(&api, finalizers::BYOMACHINE, bm, |event| async move {
        match event {
            Event::Apply(bm) => provision(ctx_ref, api_ref, &bm, &machine, &cluster, status).await,
            Event::Cleanup(_) => Ok(Action::await_change()),
        }
    })
    .await
    .map_err(|e| Error::Finalizer {
        object,
        source: Box::new(e),
    })
}

/// What a ByoMachine still waits for before it may claim a host: the Cluster's
/// infrastructure, the bootstrap data, and (workers only) an initialized control plane.
/// Returns the `Ready=False` reason and message.
pub fn gate(machine: &Machine, cluster: &Cluster) -> Option<(&'static str, &'static str)> {
    if !capi::infrastructure_provisioned(cluster) {
        return Some((
            reasons::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
            "Cluster status.initialization.infrastructureProvisioned is not true",
        ));
    }
    if machine.spec.bootstrap.data_secret_name.is_none() {
        return Some((
            reasons::WAITING_FOR_BOOTSTRAP_DATA,
            "Machine spec.bootstrap.dataSecretName is not set",
        ));
    }
    if !capi::is_control_plane(machine) && !capi::control_plane_initialized(cluster) {
        return Some((
            reasons::WAITING_FOR_CONTROL_PLANE,
            "worker Machines wait for the control plane to be initialized",
        ));
    }
    None
}

fn wait(status: &mut ByoMachineStatus, reason: &str, message: &str, generation: Option<i64>) {
    let t = Time(now());
    conditions::set(
        &mut status.conditions,
        types::READY,
        false,
        reason,
        message,
        generation,
        t.clone(),
    );
    if status.host_ref.is_none() {
        conditions::set(
            &mut status.conditions,
            types::HOST_CLAIMED,
            false,
            reason,
            message,
            generation,
            t,
        );
    }
}

async fn provision(
    ctx: &Arc<Context>,
    api: &Api<ByoMachine>,
    bm: &ByoMachine,
    machine: &Machine,
    cluster: &Cluster,
    mut status: ByoMachineStatus,
) -> Result<Action, Error> {
    let n = names(bm)?;
    let generation = bm.meta().generation;
    let cluster_name = cluster.name_any();

    // Already claimed (also after a crash between claim and status write)?
    let mut host = find_claimed_host(ctx, &n).await?;
    if host.is_none() {
        if let Some(href) = status.host_ref.clone() {
            // The host we had is gone (or lost our claim).
            let provisioned =
                status.initialization.as_ref().and_then(|i| i.provisioned) == Some(true);
            if provisioned {
                wait(
                    &mut status,
                    reasons::HOST_DELETED,
                    &format!(
                        "ByoHost {} no longer exists or no longer carries this claim",
                        href.name
                    ),
                    generation,
                );
                conditions::set(
                    &mut status.conditions,
                    types::HOST_CLAIMED,
                    false,
                    reasons::HOST_DELETED,
                    "",
                    generation,
                    Time(now()),
                );
                apply_status(api, bm, &status).await?;
                return Ok(Action::await_change());
            }
            status.host_ref = None;
        }
        if let Some((reason, message)) = gate(machine, cluster) {
            wait(&mut status, reason, message, generation);
            apply_status(api, bm, &status).await?;
            return Ok(Action::await_change());
        }
        let secret = machine
            .spec
            .bootstrap
            .data_secret_name
            .clone()
            .unwrap_or_default();
        let ready_since = *ctx
            .claims()
            .ready_since
            .entry(n.uid.clone())
            .or_insert_with(Instant::now);
        let installer_ref = match &bm.spec.installer_ref {
            Some(r) => {
                Some(crate::installerconfig::ensure(ctx, bm, r, machine, &cluster_name).await?)
            }
            None => None,
        };
        let claim = HostClaim {
            machine_ref: MachineReference {
                name: n.name.clone(),
                uid: n.uid.clone(),
            },
            cluster_name: cluster_name.clone(),
            bootstrap_secret_ref: LocalObjectReference { name: secret },
            installer_ref,
            kubernetes_version: machine.spec.version.clone(),
            provider_id: String::new(),
            claimed_at: None,
            release_requested: false,
        };
        let machines_known = ctx.machines_ready.is_ready();
        // Before the Machine cache is filled, absence proves nothing: keep such hosts held.
        let machine_exists =
            |m: &MachineReference| !machines_known || machine_cached(ctx, &n.ns, m);
        let req = Request {
            namespace: &n.ns,
            selector: bm.spec.selector.as_ref(),
            arch: bm.labels().get(labels::HOST_ARCH).map(String::as_str),
            os: bm.labels().get(labels::HOST_OS).map(String::as_str),
            kubernetes_version: machine.spec.version.as_deref(),
            failure_domain: machine.spec.failure_domain.as_deref(),
            cluster_name: &cluster_name,
            machine_exists: Some(selection::MachineLookup(&machine_exists)),
        };
        match claim_host(ctx, &n, &req, &claim).await? {
            Claimed::Host(h) => {
                ctx.claims().ready_since.remove(&n.uid);
                ctx.metrics
                    .claim_duration
                    .observe(ready_since.elapsed().as_secs_f64());
                tracing::info!(byomachine = %n.name, namespace = %n.ns, host = ?h.metadata.name, "claimed host");
                host = Some(h);
            }
            Claimed::NoneEligible(why) => {
                wait(
                    &mut status,
                    reasons::NO_HOST_AVAILABLE,
                    &format!("no free, live ByoHost fits: {why}"),
                    generation,
                );
                apply_status(api, bm, &status).await?;
                return Ok(Action::requeue(WAIT_FOR_HOST_REQUEUE));
            }
            Claimed::Contended => {
                wait(
                    &mut status,
                    reasons::NO_HOST_AVAILABLE,
                    "every pick was taken by a concurrent claim; retrying",
                    generation,
                );
                apply_status(api, bm, &status).await?;
                return Ok(Action::requeue(Duration::from_millis(
                    200 + rand::random_range(0..800),
                )));
            }
        }
    }
    let Some(host) = host else {
        return Err(Error::Invalid("no host after claim".into()));
    };
    let host_name = host.name_any();
    let t = Time(now());
    status.host_ref = Some(HostReference {
        name: host_name.clone(),
        uid: host.uid().unwrap_or_default(),
    });
    status.failure_domain = host.labels().get(labels::FAILURE_DOMAIN).cloned();
    conditions::set(
        &mut status.conditions,
        types::HOST_CLAIMED,
        true,
        reasons::AS_EXPECTED,
        "",
        generation,
        t.clone(),
    );

    let hs = host.status.clone().unwrap_or_default();
    let bootstrapped = conditions::is_true(&hs.conditions, types::BOOTSTRAP_SUCCEEDED)
        && hs.observed_machine_uid.as_deref() == Some(n.uid.as_str());
    if !bootstrapped {
        conditions::set(
            &mut status.conditions,
            types::READY,
            false,
            reasons::WAITING_FOR_BOOTSTRAP,
            &format!("waiting for ByoHost {host_name} to report BootstrapSucceeded"),
            generation,
            t,
        );
        apply_status(api, bm, &status).await?;
        return Ok(Action::await_change());
    }
    let provider_id = host
        .spec
        .claim
        .as_ref()
        .map(|c| c.provider_id.clone())
        .unwrap_or_default();
    if bm.spec.provider_id.is_none() && !provider_id.is_empty() {
        let patch = serde_json::json!({"spec": {"providerID": provider_id}});
        api.patch(&n.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "setting spec.providerID of ByoMachine {}/{}",
                n.ns, n.name
            )))?;
    }
    status.addresses = hs.addresses.clone();
    status.initialization = Some(Initialization {
        provisioned: Some(true),
    });
    conditions::set(
        &mut status.conditions,
        types::READY,
        true,
        reasons::AS_EXPECTED,
        "",
        generation,
        t,
    );
    apply_status(api, bm, &status).await?;
    Ok(Action::await_change())
}

/// The host claimed for this ByoMachine's UID: from the cache (lowest name if several), else
/// a claim this process made that the cache does not show yet.
async fn find_claimed_host(ctx: &Context, n: &Names) -> Result<Option<Arc<ByoHost>>, Error> {
    let mut claimed: Vec<Arc<ByoHost>> = ctx
        .hosts
        .state()
        .into_iter()
        .filter(|h| {
            h.namespace().as_deref() == Some(n.ns.as_str())
                && h.claimed_by() == Some(n.uid.as_str())
        })
        .collect();
    claimed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if let Some(h) = claimed.into_iter().next() {
        return Ok(Some(h));
    }
    let mut claims = ctx.claims();
    claims.expire(Instant::now());
    Ok(claims.made.get(&n.uid).map(|(h, _)| h.clone()))
}

enum Claimed {
    Host(Arc<ByoHost>),
    NoneEligible(String),
    Contended,
}

enum Attempt {
    Claimed(Box<ByoHost>),
    Lost,
}

async fn claim_host(
    ctx: &Arc<Context>,
    n: &Names,
    req: &Request<'_>,
    claim: &HostClaim,
) -> Result<Claimed, Error> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &n.ns);
    let mut tried: HashSet<String> = HashSet::new();
    for _ in 0..MAX_PICKS {
        let hosts = ctx.hosts.state();
        let pick = {
            // The lock is not held while selecting: the reservation is checked again below.
            let exclude = {
                let mut claims = ctx.claims();
                claims.expire(Instant::now());
                let mut exclude = claims.reserved_keys();
                exclude.extend(tried.iter().cloned());
                exclude
            };
            let leases = &ctx.leases;
            let selection = selection::select(
                &hosts,
                |h: &ByoHost| {
                    leases.get(
                        &ObjectRef::new(h.metadata.name.as_deref().unwrap_or_default())
                            .within(h.metadata.namespace.as_deref().unwrap_or_default()),
                    )
                },
                &exclude,
                req,
                now(),
                &mut rand::rng(),
            );
            match selection.chosen {
                Some(h) => {
                    let key = host_key(&n.ns, &h.name_any());
                    let mut claims = ctx.claims();
                    if claims.reserved.contains_key(&key) {
                        // Another reconcile of this process took it meanwhile.
                        continue;
                    }
                    claims.reserved.insert(key.clone(), Instant::now());
                    (key, h.clone())
                }
                None if tried.is_empty()
                    && !selection
                        .rejected
                        .contains_key(&selection::Rejection::InFlight) =>
                {
                    return Ok(Claimed::NoneEligible(selection.summary()));
                }
                None => return Ok(Claimed::Contended),
            }
        };
        let (key, host) = pick;
        match try_claim(ctx, &api, host, req, claim).await {
            Ok(Attempt::Claimed(h)) => {
                let h: Arc<ByoHost> = Arc::from(h);
                ctx.claims()
                    .made
                    .insert(n.uid.clone(), (h.clone(), Instant::now()));
                // With leader election only one instance reconciles; without it, two may
                // have claimed a host each for this ByoMachine.
                if ctx.settings.leader_elect {
                    return Ok(Claimed::Host(h));
                }
                return Ok(Claimed::Host(keep_one(ctx, &api, n, h).await?));
            }
            Ok(Attempt::Lost) => {
                ctx.claims().reserved.remove(&key);
                tried.insert(key);
            }
            Err(e) => {
                ctx.claims().reserved.remove(&key);
                return Err(e);
            }
        }
    }
    Ok(Claimed::Contended)
}

/// Claims `host` with an update carrying its `resourceVersion`; on 409 Conflict reads it
/// again and retries while it is still eligible.
async fn try_claim(
    ctx: &Context,
    api: &Api<ByoHost>,
    host: ByoHost,
    req: &Request<'_>,
    claim: &HostClaim,
) -> Result<Attempt, Error> {
    let name = host.name_any();
    let mut host = host;
    for attempt in 0..=CONFLICT_RETRIES {
        if attempt > 0 {
            let Some(fresh) = api
                .get_opt(&name)
                .await
                .map_err(Error::kube(format!("reading ByoHost {}", name)))?
            else {
                return Ok(Attempt::Lost);
            };
            let lease = ctx
                .leases
                .get(&ObjectRef::new(&name).within(req.namespace))
                .map(|l| (*l).clone());
            if selection::eligibility(&fresh, lease.as_ref(), req, now()).is_err() {
                return Ok(Attempt::Lost);
            }
            host = fresh;
        }
        let mut claim = claim.clone();
        claim.provider_id = provider_id(&name);
        claim.claimed_at = Some(Time(now()));
        host.spec.claim = Some(claim.clone());
        host.spec.previous_machine_ref = None;
        let host_labels = host.labels_mut();
        host_labels.insert(labels::CLUSTER_NAME.into(), claim.cluster_name.clone());
        if claim.machine_ref.name.len() <= 63 {
            host_labels.insert(labels::MACHINE_NAME.into(), claim.machine_ref.name.clone());
        }
        match api
            .replace(
                &name,
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &host,
            )
            .await
        {
            Ok(h) => return Ok(Attempt::Claimed(Box::new(h))),
            Err(e) if is_conflict(&e) => {
                ctx.metrics.claim_conflicts.inc();
            }
            Err(e) if is_not_found(&e) => return Ok(Attempt::Lost),
            Err(e) => return Err(Error::kube(format!("claiming ByoHost {name}"))(e)),
        }
    }
    Ok(Attempt::Lost)
}

/// After a claim: if more than one host carries this ByoMachine's UID (two controllers raced
/// for the same ByoMachine), keep the lowest name and release the others. Returns the kept host.
async fn keep_one(
    ctx: &Context,
    api: &Api<ByoHost>,
    n: &Names,
    mine: Arc<ByoHost>,
) -> Result<Arc<ByoHost>, Error> {
    let selector = if n.name.len() <= 63 {
        format!("{}={}", labels::MACHINE_NAME, n.name)
    } else {
        let cluster = mine
            .spec
            .claim
            .as_ref()
            .map(|c| c.cluster_name.clone())
            .unwrap_or_default();
        format!("{}={cluster}", labels::CLUSTER_NAME)
    };
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube(format!(
            "listing ByoHosts claimed by {}/{}",
            n.ns, n.name
        )))?;
    let mut ours: Vec<ByoHost> = list
        .items
        .into_iter()
        .filter(|h| h.claimed_by() == Some(n.uid.as_str()))
        .collect();
    if ours.len() <= 1 {
        return Ok(mine);
    }
    ours.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let keep = ours.remove(0);
    for extra in ours {
        tracing::warn!(byomachine = %n.name, host = %extra.name_any(), kept = %keep.name_any(), "a concurrent claim took a second host for one ByoMachine; releasing it");
        drop_claim(api, extra, &n.uid, None, None).await?;
    }
    ctx.claims()
        .made
        .insert(n.uid.clone(), (Arc::new(keep.clone()), Instant::now()));
    Ok(Arc::new(keep))
}

/// Drops the claim of `machine_uid` from `host` (and its labels and release annotation),
/// optionally marking the host `needsCleanup` with `reason`, and records `previous` (the
/// claim's CAPI Machine) as `spec.previousMachineRef`. Retries on conflict; a host that is
/// gone or no longer claimed by `machine_uid` counts as released.
async fn drop_claim(
    api: &Api<ByoHost>,
    host: ByoHost,
    machine_uid: &str,
    reason: Option<&str>,
    previous: Option<&MachineReference>,
) -> Result<(), Error> {
    let name = host.name_any();
    let mut host = host;
    for _ in 0..5 {
        if host.claimed_by() != Some(machine_uid) {
            return Ok(());
        }
        host.spec.claim = None;
        if previous.is_some() {
            host.spec.previous_machine_ref = previous.cloned();
        }
        if let Some(reason) = reason {
            host.spec.needs_cleanup = Some(NeedsCleanup {
                machine_uid: machine_uid.into(),
                reason: reason.into(),
            });
        }
        host.labels_mut().remove(labels::CLUSTER_NAME);
        host.labels_mut().remove(labels::MACHINE_NAME);
        host.annotations_mut().remove(labels::RELEASE_REQUESTED_AT);
        match api
            .replace(
                &name,
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &host,
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if is_conflict(&e) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(Error::kube(format!("releasing ByoHost {name}"))(e)),
        }
        match api
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading ByoHost {name}")))?
        {
            Some(h) => host = h,
            None => return Ok(()),
        }
    }
    Err(Error::Invalid(format!(
        "releasing ByoHost {name}: kept conflicting; retrying"
    )))
}

/// Release step of a deleted ByoMachine. `Ok(None)`: released (or nothing to release);
/// `Ok(Some(action))`: waiting for the agent.
async fn release(
    ctx: &Context,
    bm: &ByoMachine,
    n: &Names,
    status: &mut ByoMachineStatus,
) -> Result<Option<Action>, Error> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &n.ns);
    let previous = owner_machine_ref(bm);
    // The host: by status.hostRef, else any cached host claimed for this UID; read fresh.
    let candidate = match &status.host_ref {
        Some(r) => Some(r.name.clone()),
        None => find_claimed_host(ctx, n).await?.map(|h| h.name_any()),
    };
    let host = match &candidate {
        Some(name) => api
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("reading ByoHost {}/{name}", n.ns)))?,
        None => None,
    };
    let host = match host {
        Some(h) if h.claimed_by() == Some(n.uid.as_str()) => h,
        _ => {
            // Maybe the claim sits on another host (a crash before the status write).
            let others: Vec<Arc<ByoHost>> = ctx
                .hosts
                .state()
                .into_iter()
                .filter(|h| {
                    h.namespace().as_deref() == Some(n.ns.as_str())
                        && h.claimed_by() == Some(n.uid.as_str())
                })
                .collect();
            for h in others {
                drop_claim(
                    &api,
                    (*h).clone(),
                    &n.uid,
                    Some(reasons::FORCED_RELEASE),
                    previous.as_ref(),
                )
                .await?;
            }
            ctx.claims().made.remove(&n.uid);
            return Ok(None);
        }
    };
    let host_name = host.name_any();
    let generation = bm.meta().generation;
    let t = now();

    let cleaned = host
        .status
        .as_ref()
        .and_then(|s| s.cleaned_machine_uid.as_deref())
        == Some(n.uid.as_str());
    if cleaned {
        drop_claim(&api, host, &n.uid, None, previous.as_ref()).await?;
        tracing::info!(byomachine = %n.name, host = %host_name, "host cleaned by the agent; claim dropped");
        ctx.claims().made.remove(&n.uid);
        return Ok(None);
    }
    let lease = ctx.leases.get(&ObjectRef::new(&host_name).within(&n.ns));
    let lease_expiry = lease.as_deref().and_then(selection::lease_expiry);
    let requested_at: Option<Timestamp> = host
        .annotations()
        .get(labels::RELEASE_REQUESTED_AT)
        .and_then(|s| s.parse().ok());
    let timeout =
        SignedDuration::try_from(ctx.settings.release_timeout).unwrap_or(SignedDuration::MAX);
    let deadline = requested_at.and_then(|r| r.checked_add(timeout).ok());
    let forced = bm.annotations().contains_key(labels::FORCE_RELEASE);
    let reason = if forced {
        Some(reasons::FORCED_RELEASE)
    } else if lease_expiry.is_none_or(|e| e <= t) {
        Some(reasons::HOST_OFFLINE_RELEASE)
    } else if deadline.is_some_and(|d| d <= t) {
        Some(reasons::RELEASE_TIMED_OUT)
    } else {
        None
    };
    if let Some(reason) = reason {
        tracing::info!(byomachine = %n.name, host = %host_name, reason, "dropping the claim without a confirmed clean-up; host marked needsCleanup");
        drop_claim(&api, host, &n.uid, Some(reason), previous.as_ref()).await?;
        ctx.claims().made.remove(&n.uid);
        return Ok(None);
    }
    let claim_requested = host
        .spec
        .claim
        .as_ref()
        .is_some_and(|c| c.release_requested);
    if !claim_requested || requested_at.is_none() {
        let mut host = host;
        if let Some(c) = host.spec.claim.as_mut() {
            c.release_requested = true;
        }
        host.annotations_mut()
            .insert(labels::RELEASE_REQUESTED_AT.into(), t.to_string());
        match api
            .replace(
                &host_name,
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &host,
            )
            .await
        {
            Ok(_) => {}
            // The host changed meanwhile: its event requeues us.
            Err(e) if is_conflict(&e) => return Ok(Some(Action::requeue(Duration::from_secs(1)))),
            Err(e) => {
                return Err(Error::kube(format!(
                    "requesting release of ByoHost {host_name}"
                ))(e));
            }
        }
    }
    conditions::set(
        &mut status.conditions,
        types::READY,
        false,
        reasons::RELEASING,
        &format!("waiting for the agent on ByoHost {host_name} to reset the host"),
        generation,
        Time(t),
    );
    // Wake up when the Lease would expire or the timeout passes, whichever is first; agent
    // progress arrives as host events.
    let deadline = deadline.unwrap_or_else(|| t.checked_add(timeout).unwrap_or(t));
    let next = [lease_expiry, Some(deadline)]
        .into_iter()
        .flatten()
        .min()
        .map(|at| at.duration_since(t))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or(Duration::from_secs(5));
    Ok(Some(Action::requeue(next + Duration::from_millis(500))))
}

/// Applies `status` (server-side apply, field manager `byoh-controller`) unless it equals what
/// `bm` already has.
async fn apply_status(
    api: &Api<ByoMachine>,
    bm: &ByoMachine,
    status: &ByoMachineStatus,
) -> Result<(), Error> {
    if bm.status.as_ref() == Some(status) {
        return Ok(());
    }
    let name = bm.name_any();
    let patch = serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "ByoMachine",
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!("applying status of ByoMachine {name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_have_the_documented_shape() {
        let id = provider_id("host-1");
        let suffix = id.strip_prefix("byoh://host-1/").unwrap();
        assert_eq!(suffix.len(), 6);
        assert!(
            suffix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_ne!(provider_id("h"), provider_id("h"));
    }

    #[test]
    fn owner_machine_needs_a_controller_ref_of_kind_machine() {
        let mut bm = ByoMachine::new("m", Default::default());
        let oref = |kind: &str, controller| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "cluster.x-k8s.io/v1beta2".into(),
                kind: kind.into(),
                name: "owner".into(),
                uid: "u".into(),
                controller: Some(controller),
                ..Default::default()
            }
        };
        bm.metadata.owner_references = Some(vec![oref("MachineSet", true), oref("Machine", false)]);
        assert_eq!(owner_machine(&bm), None);
        bm.metadata.owner_references = Some(vec![oref("Machine", true)]);
        assert_eq!(owner_machine(&bm).as_deref(), Some("owner"));
    }
}
