//! Liveness on the ByoHost: the controller mirrors the expiry of each host's Lease onto the
//! ByoHost as the condition `LeaseCurrent`, as Kubernetes' node lifecycle controller marks a
//! Node whose kubelet stopped renewing its Lease. So `kubectl get byohosts` (column `Online`)
//! and `kubectl describe byohost` show a host whose agent stopped, with the time of its last
//! renewal, instead of the `Ready=True` its agent wrote last.
//!
//! - `LeaseCurrent=True` (`AsExpected`) while `renewTime + leaseDurationSeconds > now`;
//! - `LeaseCurrent=False` with reason `LeaseExpired` ("the agent last renewed its Lease at R;
//!   it expired at E") once it has passed, or `NoLease` when the host has no Lease at all.
//!
//! The decision is [`lease_condition`] (pure); the reconciler applies the one condition under
//! its own field manager ([`FIELD_MANAGER`]; the agent's conditions keep theirs), only when it
//! changes, and looks again when the Lease would expire. A host whose agent writes its own
//! `LeaseCurrent` is corrected at its next event.

use crate::cache::Subscription;
use crate::context::{Context, Shutdown};
use crate::error::Error;
use crate::selection::lease_expiry;
use byoh_api::ByoHost;
use byoh_api::conditions::{reasons, types};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// Field manager of the `LeaseCurrent` condition.
pub const FIELD_MANAGER: &str = "byoh-controller-liveness";

/// Reconciler name in metrics and logs.
const NAME: &str = "liveness";

/// The `LeaseCurrent` condition of a host whose Lease is `lease` at `now` (keeping the
/// transition time of the same status in `previous`, the host's current conditions), and when
/// to look again: the Lease's expiry while it is live, else never (its next renewal is an
/// event).
pub fn lease_condition(
    previous: &[Condition],
    lease: Option<&Lease>,
    now: Timestamp,
) -> (Condition, Option<Timestamp>) {
    let expiry = lease.and_then(lease_expiry);
    let (live, reason, message, next) = match (lease, expiry) {
        (_, Some(e)) if e > now => (true, reasons::AS_EXPECTED, String::new(), Some(e)),
        (Some(l), _) => {
            let renewed = l
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
                .map_or_else(|| "never".to_string(), |t| format!("at {}", t.0));
            let expired = expiry.map_or_else(|| "at once".to_string(), |e| format!("at {e}"));
            let message = format!(
                "the agent last renewed its Lease {renewed}; it expired {expired}: the agent is stopped or cannot reach the API server (journalctl -u byoh-agent on the host)"
            );
            (false, reasons::LEASE_EXPIRED, message, None)
        }
        (None, _) => {
            let message = "the host has no Lease: its agent has not started since it registered, or the Lease was deleted".to_string();
            (false, reasons::NO_LEASE, message, None)
        }
    };
    let status = if live { "True" } else { "False" };
    let since = previous
        .iter()
        .find(|c| c.type_ == types::LEASE_CURRENT && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: types::LEASE_CURRENT.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: since,
    };
    (condition, next)
}

/// The liveness reconciler, on the shared ByoHost cache and its events and on the hosts'
/// Lease events; ends when `shutdown` resolves.
pub fn controller(
    ctx: Arc<Context>,
    host_events: Subscription<ByoHost>,
    lease_events: Subscription<Lease>,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let hosts = host_events.map(|h| Ok::<_, kube::runtime::watcher::Error>((*h).clone()));
    let results = kube::runtime::Controller::for_stream(hosts, ctx.hosts.clone())
        .reconcile_on(lease_events.filter_map(|lease| {
            // A host's Lease is `<pool>.<host>` in the host-lease namespace.
            let name = lease.name_any();
            let host = byoh_api::names::parse_host_lease_name(&name)
                .map(|(pool, host)| ObjectRef::<ByoHost>::new(host).within(pool));
            futures::future::ready(host)
        }))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    crate::cache::drain(results, "liveness")
}

async fn reconcile(host: Arc<ByoHost>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    // Until both caches hold their first list, a missing Lease proves nothing.
    ctx.hosts_ready.wait().await;
    ctx.leases_ready.wait().await;
    let (name, ns) = (host.name_any(), host.namespace().unwrap_or_default());
    if host.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let previous = host
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let lease = ctx.host_lease(&ns, &name);
    let (condition, next) = lease_condition(previous, lease.as_deref(), now);
    let unchanged = previous.iter().any(|c| {
        c.type_ == condition.type_
            && c.status == condition.status
            && c.reason == condition.reason
            && c.message == condition.message
    });
    if !unchanged {
        let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoHost",
            "status": {"conditions": [condition]},
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
        .map_err(Error::kube(format!(
            "writing LeaseCurrent of ByoHost {ns}/{name}"
        )))?;
        tracing::info!(host = %name, namespace = %ns, status = %condition.status, reason = %condition.reason, "host liveness changed");
    }
    // Look again just after the expiry; a renewal before it is an event anyway.
    Ok(next
        .and_then(|t| Duration::try_from(t.duration_since(now)).ok())
        .map_or_else(Action::await_change, |d| {
            Action::requeue(d + Duration::from_millis(500))
        }))
}

fn error_policy(host: Arc<ByoHost>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(NAME, error.metric_label());
    tracing::warn!(host = %host.name_any(), namespace = %host.namespace().unwrap_or_default(), %error, "liveness reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn lease(renewed: &str, secs: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(at(renewed))),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn live_expired_and_missing_leases() {
        let l = lease("2026-06-01T12:00:00Z", 40);
        let (c, next) = lease_condition(&[], Some(&l), at("2026-06-01T12:00:39Z"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "AsExpected")
        );
        assert_eq!(next, Some(at("2026-06-01T12:00:40Z")));

        let (c, next) = lease_condition(&[c], Some(&l), at("2026-06-01T12:00:40Z"));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "LeaseExpired")
        );
        assert!(
            c.message
                .contains("renewed its Lease at 2026-06-01T12:00:00Z")
                && c.message.contains("expired at 2026-06-01T12:00:40Z"),
            "{}",
            c.message
        );
        assert_eq!(c.last_transition_time.0, at("2026-06-01T12:00:40Z"));
        assert_eq!(next, None);

        // Still expired later: the transition time stays (no write is needed).
        let (later, _) = lease_condition(
            std::slice::from_ref(&c),
            Some(&l),
            at("2026-06-01T13:00:00Z"),
        );
        assert_eq!(later, c);

        let (c, next) = lease_condition(&[], None, at("2026-06-01T12:00:00Z"));
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "NoLease"));
        assert_eq!(next, None);
    }
}
