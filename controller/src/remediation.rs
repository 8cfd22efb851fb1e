//! The ByoRemediation reconciler: Cluster API's external remediation carried out on BYOH hosts
//! (`byoh_api::byoremediation`; a MachineHealthCheck with `spec.remediation.templateRef` naming a
//! `ByoRemediationTemplate` creates one ByoRemediation per unhealthy Machine, named as the
//! Machine, and deletes it once the Machine is healthy again).
//!
//! [`decide`] (pure) picks the next step from the ByoRemediation's spec and status and the
//! Machine's host, and whether the Machine's Cluster or the request is paused (then nothing
//! happens; looked at again every [`PAUSED_LOOK_AGAIN`]); [`reconcile`] carries it out:
//! - ask the host for the next remedy: `spec.claim.remediation` of the Machine's ByoHost
//!   (`{id: <ByoRemediation UID>/<step>, action}`, a JSON Patch that first tests the claim is
//!   still this ByoMachine's), the step appended to `status.steps`, a Normal Event
//!   `RemediationStep`; then look again once the step's timeout has passed;
//! - hand the Machine back to its owner (MachineSet, KubeadmControlPlane) once every step had
//!   its time and the Machine is still unhealthy, or when no step can help (no host, or a host
//!   that is not the Machine's node): the Machine's `OwnerRemediated` condition False, reason
//!   `WaitingForRemediation` (server-side apply of that one condition, field manager
//!   [`FIELD_MANAGER`]) — Cluster API's owners replace Machines whose `HealthCheckSucceeded` and
//!   `OwnerRemediated` are both False (`collections.IsUnhealthyAndOwnerRemediated`, v1.14) —,
//!   phase `HandedOver`, a Warning Event `HandedOver`.

use crate::context::Context;
use crate::error::Error;
use byoh_api::byoremediation::{
    ByoRemediationSpec, ByoRemediationStatus, PHASE_HANDED_OVER, PHASE_RUNNING, RemediationAction,
    RemediationStepStatus,
};
use byoh_api::conditions::phase;
use byoh_api::{ByoHost, ByoMachine, ByoRemediation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// Name of this reconciler (metrics, logs).
pub const NAME: &str = "byoremediation";
/// Field manager of the `OwnerRemediated` condition the hand-over sets on a Machine.
pub const FIELD_MANAGER: &str = "byoh-remediation";
/// Reason of the hand-over's `OwnerRemediated=False` (Cluster API v1beta2,
/// `MachineOwnerRemediatedWaitingForRemediationReason`).
pub const WAITING_FOR_REMEDIATION: &str = "WaitingForRemediation";
/// How often a paused ByoRemediation is looked at again.
pub const PAUSED_LOOK_AGAIN: Duration = Duration::from_secs(30);
/// Event reason: a step was asked of the host.
pub const REMEDIATION_STEP: &str = "RemediationStep";
/// Event reason: the Machine went back to its owner for replacement.
pub const HANDED_OVER: &str = "HandedOver";

/// The Machine's host as [`decide`] needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostView {
    /// The ByoHost's name.
    pub name: String,
    /// Whether the host is the Machine's node: claimed by its ByoMachine and reporting the
    /// claim provisioned (phase `Provisioned`, `observedMachineUID` the ByoMachine's).
    pub node: bool,
}

/// What [`reconcile`] does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Ask the host for step `index`.
    Ask {
        /// Index into the effective steps.
        index: usize,
        /// The remedy.
        action: RemediationAction,
    },
    /// The last step runs; look again at `until`.
    Wait {
        /// When the step's timeout ends.
        until: Timestamp,
    },
    /// Hand the Machine back to its owner, for `why`.
    HandOver {
        /// The condition message and Event note.
        why: String,
    },
    /// Handed over already: nothing to do.
    Done,
    /// The Machine's Cluster or the request is paused: nothing now, look again later.
    Paused,
}

/// The next step (pure): nothing once handed over, nor while `paused` (the Machine's Cluster
/// or the request carries Cluster API's pause: `spec.paused` or `cluster.x-k8s.io/paused`, as
/// during `clusterctl move`); a hand-over when there is no host or the host is not the
/// Machine's node (no remedy makes a Node of it) or the last step's timeout passed; the first or
/// next step otherwise, or a wait for the running step's timeout.
pub fn decide(
    spec: &ByoRemediationSpec,
    status: &ByoRemediationStatus,
    host: Option<&HostView>,
    paused: bool,
    now: Timestamp,
) -> Next {
    if status.phase.as_deref() == Some(PHASE_HANDED_OVER) {
        return Next::Done;
    }
    if paused {
        return Next::Paused;
    }
    let Some(host) = host else {
        return Next::HandOver {
            why: "the Machine has no BYOH host to remedy".into(),
        };
    };
    if !host.node {
        return Next::HandOver {
            why: format!(
                "ByoHost {} is not the Machine's node (its bootstrap did not succeed): restarting or rebooting it makes no Node",
                host.name
            ),
        };
    }
    let steps = spec.effective_steps();
    let timeout = SignedDuration::from_secs(i64::from(spec.effective_step_timeout_seconds()));
    let Some(last) = status.steps.last() else {
        return Next::Ask {
            index: 0,
            action: steps[0],
        };
    };
    let until = last.started_at.0 + timeout;
    if now < until {
        return Next::Wait { until };
    }
    match steps.get(status.steps.len()) {
        Some(action) => Next::Ask {
            index: status.steps.len(),
            action: *action,
        },
        None => Next::HandOver {
            why: format!(
                "still unhealthy {} s after the last remedy ({} on ByoHost {})",
                timeout.as_secs(),
                last.action.as_str(),
                last.host
            ),
        },
    }
}

/// Runs the reconciler until `shutdown`.
pub fn controller(
    ctx: Arc<Context>,
    shutdown: crate::context::Shutdown,
) -> impl Future<Output = ()> {
    let api: Api<ByoRemediation> = ctx.api();
    let results = crate::cache::controller_for(api, ctx.watch_config())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    crate::cache::drain(results, NAME)
}

fn error_policy(r: Arc<ByoRemediation>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(NAME, error.metric_label());
    tracing::warn!(byoremediation = %r.name_any(), namespace = %r.namespace().unwrap_or_default(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Reconciles one ByoRemediation (see the module's documentation).
///
/// # Errors
/// [`Error`] when an API request fails or the object has no namespace or UID.
pub async fn reconcile(r: Arc<ByoRemediation>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    let ns = r
        .namespace()
        .ok_or_else(|| Error::Invalid("ByoRemediation without a namespace".into()))?;
    let uid = r
        .uid()
        .ok_or_else(|| Error::Invalid("ByoRemediation without a UID".into()))?;
    let name = r.name_any();
    if r.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // The Machine of the same name: the MachineHealthCheck names the request after it.
    let Some(machine) = crate::capi::machines(ctx.client.clone(), &ns)
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading Machine {ns}/{name}")))?
    else {
        return Ok(Action::await_change());
    };
    let cluster = crate::capi::clusters(ctx.client.clone(), &ns)
        .get_opt(&machine.spec.cluster_name)
        .await
        .map_err(Error::kube(format!(
            "reading Cluster {ns}/{}",
            machine.spec.cluster_name
        )))?;
    let paused = cluster.as_ref().is_some_and(crate::capi::cluster_paused)
        || r.annotations().contains_key(byoh_api::labels::PAUSED);
    let byomachine = match machine
        .spec
        .infrastructure_ref
        .as_ref()
        .filter(|r| r.kind == "ByoMachine")
    {
        Some(r) => Api::<ByoMachine>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&r.name)
            .await
            .map_err(Error::kube(format!("reading ByoMachine {ns}/{}", r.name)))?,
        None => None,
    };
    let hosts: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &ns);
    let mut host = None;
    if let Some(bm) = &byomachine
        && let Some(host_ref) = bm.status.as_ref().and_then(|s| s.host_ref.as_ref())
    {
        host = hosts
            .get_opt(&host_ref.name)
            .await
            .map_err(Error::kube(format!(
                "reading ByoHost {ns}/{}",
                host_ref.name
            )))?;
    }
    let bm_uid = byomachine.as_ref().and_then(|bm| bm.uid());
    let view = host.as_ref().map(|h| HostView {
        name: h.name_any(),
        node: is_node_of(h, bm_uid.as_deref()),
    });
    let status = r.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    match decide(&r.spec, &status, view.as_ref(), paused, now) {
        Next::Done => Ok(Action::await_change()),
        // Nothing watches the Cluster for this reconciler: look again.
        Next::Paused => Ok(Action::requeue(PAUSED_LOOK_AGAIN)),
        Next::Wait { until } => Ok(Action::requeue(wait_for(now, until))),
        Next::Ask { index, action } => {
            let (Some(host), Some(bm_uid)) = (view, bm_uid) else {
                return Err(Error::Invalid("a step asked without a host".into()));
            };
            let id = format!("{uid}/{index}");
            let request = serde_json::json!([
                {"op": "test", "path": "/spec/claim/machineRef/uid", "value": bm_uid},
                {"op": "add", "path": "/spec/claim/remediation", "value": {"id": id, "action": action}},
            ]);
            hosts
                .patch(
                    &host.name,
                    &PatchParams::default(),
                    &Patch::Json::<()>(serde_json::from_value(request).map_err(|e| {
                        Error::Invalid(format!("the remediation request's patch: {e}"))
                    })?),
                )
                .await
                .map_err(Error::kube(format!(
                    "asking ByoHost {ns}/{} for {}",
                    host.name,
                    action.as_str()
                )))?;
            let mut steps = status.steps.clone();
            steps.push(RemediationStepStatus {
                action,
                host: host.name.clone(),
                started_at: Time(now),
            });
            let total = r.spec.effective_steps().len();
            set_status(&ctx, &ns, &name, PHASE_RUNNING, &steps).await?;
            crate::events::publish(
                &ctx.recorder,
                &*r,
                EventType::Normal,
                REMEDIATION_STEP,
                "Remediate",
                format!(
                    "step {} of {total}: asked ByoHost {} to {}",
                    index + 1,
                    host.name,
                    action.as_str()
                ),
            )
            .await;
            tracing::info!(byoremediation = %name, namespace = %ns, host = %host.name, action = action.as_str(), "remediation step {} of {total}", index + 1);
            Ok(Action::requeue(Duration::from_secs(
                u64::try_from(r.spec.effective_step_timeout_seconds()).unwrap_or(300),
            )))
        }
        Next::HandOver { why } => {
            hand_over(&ctx, &ns, &name, &why).await?;
            set_status(&ctx, &ns, &name, PHASE_HANDED_OVER, &status.steps).await?;
            crate::events::publish(
                &ctx.recorder,
                &*r,
                EventType::Warning,
                HANDED_OVER,
                "Remediate",
                format!("{why}: Machine {name} goes back to its owner for replacement"),
            )
            .await;
            tracing::warn!(byoremediation = %name, namespace = %ns, "{why}: Machine handed back to its owner for replacement");
            Ok(Action::await_change())
        }
    }
}

/// Whether `host` is the node of the ByoMachine of UID `bm_uid`: claimed by it and reporting
/// that claim provisioned.
fn is_node_of(host: &ByoHost, bm_uid: Option<&str>) -> bool {
    let claimed = host
        .spec
        .claim
        .as_ref()
        .is_some_and(|c| Some(c.machine_ref.uid.as_str()) == bm_uid);
    let provisioned = host.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some(phase::PROVISIONED)
            && s.observed_machine_uid.as_deref() == bm_uid
    });
    claimed && provisioned
}

/// How long until `until` (at least a second).
fn wait_for(now: Timestamp, until: Timestamp) -> Duration {
    Duration::try_from(until.duration_since(now))
        .unwrap_or_default()
        .max(Duration::from_secs(1))
}

async fn set_status(
    ctx: &Context,
    ns: &str,
    name: &str,
    phase_: &str,
    steps: &[RemediationStepStatus],
) -> Result<(), Error> {
    Api::<ByoRemediation>::namespaced(ctx.client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": phase_, "steps": steps}})),
        )
        .await
        .map(|_| ())
        .map_err(Error::kube(format!(
            "writing the status of ByoRemediation {ns}/{name}"
        )))
}

/// Sets Machine `name`'s `OwnerRemediated` condition False ([`WAITING_FOR_REMEDIATION`]) by
/// server-side apply of that one condition (`status.conditions` is a map keyed by `type`).
async fn hand_over(ctx: &Context, ns: &str, name: &str, why: &str) -> Result<(), Error> {
    let condition = serde_json::json!({
        "type": "OwnerRemediated",
        "status": "False",
        "reason": WAITING_FOR_REMEDIATION,
        "message": why,
        "lastTransitionTime": Time(Timestamp::now()),
    });
    let patch = serde_json::json!({
        "apiVersion": format!("{}/{}", crate::capi::GROUP, crate::capi::VERSION),
        "kind": "Machine",
        "metadata": {"name": name},
        "status": {"conditions": [condition]},
    });
    crate::capi::machines(ctx.client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
        .map(|_| ())
        .map_err(Error::kube(format!(
            "handing Machine {ns}/{name} back to its owner (OwnerRemediated=False)"
        )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn ran(steps: &[(RemediationAction, i64)]) -> ByoRemediationStatus {
        ByoRemediationStatus {
            phase: Some(PHASE_RUNNING.into()),
            steps: steps
                .iter()
                .map(|(action, t)| RemediationStepStatus {
                    action: *action,
                    host: "h1".into(),
                    started_at: Time(at(*t)),
                })
                .collect(),
        }
    }

    #[test]
    fn steps_in_order_each_given_its_timeout_then_the_owner() {
        use RemediationAction::{Reboot, RestartServices};
        let spec = ByoRemediationSpec::default(); // RestartServices, Reboot; 300 s
        let node = HostView {
            name: "h1".into(),
            node: true,
        };
        let host = Some(&node);
        assert_eq!(
            decide(&spec, &ByoRemediationStatus::default(), host, false, at(0)),
            Next::Ask {
                index: 0,
                action: RestartServices
            }
        );
        let one = ran(&[(RestartServices, 0)]);
        assert_eq!(
            decide(&spec, &one, host, false, at(299)),
            Next::Wait { until: at(300) }
        );
        assert_eq!(
            decide(&spec, &one, host, false, at(300)),
            Next::Ask {
                index: 1,
                action: Reboot
            }
        );
        let two = ran(&[(RestartServices, 0), (Reboot, 300)]);
        assert_eq!(
            decide(&spec, &two, host, false, at(599)),
            Next::Wait { until: at(600) }
        );
        assert!(matches!(
            decide(&spec, &two, host, false, at(600)),
            Next::HandOver { why } if why.contains("300 s after the last remedy (Reboot on ByoHost h1)")
        ));
        let mut done = two.clone();
        done.phase = Some(PHASE_HANDED_OVER.into());
        assert_eq!(decide(&spec, &done, host, false, at(601)), Next::Done);

        // Named steps and timeout.
        let only_restart = ByoRemediationSpec {
            steps: vec![RestartServices],
            step_timeout_seconds: Some(60),
        };
        assert!(matches!(
            decide(
                &only_restart,
                &ran(&[(RestartServices, 0)]),
                host,
                false,
                at(60)
            ),
            Next::HandOver { .. }
        ));
    }

    #[test]
    fn a_paused_cluster_or_request_gets_no_step_and_no_hand_over() {
        use RemediationAction::RestartServices;
        let spec = ByoRemediationSpec::default();
        let node = HostView {
            name: "h1".into(),
            node: true,
        };
        // Not the first step, not the next one after a timeout, not a hand-over.
        for status in [
            ByoRemediationStatus::default(),
            ran(&[(RestartServices, 0)]),
        ] {
            assert_eq!(
                decide(&spec, &status, Some(&node), true, at(900)),
                Next::Paused
            );
        }
        assert_eq!(
            decide(&spec, &ByoRemediationStatus::default(), None, true, at(0)),
            Next::Paused
        );
        // Handed over already: done, paused or not.
        let mut done = ran(&[(RestartServices, 0)]);
        done.phase = Some(PHASE_HANDED_OVER.into());
        assert_eq!(decide(&spec, &done, Some(&node), true, at(900)), Next::Done);
    }

    #[test]
    fn no_host_or_a_host_that_is_not_the_node_goes_to_the_owner_at_once() {
        let spec = ByoRemediationSpec::default();
        let fresh = ByoRemediationStatus::default();
        assert!(matches!(
            decide(&spec, &fresh, None, false, at(0)),
            Next::HandOver { why } if why.contains("no BYOH host")
        ));
        let bootstrapping = HostView {
            name: "h2".into(),
            node: false,
        };
        assert!(matches!(
            decide(&spec, &fresh, Some(&bootstrapping), false, at(0)),
            Next::HandOver { why } if why.contains("ByoHost h2 is not the Machine's node")
        ));
    }
}
