//! Condition types and reasons (`metav1.Condition`), and the ByoHost phases.
//!
//! Reasons are CamelCase as `metav1.Condition` requires. Every reason the code sets is listed
//! here, so documentation can be checked against this module.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets condition `type_` in `conditions` (metav1.Condition semantics): `lastTransitionTime`
/// becomes `now` only when the status changes or the condition is new; reason, message and
/// observedGeneration are always updated. Returns whether anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) -> bool {
    let status = if status { "True" } else { "False" };
    let new = Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let transition = if c.status == status {
                c.last_transition_time.clone()
            } else {
                new.last_transition_time.clone()
            };
            let changed = c.status != new.status
                || c.reason != new.reason
                || c.message != new.message
                || c.observed_generation != new.observed_generation;
            *c = Condition {
                last_transition_time: transition,
                ..new
            };
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// Whether condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// Condition types.
pub mod types {
    /// Summary: the object is fully usable (CAPI v1beta2 requires a meaningful `Ready`).
    pub const READY: &str = "Ready";
    /// CAPI v1beta2: the object or its Cluster is paused.
    pub const PAUSED: &str = "Paused";
    /// ByoHost: the agent registered the host (facts, Lease).
    pub const REGISTERED: &str = "Registered";
    /// ByoHost: Kubernetes components are installed as the claim asks.
    pub const K8S_COMPONENTS_INSTALLED: &str = "K8sComponentsInstalled";
    /// ByoHost: the bootstrap data ran and the CAPI sentinel file exists.
    pub const BOOTSTRAP_SUCCEEDED: &str = "BootstrapSucceeded";
    /// ByoHost: the host was reset and returned to the pool after a claim.
    pub const CLEANUP_SUCCEEDED: &str = "CleanupSucceeded";
    /// ByoHost: `kubelet.service` is active (systemd `ActiveState`).
    pub const KUBELET_ACTIVE: &str = "KubeletActive";
    /// ByoHost: `containerd.service` is active (systemd `ActiveState`).
    pub const CONTAINERD_ACTIVE: &str = "ContainerdActive";
    /// ByoHost: the agent's Lease is current (reported by the controller).
    pub const LEASE_CURRENT: &str = "LeaseCurrent";
    /// ByoMachine: a host is claimed.
    pub const HOST_CLAIMED: &str = "HostClaimed";
}

/// Condition reasons.
pub mod reasons {
    /// Generic positive reason when nothing more specific applies.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Paused: `Cluster.spec.paused` or the paused annotation is set.
    pub const PAUSED: &str = "Paused";
    /// Paused: neither is set.
    pub const NOT_PAUSED: &str = "NotPaused";
    /// ByoMachine: the Cluster's infrastructure is not provisioned yet.
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructure";
    /// ByoMachine: `Machine.spec.bootstrap.dataSecretName` is not set yet.
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    /// ByoMachine (worker): the control plane is not initialized yet.
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlaneInitialized";
    /// ByoMachine: no free, live, fitting host matches the selector.
    pub const NO_HOST_AVAILABLE: &str = "NoHostAvailable";
    /// ByoMachine: a host is claimed and bootstrapping.
    pub const WAITING_FOR_BOOTSTRAP: &str = "WaitingForBootstrap";
    /// ByoMachine: the claimed host is being reset.
    pub const RELEASING: &str = "Releasing";
    /// ByoMachine: the claimed ByoHost was deleted after the host bootstrapped.
    pub const HOST_DELETED: &str = "HostDeleted";
    /// ByoCluster: `spec.controlPlaneEndpoint.host` is not set yet (neither on the ByoCluster
    /// nor on the Cluster).
    pub const WAITING_FOR_CONTROL_PLANE_ENDPOINT: &str = "WaitingForControlPlaneEndpoint";
    /// ByoCluster: being deleted; waits for the cluster's ByoMachines to go.
    pub const DELETING: &str = "Deleting";
    /// NeedsCleanup / release: the host's Lease expired.
    pub const HOST_OFFLINE_RELEASE: &str = "HostOfflineRelease";
    /// NeedsCleanup / release: the agent did not confirm clean-up in time.
    pub const RELEASE_TIMED_OUT: &str = "ReleaseTimedOut";
    /// NeedsCleanup / release: the force-release annotation was set.
    pub const FORCED_RELEASE: &str = "ForcedRelease";
    /// ByoHost: waiting for a claim.
    pub const WAITING_FOR_CLAIM: &str = "WaitingForClaim";
    /// ByoHost: bootstrap data was refused (unsupported module, bad encoding, ignition, ...).
    pub const BOOTSTRAP_DATA_INVALID: &str = "BootstrapDataInvalid";
    /// ByoHost: a bootstrap step failed (message names the step, exit status, stderr tail).
    pub const BOOTSTRAP_FAILED: &str = "BootstrapFailed";
    /// ByoHost: installation of Kubernetes components failed.
    pub const INSTALLATION_FAILED: &str = "InstallationFailed";
    /// ByoHost: clean-up failed.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    /// ByoHost: a systemd unit is not active.
    pub const UNIT_INACTIVE: &str = "UnitInactive";
}

/// Values of `ByoHost.status.phase`.
pub mod phase {
    /// Starting: reading config, facts, identity.
    pub const REGISTERING: &str = "Registering";
    /// Free and offered to the pool.
    pub const AVAILABLE: &str = "Available";
    /// Installing Kubernetes components for a claim.
    pub const INSTALLING: &str = "Installing";
    /// Running the bootstrap data.
    pub const BOOTSTRAPPING: &str = "Bootstrapping";
    /// Bootstrapped; a Node of the workload cluster.
    pub const PROVISIONED: &str = "Provisioned";
    /// Resetting and uninstalling after a release request or a clean-up mark.
    pub const CLEANING_UP: &str = "CleaningUp";
    /// A step failed; see the conditions.
    pub const FAILED: &str = "Failed";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut c = Vec::new();
        assert!(set(
            &mut c,
            "Ready",
            false,
            "Waiting",
            "m1",
            Some(1),
            t("2026-01-01T00:00:00Z")
        ));
        assert!(!set(
            &mut c,
            "Ready",
            false,
            "Waiting",
            "m1",
            Some(1),
            t("2026-01-01T00:01:00Z")
        ));
        assert_eq!(c[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert!(set(
            &mut c,
            "Ready",
            false,
            "Other",
            "m2",
            Some(2),
            t("2026-01-01T00:02:00Z")
        ));
        assert_eq!(c[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert!(set(
            &mut c,
            "Ready",
            true,
            "AsExpected",
            "",
            Some(2),
            t("2026-01-01T00:03:00Z")
        ));
        assert_eq!(c[0].last_transition_time, t("2026-01-01T00:03:00Z"));
        assert!(is_true(&c, "Ready"));
        assert!(set(
            &mut c,
            "Paused",
            false,
            "NotPaused",
            "",
            None,
            t("2026-01-01T00:04:00Z")
        ));
        assert_eq!(c.len(), 2);
        assert!(!is_true(&c, "Paused"));
    }
}
