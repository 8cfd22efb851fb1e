//! Releasing a deleted ByoMachine's host: request the agent's clean-up, or drop the claim at
//! once (host offline, timeout, forced) and mark the host `needsCleanup`.

use super::claim::find_claimed_host;
use super::{MachineRef, now, owner_machine_ref};
use crate::bootstrap_failures::{self, BootstrapFailures};
use crate::capi;
use crate::context::Context;
use crate::error::{Error, is_conflict, is_not_found};
use crate::{events, selection};
use byoh_api::byohost::{MachineReference, NeedsCleanup};
use byoh_api::conditions::{self, reasons, types};
use byoh_api::{ByoHost, ByoMachine, ByoMachineStatus, labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use std::time::Duration;

/// Drops the claim of `machine_uid` from `host` (and its labels and release annotation),
/// optionally marking the host `needsCleanup` with `reason`, and records `previous` (the
/// claim's CAPI Machine) as `spec.previousMachineRef`, and the claim's failed bootstrap if the
/// host reports one or `timed_out` says its Node never appeared ([`note_failure`]). Retries on conflict; a host that is gone or no longer
/// claimed by `machine_uid` counts as released.
pub(super) async fn drop_claim(
    ctx: &Context,
    api: &Api<ByoHost>,
    host: ByoHost,
    machine_uid: &str,
    reason: Option<&str>,
    previous: Option<&MachineReference>,
    timed_out: bool,
) -> Result<(), Error> {
    let name = host.name_any();
    let mut host = host;
    for _ in 0..5 {
        if host.claimed_by() != Some(machine_uid) {
            return Ok(());
        }
        let failure = note_failure(&mut host, machine_uid, previous, timed_out);
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
            .replace(&name, &crate::context::post_params(), &host)
            .await
        {
            Ok(_) => {
                if let Some(record) = failure {
                    failure_event(ctx, &host, &record).await;
                }
                return Ok(());
            }
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

/// Records on `host` that its claim by ByoMachine `machine_uid` (of CAPI Machine `previous`)
/// failed to bootstrap, if the host reports so or `timed_out` (a MachineHealthCheck's
/// `NodeStartupTimeout` on the Machine) and it is not recorded yet
/// ([`bootstrap_failures::note`]); the caller writes the host, then publishes the record
/// returned ([`failure_event`]).
fn note_failure(
    host: &mut ByoHost,
    machine_uid: &str,
    previous: Option<&MachineReference>,
    timed_out: bool,
) -> Option<BootstrapFailures> {
    let machine = previous.map_or("", |m| m.name.as_str());
    let record = bootstrap_failures::note(host, machine_uid, machine, timed_out, now())?;
    tracing::warn!(
        host = %host.name_any(),
        machine,
        failures = record.count,
        "the host's bootstrap failed; it is held back from new claims until its back-off passes"
    );
    Some(record)
}

/// Publishes the Warning Event [`events::BOOTSTRAP_FAILED`] on `host` for the failure `record`
/// just written: the Machine, how many in a row, until when the host is held back and how an
/// administrator frees it.
async fn failure_event(ctx: &Context, host: &ByoHost, record: &BootstrapFailures) {
    let until = ctx.settings.bootstrap_backoff.held_until(record);
    let name = host.name_any();
    events::publish(
        &ctx.recorder,
        host,
        EventType::Warning,
        events::BOOTSTRAP_FAILED,
        events::RELEASE,
        format!(
            "the bootstrap of Machine {} failed ({} in a row); the host is held back from new claims until {until} (once it is fixed, kubectl annotate byohost {name} {}- frees it)",
            record.machine,
            record.count,
            labels::BOOTSTRAP_FAILURES
        ),
    )
    .await;
}

/// Publishes [`events::HOST_RELEASED`] on `bm` for `host`, whose claim was just dropped:
/// Normal after the agent's clean-up (`unconfirmed` `None`), else Warning with the reason the
/// claim went without it (a [`reasons`] value).
async fn released_event(ctx: &Context, bm: &ByoMachine, host: &str, unconfirmed: Option<&str>) {
    let (type_, note) = match unconfirmed {
        None => (
            EventType::Normal,
            format!("ByoHost {host} reset by its agent and back in the pool"),
        ),
        Some(reason) => (
            EventType::Warning,
            format!(
                "claim on ByoHost {host} dropped without its agent's clean-up ({reason}); the host is marked needsCleanup and is offered again only after its agent cleans it"
            ),
        ),
    };
    events::publish(
        &ctx.recorder,
        bm,
        type_,
        events::HOST_RELEASED,
        events::RELEASE,
        note,
    )
    .await;
}

/// Release step of a deleted ByoMachine. `Ok(None)`: released (or nothing to release);
/// `Ok(Some(action))`: waiting for the agent.
pub(super) async fn release(
    ctx: &Context,
    bm: &ByoMachine,
    n: &MachineRef,
    status: &mut ByoMachineStatus,
) -> Result<Option<Action>, Error> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &n.ns);
    let previous = owner_machine_ref(bm);
    // A MachineHealthCheck remediating the Machine because its Node never appeared.
    let timed_out = previous
        .as_ref()
        .and_then(|m| super::cached_machine(ctx, &n.ns, m))
        .is_some_and(|m| capi::node_startup_timed_out(&m));
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
            for h in super::claim::hosts_claimed_by(ctx, n) {
                drop_claim(
                    ctx,
                    &api,
                    (*h).clone(),
                    &n.uid,
                    Some(reasons::FORCED_RELEASE),
                    previous.as_ref(),
                    timed_out,
                )
                .await?;
                released_event(ctx, bm, &h.name_any(), Some(reasons::FORCED_RELEASE)).await;
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
        drop_claim(ctx, &api, host, &n.uid, None, previous.as_ref(), timed_out).await?;
        tracing::info!(byomachine = %n.name, host = %host_name, "host cleaned by the agent; claim dropped");
        released_event(ctx, bm, &host_name, None).await;
        ctx.claims().made.remove(&n.uid);
        return Ok(None);
    }
    let lease = ctx.host_lease(&n.ns, &host_name);
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
        drop_claim(
            ctx,
            &api,
            host,
            &n.uid,
            Some(reason),
            previous.as_ref(),
            timed_out,
        )
        .await?;
        released_event(ctx, bm, &host_name, Some(reason)).await;
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
        // Before the agent's clean-up replaces the phase `Failed` it reports now.
        let failure = note_failure(&mut host, &n.uid, previous.as_ref(), timed_out);
        if let Some(c) = host.spec.claim.as_mut() {
            c.release_requested = true;
        }
        host.annotations_mut()
            .insert(labels::RELEASE_REQUESTED_AT.into(), t.to_string());
        match api
            .replace(&host_name, &crate::context::post_params(), &host)
            .await
        {
            Ok(_) => {
                if let Some(record) = failure {
                    failure_event(ctx, &host, &record).await;
                }
            }
            // The host changed meanwhile: its event requeues us.
            Err(e) if is_conflict(&e) => return Ok(Some(Action::requeue(Duration::from_secs(1)))),
            Err(e) => {
                return Err(Error::kube(format!(
                    "requesting release of ByoHost {host_name}"
                ))(e));
            }
        }
    }
    conditions::Marker::new(generation, Time(t)).mark_false(
        &mut status.conditions,
        types::READY,
        reasons::RELEASING,
        &format!("waiting for the agent on ByoHost {host_name} to reset the host"),
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
