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
//! A ByoMachine that has a providerID but no host claimed for its UID was moved
//! (`clusterctl move`, a restore): the claim carrying its providerID and name is re-keyed to its
//! UID (`byomachine/moved.rs`); it never claims another host.
//!
//! Release (the ByoMachine is deleted): `spec.claim.releaseRequested` on the host (time in the
//! host annotation `byoh.infrastructure.cluster.x-k8s.io/release-requested-at`); once the agent
//! reports `status.cleanedMachineUID` equal to the claim's UID the claim is dropped. A host whose
//! Lease expired, a release older than `--release-timeout`, or the force-release annotation
//! drop the claim at once and set `spec.needsCleanup`. Then the installer config's finalizer and
//! the ByoMachine's finalizer go. A ByoMachine whose host vanished is released at once. A
//! ByoMachine deleted by `clusterctl move` (annotation [`labels::DELETE_FOR_MOVE`]) releases
//! nothing: its claim lives on in the target management cluster.
//!
//! Triggers: the ByoMachine itself, its Machine (bootstrap data), its Cluster (provisioned,
//! control plane initialized, paused), and every ByoHost and Lease change in its namespace
//! for ByoMachines still waiting for a host — no fixed polling for hosts.

use crate::capi::{self, Cluster, Machine};
use crate::context::{Context, FIELD_MANAGER};
use crate::error::Error;
use crate::selection;
use byoh_api::byohost::MachineReference;
use byoh_api::conditions::{self, reasons, types};
use byoh_api::{ByoMachine, ByoMachineStatus, finalizers, labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

mod claim;
mod decommission;
mod moved;
mod provision;
mod release;
mod triggers;

use provision::provision;
use release::release;
pub use triggers::{Triggers, controller, on_host_event};

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

/// Scheme of BYOH providerIDs.
const PROVIDER_ID_SCHEME: &str = "byoh://";

/// The providerID for a claim of `host`: `byoh://<host>/<6 random lower-case alnum>`.
pub fn provider_id(host: &str) -> String {
    format!("{PROVIDER_ID_SCHEME}{host}/{}", random_suffix(6))
}

/// The host a providerID of [`provider_id`]'s shape names; `None` for any other shape.
fn provider_id_host(id: &str) -> Option<&str> {
    let (host, _) = id.strip_prefix(PROVIDER_ID_SCHEME)?.split_once('/')?;
    Some(host)
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

/// Machine `m` (same name and UID) in namespace `ns` from the Machine cache, if it holds it.
fn cached_machine(ctx: &Context, ns: &str, m: &MachineReference) -> Option<Arc<capi::Machine>> {
    ctx.machines
        .get(&ObjectRef::new_with(&m.name, capi::machine_resource()).within(ns))
        .filter(|x| x.uid().as_deref() == Some(m.uid.as_str()))
}

/// Whether the Machine cache holds Machine `m` (same name and UID) in namespace `ns`.
fn machine_cached(ctx: &Context, ns: &str, m: &MachineReference) -> bool {
    cached_machine(ctx, ns, m).is_some()
}

/// Whether the Machine cache holds, in namespace `ns`, the Machine that `host`'s
/// `spec.previousMachineRef` (`previous`) names: see [`is_previous_machine`].
fn previous_machine_cached(
    ctx: &Context,
    ns: &str,
    host: &str,
    previous: &MachineReference,
) -> bool {
    ctx.machines
        .get(&ObjectRef::new_with(&previous.name, capi::machine_resource()).within(ns))
        .is_some_and(|x| is_previous_machine(&x, host, previous))
}

/// Whether `machine` is the Machine of `host`'s last claim, which `previous` (the host's
/// `spec.previousMachineRef`) names: same name and either the same UID or — after
/// `clusterctl move`, which re-creates the Machine under a new UID and copies the ByoHost
/// as it is — a `spec.providerID` of this host's (`byoh://<host>/…`, see [`provider_id`]).
/// A Machine re-created under the same name that never ran on this host is another machine.
fn is_previous_machine(machine: &capi::Machine, host: &str, previous: &MachineReference) -> bool {
    machine.name_any() == previous.name
        && (machine.uid().as_deref() == Some(previous.uid.as_str())
            || machine
                .spec
                .provider_id
                .as_deref()
                .and_then(provider_id_host)
                .is_some_and(|h| h == host))
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

/// Requeue on errors after a short delay.
pub fn error_policy(bm: Arc<ByoMachine>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(NAME, error.metric_label());
    tracing::warn!(byomachine = %bm.name_any(), namespace = %bm.namespace().unwrap_or_default(), %error, "reconcile failed");
    Action::requeue(Duration::from_millis(500 + rand::random_range(0..1500)))
}

/// Recomputes the host gauges from the caches: hosts per pool and state
/// ([`crate::selection::host_state`]), and per reported agent version.
pub fn update_host_gauges(ctx: &Context) {
    let t = now();
    let mut counts = crate::metrics::HostCounts::new();
    let mut versions = std::collections::BTreeMap::<String, i64>::new();
    for h in ctx.hosts.state() {
        let version = h
            .status
            .as_ref()
            .and_then(|s| s.agent_version.clone())
            .unwrap_or_else(|| "unknown".into());
        *versions.entry(version).or_default() += 1;
        let pool = h.namespace().unwrap_or_default();
        let lease = ctx.host_lease(&pool, &h.name_any());
        let state = selection::host_state(&h, lease.as_deref(), t);
        *counts.entry(pool).or_default().entry(state).or_default() += 1;
    }
    ctx.metrics.set_hosts(&counts);
    ctx.metrics.set_agents(&versions);
}

struct MachineRef {
    ns: String,
    name: String,
    uid: String,
}

fn machine_ref(bm: &ByoMachine) -> Result<MachineRef, Error> {
    let name = bm.name_any();
    let ns = bm
        .namespace()
        .ok_or_else(|| Error::Invalid(format!("ByoMachine {name} has no namespace")))?;
    let uid = bm
        .uid()
        .ok_or_else(|| Error::Invalid(format!("ByoMachine {ns}/{name} has no UID")))?;
    Ok(MachineRef { ns, name, uid })
}

/// Reconciles one ByoMachine.
///
/// # Errors
/// [`Error`] when an API request fails.
pub async fn reconcile(bm: Arc<ByoMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    // Selection and release decide from the host and Lease caches: after a start or a leader
    // change, an empty cache would read as "no host" or "host offline" (a release would then
    // skip the agent's graceful clean-up). Wait until both hold their first list.
    ctx.hosts_ready.wait().await;
    ctx.leases_ready.wait().await;
    let n = machine_ref(&bm)?;
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
        (Some(c), Some(m)) => capi::cluster_paused(c) || claim_blocker(m, c).is_some(),
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
    let changed = conditions::Marker::new(generation, Time(now())).mark_paused(
        &mut status.conditions,
        paused,
        "the Cluster or the ByoMachine is paused",
    );
    if paused {
        if changed {
            apply_status(&api, &bm, &status).await?;
        }
        return Ok(Action::await_change());
    }

    // Deletion is handled here, before `finalizer()`, not in its `Cleanup` branch: the helper
    // removes the finalizer as soon as `Cleanup` returns `Ok`, whatever the `Action`, so a
    // release still waiting for the agent (a requeue, not a failure) could only stay there by
    // returning an error (error metric, `error_policy` backoff). The release also writes the
    // ByoMachine's status while it waits. So the release runs first, and `finalizer()` is
    // called only once it is done: its `Cleanup` closure has nothing left to do but let the
    // helper remove the finalizer.
    if bm.meta().deletion_timestamp.is_some() {
        if !bm.finalizers().iter().any(|f| f == finalizers::BYOMACHINE) {
            return Ok(Action::await_change());
        }
        // Deleted by `clusterctl move` after it made the ByoMachine in the target management
        // cluster: the host stays claimed and a node, and the claim moves with it.
        if bm.annotations().contains_key(labels::DELETE_FOR_MOVE) {
            tracing::info!(byomachine = %n.name, namespace = %n.ns, "deleted for clusterctl move: no release");
        } else {
            if let Some(wait) = release(&ctx, &bm, &n, &mut status).await? {
                apply_status(&api, &bm, &status).await?;
                return Ok(wait);
            }
            crate::installerconfig::release(&ctx, &bm).await?;
        }
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
            FinalizerEvent::Apply(bm) => {
                provision(ctx_ref, api_ref, &bm, &machine, &cluster, status).await
            }
            // Not reached: `finalizer()` decides from this same object, and a deleted one
            // was handled above.
            FinalizerEvent::Cleanup(_) => Ok(Action::await_change()),
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
pub fn claim_blocker(machine: &Machine, cluster: &Cluster) -> Option<(&'static str, &'static str)> {
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

fn mark_waiting(
    status: &mut ByoMachineStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let marker = conditions::Marker::new(generation, Time(now()));
    marker.mark_false(&mut status.conditions, types::READY, reason, message);
    if status.host_ref.is_none() {
        marker.mark_false(&mut status.conditions, types::HOST_CLAIMED, reason, message);
    }
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
        assert_eq!(provider_id_host(&id), Some("host-1"));
    }

    #[test]
    fn the_previous_machine_is_found_by_uid_or_after_a_move_by_its_provider_id() {
        let previous = MachineReference {
            name: "md-0-abc".into(),
            uid: "uid-source".into(),
        };
        let machine = |name: &str, uid: &str, provider_id: Option<&str>| {
            let mut m = capi::Machine::new(
                name,
                &capi::machine_resource(),
                capi::MachineSpec {
                    provider_id: provider_id.map(String::from),
                    ..Default::default()
                },
            );
            m.metadata.uid = Some(uid.into());
            m
        };
        // Where it was claimed: the same Machine by name and UID.
        assert!(is_previous_machine(
            &machine("md-0-abc", "uid-source", None),
            "h1",
            &previous
        ));
        // Moved (`clusterctl move`): a new UID, the providerID of a claim of this host.
        let moved = machine("md-0-abc", "uid-target", Some("byoh://h1/x7k2p9"));
        assert!(is_previous_machine(&moved, "h1", &previous));
        // Not this host's: the providerID names another host, one only starting like it, none.
        assert!(!is_previous_machine(&moved, "h", &previous));
        assert!(!is_previous_machine(&moved, "h10", &previous));
        for other in [
            Some("byoh://h10/x7k2p9"),
            Some("h1/x7k2p9"),
            Some("byoh://h1"),
            None,
        ] {
            let m = machine("md-0-abc", "uid-target", other);
            assert!(!is_previous_machine(&m, "h1", &previous), "{other:?}");
        }
        // Another name is another Machine, whatever its UID or providerID.
        let renamed = machine("md-0-xyz", "uid-source", Some("byoh://h1/x7k2p9"));
        assert!(!is_previous_machine(&renamed, "h1", &previous));
    }

    #[test]
    fn machine_spec_reads_cluster_apis_provider_id_field() {
        let spec: capi::MachineSpec =
            serde_json::from_value(serde_json::json!({"providerID": "byoh://h1/abc123"})).unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("byoh://h1/abc123"));
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
