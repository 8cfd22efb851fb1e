//! `byoh-agent maintenance on|off`: the host's operator takes it out of the pool or puts it
//! back, as the ByoHost condition `Maintenance` (field manager [`FIELD_MANAGER`]), written with
//! the host's own identity — the same credential the agent uses, so RBAC and the admission
//! policy apply as to every write of the host. The controller hands a host in maintenance to no
//! ByoMachine (`controller/src/selection.rs`); administrators use the annotation
//! `byoh.infrastructure.cluster.x-k8s.io/maintenance` instead, which hosts cannot touch.

use crate::cli::MaintenanceState;
use crate::config::{Credentials, Settings};
use crate::host::HostHandle;
use crate::identity::{self, IdentityPaths};
use byoh_api::conditions::{reasons, types};
use std::path::{Path, PathBuf};

/// Field manager of the `Maintenance` condition.
pub const FIELD_MANAGER: &str = "byoh-agent-maintenance";

/// The `Maintenance` condition for `state`: `True`/`MaintenanceRequested` with the operator's
/// `reason` as message, or `False`/`NotInMaintenance`.
pub fn condition_for(state: MaintenanceState, reason: &str) -> (bool, &'static str, String) {
    match state {
        MaintenanceState::On => (
            true,
            reasons::MAINTENANCE_REQUESTED,
            if reason.is_empty() {
                "taken out of the pool on the host (byoh-agent maintenance on)".into()
            } else {
                format!("taken out of the pool on the host: {reason}")
            },
        ),
        MaintenanceState::Off => (
            false,
            reasons::NOT_IN_MAINTENANCE,
            "back in the pool (byoh-agent maintenance off)".into(),
        ),
    }
}

/// The kubeconfig the host writes with: `[cluster] kubeconfig`, or the host certificate's
/// (`<state_dir>/kubeconfig`) once the TLS bootstrap made it.
pub fn host_kubeconfig(settings: &Settings) -> PathBuf {
    match &settings.credentials {
        Credentials::Kubeconfig(path) => path.clone(),
        Credentials::Bootstrap(_) => IdentityPaths::new(&settings.state_dir).kubeconfig,
    }
}

/// `byoh-agent maintenance`: loads the configuration at `config`, writes the condition and
/// says what it did. Returns the exit status: 0 written, 1 not written (no identity yet, API
/// refused or unreachable), 78 invalid configuration.
pub fn cli(state: MaintenanceState, reason: &str, config: &Path) -> u8 {
    let (settings, runtime) = match crate::cli::settings_and_runtime(config) {
        Ok(r) => r,
        Err(status) => return status,
    };
    let result = runtime.block_on(async {
        let facts = crate::facts::gather(Path::new("/"), settings.host_name.as_deref(), settings.node_address.as_ref())
            .map_err(|e| e.to_string())?;
        let name = facts.host_info.hostname;
        let path = host_kubeconfig(&settings);
        let kubeconfig = identity::read_credential(
            &path,
            "the host's kubeconfig",
            "write its ByoHost (the agent makes it when it registers: systemctl enable --now byoh-agent)",
        )
        .map_err(|e| e.to_string())?;
        let client = identity::client_from(kubeconfig, &path)
            .await
            .map_err(|e| e.to_string())?;
        let host = HostHandle::new(client, &settings.namespace, &name, &settings.lease_namespace);
        let (on, why, message) = condition_for(state, reason);
        host.apply_conditions(
            FIELD_MANAGER,
            &[types::MAINTENANCE],
            &[(types::MAINTENANCE, on, why, &message)],
            serde_json::json!({}),
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok::<_, String>(format!(
            "ByoHost {}/{name}: Maintenance={} ({message})",
            settings.namespace,
            if on { "True" } else { "False" }
        ))
    });
    crate::cli::exit_status(result.map(|said| println!("{said}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_of_on_and_off() {
        let (on, reason, message) = condition_for(MaintenanceState::On, "disk swap");
        assert!(on);
        assert_eq!(reason, "MaintenanceRequested");
        assert!(message.ends_with("disk swap"), "{message}");
        let (on, reason, _) = condition_for(MaintenanceState::Off, "");
        assert!(!on);
        assert_eq!(reason, "NotInMaintenance");
    }
}
