//! Remedies for the host of an unhealthy Machine (`spec.claim.remediation`, asked by the
//! controller while a `ByoRemediation` is under way; `byoh_api::byoremediation`): restart
//! containerd and the kubelet, or reboot. Each request is carried out once, only while the host
//! is the claim's node, reported in `status.remediation` (field manager [`FIELD_MANAGER`]) and
//! logged; the controller tells the story in Events on the ByoRemediation.

use super::{HostWorker, WorkError};
use crate::cloudinit::CommandRunner;
use crate::state::{ClaimWork, HostState, Outcome};
use crate::systemd::UnitManager;
use byoh_api::byohost::HostClaim;
use byoh_api::byoremediation::{HostRemediation, RemediationAction};

/// Field manager of `status.remediation`.
pub const FIELD_MANAGER: &str = "byoh-agent-remediation";

/// The units a `RestartServices` remedy restarts, in order: the runtime first, so the kubelet
/// starts against a fresh one. A unit the host does not have is skipped.
pub const RESTARTED_UNITS: [&str; 2] = ["containerd.service", "kubelet.service"];

/// The request to carry out now (pure): the claim's remedy when this host is the claim's node
/// (its bootstrap succeeded for this ByoMachine) and its id is not the one carried out last.
/// A host still bootstrapping, or whose bootstrap failed, does nothing: restarting or rebooting
/// it would not make a Node, and the controller moves on after the step's timeout.
pub fn pending<'a>(claim: &'a HostClaim, work: Option<&ClaimWork>) -> Option<&'a HostRemediation> {
    let request = claim.remediation.as_ref()?;
    let work = work?;
    (work.machine_uid == claim.machine_ref.uid
        && work.outcome == Some(Outcome::Bootstrapped)
        && work.last_remediation.as_deref() != Some(request.id.as_str()))
    .then_some(request)
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    /// Carries out `request` and reports it. The request is recorded as carried out first, so
    /// that a reboot (which ends this process) or a failure is never repeated for the same
    /// request; the controller's next step is a new request.
    ///
    /// # Errors
    /// [`WorkError`] when the state cannot be saved or the report cannot be written; a failed
    /// remedy is reported (`Failed: …`), not an error.
    pub(super) async fn remediate(
        &self,
        request: &HostRemediation,
        state: &mut HostState,
    ) -> Result<(), WorkError> {
        if let Some(w) = state.claim.as_mut() {
            w.last_remediation = Some(request.id.clone());
        }
        self.save(state)?;
        let action = request.action.as_str();
        tracing::warn!(id = %request.id, "remediation of this host's Machine: {action}");
        let result = match request.action {
            RemediationAction::RestartServices => self.restart_services().await,
            // Reported before: nothing runs after the reboot is queued.
            RemediationAction::Reboot => {
                self.report_remediation(request, "Done").await?;
                match self.units.reboot().await {
                    Ok(()) => return Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        let result = match result {
            Ok(()) => "Done".to_string(),
            Err(e) => {
                tracing::warn!(id = %request.id, "remediation {action} failed: {e}");
                format!("Failed: {e}")
            }
        };
        self.report_remediation(request, &result).await
    }

    /// Restarts [`RESTARTED_UNITS`] that the host has.
    async fn restart_services(&self) -> Result<(), String> {
        for unit in RESTARTED_UNITS {
            let known = self
                .units
                .state(unit)
                .await
                .map_err(|e| e.to_string())?
                .load_state
                == "loaded";
            if known {
                self.units.restart(unit).await.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    async fn report_remediation(
        &self,
        request: &HostRemediation,
        result: &str,
    ) -> Result<(), WorkError> {
        self.host
            .apply_status(
                serde_json::json!({"remediation": {"id": request.id, "result": result}}),
                FIELD_MANAGER,
            )
            .await
            .map(|_| ())
            .map_err(|e| WorkError::Api {
                action: format!("reporting remediation {}", request.id),
                source: e.source,
            })
    }
}
