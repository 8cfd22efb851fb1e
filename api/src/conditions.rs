//! Condition types and reasons (`metav1.Condition`), and the ByoHost phases.
//!
//! Reasons are CamelCase as `metav1.Condition` requires. Every reason the code sets is listed
//! here, so documentation can be checked against this module.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Marks conditions of one object at one moment, as Cluster API's `conditions.MarkTrue` /
/// `MarkFalse` do (metav1.Condition semantics): `lastTransitionTime` becomes the marker's `now`
/// only when the status changes or the condition is new; reason, message and
/// `observedGeneration` are always updated. Every `mark*` returns whether anything changed.
///
/// ```
/// # use byoh_api::conditions::{Marker, types, reasons};
/// # use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
/// let mut conditions = Vec::new();
/// let marker = Marker::new(Some(3), Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
/// assert!(marker.mark_true(&mut conditions, types::READY, reasons::AS_EXPECTED, ""));
/// assert_eq!(conditions[0].observed_generation, Some(3));
/// ```
#[derive(Clone, Debug)]
pub struct Marker {
    observed_generation: Option<i64>,
    now: Time,
}

impl Marker {
    /// A marker for an object of `metadata.generation` `observed_generation`, at `now`.
    pub fn new(observed_generation: Option<i64>, now: Time) -> Self {
        Marker {
            observed_generation,
            now,
        }
    }

    /// Sets condition `type_` to `True` with `reason` and `message`.
    pub fn mark_true(
        &self,
        conditions: &mut Vec<Condition>,
        type_: &str,
        reason: &str,
        message: &str,
    ) -> bool {
        self.mark(conditions, type_, true, reason, message)
    }

    /// Sets condition `type_` to `False` with `reason` and `message`.
    pub fn mark_false(
        &self,
        conditions: &mut Vec<Condition>,
        type_: &str,
        reason: &str,
        message: &str,
    ) -> bool {
        self.mark(conditions, type_, false, reason, message)
    }

    /// Sets condition `type_` to `True` when `status`, else `False`, with `reason` and
    /// `message` (for a status computed by the caller).
    pub fn mark(
        &self,
        conditions: &mut Vec<Condition>,
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
    ) -> bool {
        let status = if status { "True" } else { "False" };
        let new = Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: self.observed_generation,
            last_transition_time: self.now.clone(),
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

    /// Sets Cluster API's `Paused` condition (the v1beta2 provider contract: every object a
    /// provider reconciles reports it): `True`/`Paused` with `message` when `paused`, else
    /// `False`/`NotPaused` with no message.
    pub fn mark_paused(
        &self,
        conditions: &mut Vec<Condition>,
        paused: bool,
        message: &str,
    ) -> bool {
        if paused {
            self.mark_true(conditions, types::PAUSED, reasons::PAUSED, message)
        } else {
            self.mark_false(conditions, types::PAUSED, reasons::NOT_PAUSED, "")
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
    /// ByoHost: the agent's Lease is current (`renewTime + leaseDurationSeconds` is in the
    /// future); written by the controller, `False` with reason `LeaseExpired` or `NoLease` for
    /// a host whose agent stopped (the `Online` column of `kubectl get byohosts`).
    pub const LEASE_CURRENT: &str = "LeaseCurrent";
    /// ByoMachine: a host is claimed.
    pub const HOST_CLAIMED: &str = "HostClaimed";
    /// ByoHost: the agent's preflight checks (`byoh-agent doctor`) pass; while `False` the
    /// controller does not hand the host out.
    pub const PREFLIGHT_CHECKS_PASSED: &str = "PreflightChecksPassed";
    /// ByoHost: the host's operator took it out of the pool (`byoh-agent maintenance on`);
    /// while `True` the controller does not hand the host out.
    pub const MAINTENANCE: &str = "Maintenance";
    /// ByoHost: the host's operator is taking it out of the pool for good (`byoh-agent
    /// decommission --force` while claimed); while `True` on a claimed host, the controller
    /// deletes the claim's Machine, as a MachineHealthCheck remediation would, so the host is
    /// released and cleaned the usual way.
    pub const DECOMMISSIONING: &str = "Decommissioning";
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
    /// ByoMachine: its installer config cannot install the Machine's Kubernetes version
    /// (message: what names another version and the fix); no host is claimed
    /// ([`crate::installer::K8sInstallerConfigSpec::cannot_serve`]).
    pub const INSTALLER_CANNOT_SERVE_VERSION: &str = "InstallerCannotServeVersion";
    /// ByoMachine: `Machine.spec.dataSecretName` names a Secret that the Machine's bootstrap
    /// config (`spec.bootstrap.configRef`) does not control, so no host is claimed for it (the
    /// host would be granted that Secret); message: the Secret and the config.
    pub const BOOTSTRAP_DATA_NOT_OWNED: &str = "BootstrapDataNotOwned";
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
    /// ByoHost (`LeaseCurrent=False`): the agent's Lease expired (message: its last renewal
    /// and its expiry).
    pub const LEASE_EXPIRED: &str = "LeaseExpired";
    /// ByoHost (`LeaseCurrent=False`): the host has no Lease.
    pub const NO_LEASE: &str = "NoLease";
    /// NeedsCleanup / release: the host's Lease expired.
    pub const HOST_OFFLINE_RELEASE: &str = "HostOfflineRelease";
    /// NeedsCleanup / release: the agent did not confirm clean-up in time.
    pub const RELEASE_TIMED_OUT: &str = "ReleaseTimedOut";
    /// NeedsCleanup / release: the force-release annotation was set.
    pub const FORCED_RELEASE: &str = "ForcedRelease";
    /// ByoHost: waiting for a claim (`Ready=True`); on the conditions whose subject exists only
    /// during a claim (`BootstrapSucceeded`, `K8sComponentsInstalled`, `KubeletActive` when the
    /// kubelet is not running) the neutral `False` of a free host.
    pub const WAITING_FOR_CLAIM: &str = "WaitingForClaim";
    /// ByoHost (`K8sComponentsInstalled=False`): the claim names no K8sInstallerConfig (or
    /// `[host] skip_installation` is set), so the agent installs nothing; the components are
    /// expected on the host.
    pub const NOT_REQUESTED: &str = "NotRequested";
    /// ByoHost: bootstrap data was refused (unsupported module, bad encoding, ignition, ...).
    pub const BOOTSTRAP_DATA_INVALID: &str = "BootstrapDataInvalid";
    /// ByoHost: a bootstrap step failed (message names the step, exit status, stderr tail).
    pub const BOOTSTRAP_FAILED: &str = "BootstrapFailed";
    /// ByoHost: installation of Kubernetes components failed.
    pub const INSTALLATION_FAILED: &str = "InstallationFailed";
    /// ByoHost: clean-up failed.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    /// ByoHost: `kubeadm reset` exited non-zero during clean-up (message: command, exit
    /// status, stderr tail); retried with backoff, the host is not offered.
    pub const KUBEADM_RESET_FAILED: &str = "KubeadmResetFailed";
    /// ByoHost: a mount below a directory the clean-up removes could not be unmounted
    /// (message: mount point and errno); nothing behind it was deleted, the host is not offered.
    pub const UNMOUNT_FAILED: &str = "UnmountFailed";
    /// ByoHost (`CleanupSucceeded=True`): the clean-up finished but kept packages the install
    /// had added, because another party holds or needs them (message: each package and why).
    pub const PACKAGES_KEPT: &str = "PackagesKept";
    /// ByoHost (`CleanupSucceeded=False`, `Ready=False`, phase `CleaningUp`): the host is not
    /// clean after the clean-up (message: what is left and how to fix it); not offered until a
    /// re-check passes.
    pub const QUARANTINED: &str = "Quarantined";
    /// ByoHost: a systemd unit is not active.
    pub const UNIT_INACTIVE: &str = "UnitInactive";
    /// ByoHost: a preflight check fails (the message names each check and its fix); the host
    /// is not offered until it passes.
    pub const PREFLIGHT_CHECKS_FAILED: &str = "PreflightChecksFailed";
    /// ByoHost (`Maintenance=True`): `byoh-agent maintenance on` took the host out of the pool
    /// (message: the operator's reason).
    pub const MAINTENANCE_REQUESTED: &str = "MaintenanceRequested";
    /// ByoHost (`Maintenance=False`): `byoh-agent maintenance off` put the host back.
    pub const NOT_IN_MAINTENANCE: &str = "NotInMaintenance";
    /// ByoHost (`Decommissioning=True`): `byoh-agent decommission --force` asks for the
    /// release of the host's claim before it leaves the pool.
    pub const DECOMMISSION_REQUESTED: &str = "DecommissionRequested";

    /// Every reason above (docs/troubleshooting.md must explain each; a test checks both this
    /// list against the constants and the document against this list).
    pub const ALL: &[&str] = &[
        AS_EXPECTED,
        PAUSED,
        NOT_PAUSED,
        WAITING_FOR_CLUSTER_INFRASTRUCTURE,
        WAITING_FOR_BOOTSTRAP_DATA,
        WAITING_FOR_CONTROL_PLANE,
        NO_HOST_AVAILABLE,
        INSTALLER_CANNOT_SERVE_VERSION,
        BOOTSTRAP_DATA_NOT_OWNED,
        WAITING_FOR_BOOTSTRAP,
        RELEASING,
        HOST_DELETED,
        WAITING_FOR_CONTROL_PLANE_ENDPOINT,
        DELETING,
        LEASE_EXPIRED,
        NO_LEASE,
        HOST_OFFLINE_RELEASE,
        RELEASE_TIMED_OUT,
        FORCED_RELEASE,
        WAITING_FOR_CLAIM,
        NOT_REQUESTED,
        BOOTSTRAP_DATA_INVALID,
        BOOTSTRAP_FAILED,
        INSTALLATION_FAILED,
        CLEANUP_FAILED,
        KUBEADM_RESET_FAILED,
        UNMOUNT_FAILED,
        PACKAGES_KEPT,
        QUARANTINED,
        UNIT_INACTIVE,
        PREFLIGHT_CHECKS_FAILED,
        MAINTENANCE_REQUESTED,
        NOT_IN_MAINTENANCE,
        DECOMMISSION_REQUESTED,
    ];
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

    /// The string values of the `pub const`s declared in `pub mod {name}` blocks of `src`.
    fn consts_in(src: &str, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = src;
        while let Some(start) = rest.find(&format!("pub mod {name} {{")) {
            let body = &rest[start..];
            let end = body.find("\n}").unwrap_or(body.len());
            out.extend(
                body[..end]
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("pub const "))
                    .filter_map(|l| l.split_once(": &str = \""))
                    .map(|(_, v)| v.trim_end_matches("\";").to_string()),
            );
            rest = &body[end..];
        }
        out
    }

    fn consts_of(name: &str) -> Vec<String> {
        consts_in(include_str!("conditions.rs"), name)
    }

    fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// docs/troubleshooting.md has a table row for every condition reason the code declares:
    /// every `pub mod reasons` block of the api, agent and controller sources.
    #[test]
    fn troubleshooting_doc_explains_every_reason() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/troubleshooting.md")).unwrap();
        let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `")).collect();
        let mut files = Vec::new();
        for crate_dir in ["api/src", "agent/src", "controller/src"] {
            rust_files(&root.join(crate_dir), &mut files);
        }
        let mut reasons = Vec::new();
        for f in files {
            reasons.extend(consts_in(&std::fs::read_to_string(&f).unwrap(), "reasons"));
        }
        assert!(reasons.len() > reasons::ALL.len(), "{reasons:?}");
        let missing: Vec<&String> = reasons
            .iter()
            .filter(|r| {
                !rows
                    .iter()
                    .any(|row| row.starts_with(&format!("| `{r}` |")))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "docs/troubleshooting.md has no row for {missing:?}: add symptom, command, cause and fix"
        );
    }

    #[test]
    fn reasons_all_lists_every_reason_once() {
        let mut declared = consts_of("reasons");
        declared.sort();
        let mut all: Vec<String> = reasons::ALL.iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(declared, all, "add the new reason to reasons::ALL");
        let mut dedup = all.clone();
        dedup.dedup();
        assert_eq!(dedup, all);
    }

    fn t(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut c = Vec::new();
        let at = |g, s| Marker::new(g, t(s));
        assert!(at(Some(1), "2026-01-01T00:00:00Z").mark_false(&mut c, "Ready", "Waiting", "m1"));
        assert!(!at(Some(1), "2026-01-01T00:01:00Z").mark_false(&mut c, "Ready", "Waiting", "m1"));
        assert_eq!(c[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert!(at(Some(2), "2026-01-01T00:02:00Z").mark_false(&mut c, "Ready", "Other", "m2"));
        assert_eq!(c[0].last_transition_time, t("2026-01-01T00:00:00Z"));
        assert!(at(Some(2), "2026-01-01T00:03:00Z").mark_true(&mut c, "Ready", "AsExpected", ""));
        assert_eq!(c[0].last_transition_time, t("2026-01-01T00:03:00Z"));
        assert!(is_true(&c, "Ready"));
        assert!(at(None, "2026-01-01T00:04:00Z").mark_paused(&mut c, false, "ignored"));
        assert_eq!(c.len(), 2);
        assert!(!is_true(&c, "Paused"));
        assert_eq!(c[1].reason, "NotPaused");
        assert!(at(None, "2026-01-01T00:05:00Z").mark_paused(&mut c, true, "cluster paused"));
        assert!(is_true(&c, "Paused"));
        assert_eq!(c[1].message, "cluster paused");
    }
}
