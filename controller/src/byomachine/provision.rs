//! Provisioning a ByoMachine: wait for its gates, claim a host, then report the host's
//! providerID, addresses and readiness once it has bootstrapped.

use super::claim::{Claimed, claim_host, find_claimed_host};
use super::moved;
use super::{
    WAIT_FOR_HOST_REQUEUE, apply_status, claim_blocker, machine_ref, mark_waiting, now,
    previous_machine_cached,
};
use crate::bootstrap_data::{self, Verdict};
use crate::bootstrap_failures;
use crate::capi::{Cluster, Machine};
use crate::context::Context;
use crate::error::Error;
use crate::events;
use crate::installerconfig::Ensured;
use crate::selection::{self, Request};
use byoh_api::byohost::{HostClaim, MachineReference};
use byoh_api::byomachine::HostReference;
use byoh_api::common::{Initialization, LocalObjectReference};
use byoh_api::conditions::{self, reasons, types};
use byoh_api::{ByoHost, ByoMachine, ByoMachineStatus, labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a ByoMachine waits before its claim: the `Ready`/`HostClaimed` reason and message, and
/// the generation observed.
struct Waiting {
    reason: &'static str,
    message: String,
    generation: Option<i64>,
}

/// Marks `status` waiting as `waiting` says, writes it, and publishes it as a Warning Event of
/// the same reason when the ByoMachine did not say so already: one Event per new answer, not
/// one per retry.
///
/// # Errors
/// [`Error`] when the status cannot be written.
async fn wait_and_tell(
    ctx: &Context,
    api: &Api<ByoMachine>,
    bm: &ByoMachine,
    status: &mut ByoMachineStatus,
    waiting: Waiting,
) -> Result<(), Error> {
    let Waiting {
        reason,
        message,
        generation,
    } = waiting;
    let new_answer = bm.status.as_ref().is_none_or(|s| {
        !s.conditions
            .iter()
            .any(|c| c.type_ == types::HOST_CLAIMED && c.reason == reason && c.message == message)
    });
    mark_waiting(status, reason, &message, generation);
    apply_status(api, bm, status).await?;
    if new_answer {
        events::publish(
            &ctx.recorder,
            bm,
            EventType::Warning,
            reason,
            events::CLAIM,
            message,
        )
        .await;
    }
    Ok(())
}

/// How soon a ByoMachine whose bootstrap data Secret is missing or not its own looks again
/// (Secrets are not watched).
const BOOTSTRAP_DATA_REQUEUE: Duration = Duration::from_secs(10);

pub(super) async fn provision(
    ctx: &Arc<Context>,
    api: &Api<ByoMachine>,
    bm: &ByoMachine,
    machine: &Machine,
    cluster: &Cluster,
    mut status: ByoMachineStatus,
) -> Result<Action, Error> {
    let n = machine_ref(bm)?;
    let generation = bm.meta().generation;
    let cluster_name = cluster.name_any();

    // Already claimed (also after a crash between claim and status write)?
    let mut host = find_claimed_host(ctx, &n).await?;
    // A ByoMachine with a providerID has its node on the host that providerID names: keep that
    // host (its claim moved here with `clusterctl move`), never claim another.
    if host.is_none()
        && let Some(pid) = bm.spec.provider_id.as_deref().filter(|p| !p.is_empty())
    {
        let hosts = ctx.hosts.state();
        if let Some(h) = moved::moved_claim(&hosts, &n, pid) {
            host = moved::rekey(ctx, h, &n, pid).await?.map(Arc::new);
        }
        if host.is_none() {
            let message = format!(
                "spec.providerID is {pid} but no ByoHost of this namespace carries that claim; a ByoMachine keeps the host of its providerID and never claims another"
            );
            mark_waiting(&mut status, reasons::HOST_DELETED, &message, generation);
            conditions::Marker::new(generation, Time(now())).mark_false(
                &mut status.conditions,
                types::HOST_CLAIMED,
                reasons::HOST_DELETED,
                &message,
            );
            apply_status(api, bm, &status).await?;
            return Ok(Action::requeue(WAIT_FOR_HOST_REQUEUE));
        }
    }
    if host.is_none() {
        if let Some(href) = status.host_ref.clone() {
            // The host we had is gone (or lost our claim).
            let provisioned =
                status.initialization.as_ref().and_then(|i| i.provisioned) == Some(true);
            if provisioned {
                mark_waiting(
                    &mut status,
                    reasons::HOST_DELETED,
                    &format!(
                        "ByoHost {} no longer exists or no longer carries this claim",
                        href.name
                    ),
                    generation,
                );
                conditions::Marker::new(generation, Time(now())).mark_false(
                    &mut status.conditions,
                    types::HOST_CLAIMED,
                    reasons::HOST_DELETED,
                    "",
                );
                apply_status(api, bm, &status).await?;
                return Ok(Action::await_change());
            }
            status.host_ref = None;
        }
        if let Some((reason, message)) = claim_blocker(machine, cluster) {
            mark_waiting(&mut status, reason, message, generation);
            apply_status(api, bm, &status).await?;
            return Ok(Action::await_change());
        }
        // The claim grants its host the data Secret: only the one the Machine's bootstrap
        // provider made for it (issue 43). Secrets are not watched: look again later.
        match bootstrap_data::check(&ctx.client, &n.ns, machine).await? {
            Verdict::Owned => {}
            Verdict::Missing(message) => {
                mark_waiting(
                    &mut status,
                    reasons::WAITING_FOR_BOOTSTRAP_DATA,
                    &message,
                    generation,
                );
                apply_status(api, bm, &status).await?;
                return Ok(Action::requeue(BOOTSTRAP_DATA_REQUEUE));
            }
            Verdict::NotOwned(message) => {
                tracing::warn!(byomachine = %n.name, namespace = %n.ns, "{message}");
                let waiting = Waiting {
                    reason: reasons::BOOTSTRAP_DATA_NOT_OWNED,
                    message,
                    generation,
                };
                wait_and_tell(ctx, api, bm, &mut status, waiting).await?;
                return Ok(Action::requeue(BOOTSTRAP_DATA_REQUEUE));
            }
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
                match crate::installerconfig::ensure(ctx, bm, r, machine, &cluster_name).await? {
                    Ensured::Ready(reference) => Some(reference),
                    Ensured::CannotServe(why) => {
                        // Refused before any host is claimed: a claim would fail its install, go
                        // back to the pool and be followed by the next host (issue 36).
                        mark_waiting(
                            &mut status,
                            reasons::INSTALLER_CANNOT_SERVE_VERSION,
                            &why,
                            generation,
                        );
                        apply_status(api, bm, &status).await?;
                        return Ok(Action::await_change());
                    }
                }
            }
            None => None,
        };
        let (service_cidrs, pod_cidrs) = cluster.spec.cidrs();
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
            control_plane_endpoint: cluster
                .spec
                .control_plane_endpoint
                .clone()
                .filter(|e| !e.host.is_empty()),
            service_cidrs,
            pod_cidrs,
            release_requested: false,
            remediation: None,
        };
        let machines_known = ctx.machines_ready.is_ready();
        // Before the Machine cache is filled, absence proves nothing: keep such hosts held.
        let machine_exists = |host: &str, m: &MachineReference| {
            !machines_known || previous_machine_cached(ctx, &n.ns, host, m)
        };
        let min_memory_bytes = bm
            .spec
            .min_memory
            .as_ref()
            .map(byoh_api::quantity::value)
            .transpose()
            .map_err(|e| {
                Error::Invalid(format!(
                    "ByoMachine {}/{}: spec.minMemory {e}",
                    n.ns, n.name
                ))
            })?;
        let req = Request {
            namespace: &n.ns,
            selector: bm.spec.selector.as_ref(),
            arch: bm.labels().get(labels::HOST_ARCH).map(String::as_str),
            os: bm.labels().get(labels::HOST_OS).map(String::as_str),
            min_cpu: bm.spec.min_cpu,
            min_memory_bytes,
            accelerator_vendor: bm.spec.accelerator_vendor.as_deref(),
            kubernetes_version: machine.spec.version.as_deref(),
            failure_domain: machine.spec.failure_domain.as_deref(),
            cluster_name: &cluster_name,
            machine_exists: Some(selection::MachineLookup(&machine_exists)),
            bootstrap_backoff: Some(ctx.settings.bootstrap_backoff),
        };
        match claim_host(ctx, &n, &req, &claim).await? {
            Claimed::Host(h) => {
                ctx.claims().ready_since.remove(&n.uid);
                ctx.metrics
                    .claim_duration
                    .observe(ready_since.elapsed().as_secs_f64());
                tracing::info!(byomachine = %n.name, namespace = %n.ns, host = %h.name_any(), "claimed host");
                events::publish(
                    &ctx.recorder,
                    bm,
                    EventType::Normal,
                    events::HOST_CLAIMED,
                    events::CLAIM,
                    format!("claimed ByoHost {}", h.name_any()),
                )
                .await;
                host = Some(h);
            }
            Claimed::NoneEligible(why, back_off_ends) => {
                let waiting = Waiting {
                    reason: reasons::NO_HOST_AVAILABLE,
                    message: format!("no free, live ByoHost fits: {why}"),
                    generation,
                };
                wait_and_tell(ctx, api, bm, &mut status, waiting).await?;
                // A back-off ends without an event of the host: look again then.
                let back_off = back_off_ends
                    .and_then(|t| Duration::try_from(t.duration_since(now())).ok())
                    .map(|d| d + Duration::from_secs(1));
                return Ok(Action::requeue(
                    back_off.map_or(WAIT_FOR_HOST_REQUEUE, |d| d.min(WAIT_FOR_HOST_REQUEUE)),
                ));
            }
            Claimed::Contended => {
                mark_waiting(
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
    let marker = conditions::Marker::new(generation, Time(now()));
    status.host_ref = Some(HostReference {
        name: host_name.clone(),
        uid: host.uid().unwrap_or_default(),
    });
    status.failure_domain = host.labels().get(labels::FAILURE_DOMAIN).cloned();
    marker.mark_true(
        &mut status.conditions,
        types::HOST_CLAIMED,
        reasons::AS_EXPECTED,
        "",
    );

    if super::decommission::requested(&host) {
        super::decommission::remove_machine(ctx, &n, machine, &host_name).await?;
    }
    let hs = host.status.clone().unwrap_or_default();
    let bootstrapped = conditions::is_true(&hs.conditions, types::BOOTSTRAP_SUCCEEDED)
        && hs.observed_machine_uid.as_deref() == Some(n.uid.as_str());
    if !bootstrapped {
        // A failed bootstrap says so on the ByoMachine too (what a MachineHealthCheck's user
        // reads); the host keeps its claim until the Machine is deleted.
        let (reason, message) = if bootstrap_failures::claim_failed(&host, &n.uid) {
            let why = hs
                .conditions
                .iter()
                .find(|c| c.type_ == types::BOOTSTRAP_SUCCEEDED);
            (
                why.map_or(reasons::BOOTSTRAP_FAILED, |c| c.reason.as_str()),
                format!(
                    "ByoHost {host_name} reports its bootstrap failed: {}",
                    why.map_or("", |c| c.message.as_str())
                ),
            )
        } else {
            (
                reasons::WAITING_FOR_BOOTSTRAP,
                format!("waiting for ByoHost {host_name} to report BootstrapSucceeded"),
            )
        };
        marker.mark_false(&mut status.conditions, types::READY, reason, &message);
        apply_status(api, bm, &status).await?;
        return Ok(Action::await_change());
    }
    if bootstrap_failures::recorded(&host).is_some() {
        // Bootstrapped: the failures before no longer hold the host back.
        let hosts: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &n.ns);
        let patch =
            serde_json::json!({"metadata": {"annotations": {labels::BOOTSTRAP_FAILURES: null}}});
        hosts
            .patch(&host_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "removing the bootstrap failures of ByoHost {}/{host_name}",
                n.ns
            )))?;
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
    marker.mark_true(
        &mut status.conditions,
        types::READY,
        reasons::AS_EXPECTED,
        "",
    );
    apply_status(api, bm, &status).await?;
    Ok(Action::await_change())
}
