//! A claimed host's request to leave the pool (`byoh-agent decommission --force`, condition
//! `Decommissioning=True` on its ByoHost): the controller deletes the claim's CAPI Machine, as
//! a MachineHealthCheck remediation does. CAPI then drains the Node and deletes the ByoMachine,
//! whose release asks the agent to clean the host; the Machine's owner (a MachineSet or a
//! KubeadmControlPlane) makes a replacement, which the decommissioning host no longer matches
//! (`Maintenance=True`, `crate::selection::in_maintenance`).

use super::MachineRef;
use crate::capi::{self, Machine};
use crate::error::{Error, is_not_found};
use byoh_api::ByoHost;
use byoh_api::conditions::{self, types};
use kube::api::{DeleteParams, Preconditions};
use kube::{Resource, ResourceExt};

/// Whether `host`'s operator asked to decommission it (`Decommissioning=True`).
pub fn requested(host: &ByoHost) -> bool {
    host.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::DECOMMISSIONING))
}

/// Deletes `machine` (the owner of ByoMachine `n`, whose host asked to leave) unless it is
/// being deleted already. The delete carries the Machine's UID as a precondition, so a new
/// Machine of the same name is never hit; one already gone is fine.
///
/// # Errors
/// [`Error`] when the delete fails otherwise.
pub(super) async fn remove_machine(
    ctx: &crate::context::Context,
    n: &MachineRef,
    machine: &Machine,
    host: &str,
) -> Result<(), Error> {
    if machine.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    let name = machine.name_any();
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: machine.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    tracing::info!(byomachine = %n.name, namespace = %n.ns, machine = %name, %host, "decommission requested by the host: deleting its Machine");
    match capi::machines(ctx.client.clone(), &n.ns)
        .delete(&name, &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "deleting Machine {}/{name} (ByoHost {host} asked to be decommissioned)",
            n.ns
        ))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn host_with(type_: &str, status: &str) -> ByoHost {
        let mut h = ByoHost::new("h", Default::default());
        h.status = Some(byoh_api::ByoHostStatus {
            conditions: vec![Condition {
                type_: type_.into(),
                status: status.into(),
                reason: "R".into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        h
    }

    #[test]
    fn only_decommissioning_true_is_a_request() {
        assert!(requested(&host_with("Decommissioning", "True")));
        assert!(!requested(&host_with("Decommissioning", "False")));
        assert!(!requested(&host_with("Maintenance", "True")));
        assert!(!requested(&ByoHost::new("h", Default::default())));
    }
}
