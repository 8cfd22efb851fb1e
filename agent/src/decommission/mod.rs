//! `byoh-agent decommission`: the host leaves the pool for good.
//!
//! Steps, in this order ([`Step`]), each printed as it is done:
//! 1. `Maintenance=True` on the ByoHost, so the controller claims the host no more meanwhile;
//! 2. only if the host is claimed and `--force` is given: `Decommissioning=True`, on which the
//!    controller deletes the claim's Machine (as a MachineHealthCheck remediation does), so the
//!    host is released and cleaned the usual way by the running agent; waited for, bounded by
//!    `--timeout`. Without `--force` a claimed host is refused before anything changes;
//! 3. `DisableUnitFiles` and 4. `StopUnit` of `byoh-agent.service` over D-Bus: the running
//!    agent registers its ByoHost and renews its Lease, so it must be stopped before they are
//!    deleted (the command runs beside the service, from the operator's shell);
//! 5. the Lease and 6. the ByoHost deleted with the host's own identity (its Role grants
//!    `delete` on its ByoHost by name, the host-lease namespace's Role on Leases, which the Lease
//!    policy narrows to the host's own; the admission policy refuses the ByoHost's delete while it is
//!    claimed, so a claim made meanwhile cannot be lost); the controller's per-host Role and
//!    RoleBinding go with the ByoHost (owner reference, garbage collector);
//! 7. the identity removed: `<state_dir>/kubeconfig` (key and certificate) and
//!    `<state_dir>/pending-csr.json`.
//!
//! Every step is idempotent (already done counts as done), so a rerun finishes a partial
//! decommission; a failed step prints what is left and how to do it by hand.

pub mod run;

use crate::config::{Credentials, Settings};
use crate::identity::IdentityPaths;
use byoh_api::ByoHost;
use std::path::PathBuf;

/// Field manager of the `Decommissioning` condition.
pub const FIELD_MANAGER: &str = "byoh-agent-decommission";
/// The agent's unit.
pub const AGENT_UNIT: &str = "byoh-agent.service";
/// Message of the `Maintenance` condition the decommission sets.
pub const MAINTENANCE_MESSAGE: &str = "leaving the pool for good (byoh-agent decommission)";

/// Where the host stands with respect to claims, from its ByoHost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Neither claimed nor waiting for a clean-up.
    Free,
    /// Claimed by ByoMachine `machine`; `releasing` once the controller asked for the release.
    Claimed {
        /// The ByoMachine's name.
        machine: String,
        /// `spec.claim.releaseRequested`.
        releasing: bool,
    },
    /// Released without the agent's clean-up (`spec.needsCleanup`); the agent cleans it.
    NeedsCleanup {
        /// Why the claim was dropped (`HostOfflineRelease`, `ForcedRelease`, ...).
        reason: String,
    },
}

/// The [`Standing`] of `host`.
pub fn standing(host: &ByoHost) -> Standing {
    if let Some(claim) = &host.spec.claim {
        return Standing::Claimed {
            machine: claim.machine_ref.name.clone(),
            releasing: claim.release_requested,
        };
    }
    match &host.spec.needs_cleanup {
        Some(n) => Standing::NeedsCleanup {
            reason: n.reason.clone(),
        },
        None => Standing::Free,
    }
}

/// The refusal of a claimed host without `--force`.
pub fn refusal(target: &Target, machine: &str) -> String {
    format!(
        "ByoHost {}/{} is claimed by ByoMachine {machine}: not decommissioned. \
         Delete the Machine of ByoMachine {machine} first (the host is then released and cleaned), \
         or run `byoh-agent decommission --force`, which asks the controller to do that and waits",
        target.namespace, target.name
    )
}

/// What the decommission is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The ByoHost's namespace (the pool).
    pub namespace: String,
    /// The ByoHost's name.
    pub name: String,
    /// The namespace of the host's Lease `<namespace>.<name>`.
    pub lease_namespace: String,
    /// The identity files the decommission removes.
    pub identity_files: Vec<PathBuf>,
    /// A kubeconfig `[cluster] kubeconfig` names: the operator's file, left in place.
    pub kept_kubeconfig: Option<PathBuf>,
}

impl Target {
    /// The host's Lease name, `<namespace>.<name>`.
    pub fn lease_name(&self) -> String {
        byoh_api::names::host_lease_name(&self.namespace, &self.name)
    }

    /// The target of host `name` with `settings`: with the TLS bootstrap, the host's
    /// kubeconfig and pending CSR under the state directory are its identity; a kubeconfig the
    /// configuration names is the operator's and is kept (the pending CSR file still goes).
    pub fn new(settings: &Settings, name: &str) -> Self {
        let paths = IdentityPaths::new(&settings.state_dir);
        let (identity_files, kept_kubeconfig) = match &settings.credentials {
            Credentials::Bootstrap(_) => (vec![paths.kubeconfig, paths.pending], None),
            Credentials::Kubeconfig(path) => (vec![paths.pending], Some(path.clone())),
        };
        Target {
            namespace: settings.namespace.clone(),
            name: name.into(),
            lease_namespace: settings.lease_namespace.clone(),
            identity_files,
            kept_kubeconfig,
        }
    }
}

/// The steps of a decommission, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// `Maintenance=True` on the ByoHost.
    Maintenance,
    /// Release of the claim and clean-up (`--force`).
    Release,
    /// `DisableUnitFiles byoh-agent.service`.
    Disable,
    /// `StopUnit byoh-agent.service`.
    Stop,
    /// Delete the Lease.
    DeleteLease,
    /// Delete the ByoHost.
    DeleteHost,
    /// Remove the identity files.
    RemoveIdentity,
}

impl Step {
    /// Every step, in order.
    pub const ALL: [Step; 7] = [
        Step::Maintenance,
        Step::Release,
        Step::Disable,
        Step::Stop,
        Step::DeleteLease,
        Step::DeleteHost,
        Step::RemoveIdentity,
    ];

    /// What the step does, for the printed report.
    pub fn title(self, t: &Target) -> String {
        match self {
            Step::Maintenance => format!("take ByoHost {}/{} out of the pool", t.namespace, t.name),
            Step::Release => "release the claim and clean the host".into(),
            Step::Disable => format!("disable {AGENT_UNIT}"),
            Step::Stop => format!("stop {AGENT_UNIT}"),
            Step::DeleteLease => format!("delete Lease {}/{}", t.lease_namespace, t.lease_name()),
            Step::DeleteHost => format!("delete ByoHost {}/{}", t.namespace, t.name),
            Step::RemoveIdentity => "remove the host's identity".into(),
        }
    }

    /// How to do the step by hand (`None`: nothing to do by hand once later steps are done).
    pub fn by_hand(self, t: &Target) -> Option<String> {
        let (ns, name) = (&t.namespace, &t.name);
        match self {
            Step::Maintenance | Step::Release => None,
            Step::Disable => Some("systemctl disable byoh-agent (on the host)".into()),
            Step::Stop => Some("systemctl stop byoh-agent (on the host)".into()),
            Step::DeleteLease => Some(format!(
                "kubectl -n {} delete lease {} --ignore-not-found (an administrator)",
                t.lease_namespace,
                t.lease_name()
            )),
            Step::DeleteHost => Some(format!(
                "kubectl -n {ns} delete byohost {name} --ignore-not-found (an administrator; refused while claimed: delete the claim's Machine first)"
            )),
            Step::RemoveIdentity => Some(format!(
                "rm -f {} (on the host)",
                t.identity_files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            )),
        }
    }
}

/// What is left when `failed` failed: that step and every later one, each with how to do it
/// by hand, and the rerun that does them all.
pub fn left_after(failed: Step, t: &Target) -> String {
    let mut text = String::from("left to do (rerun `byoh-agent decommission` to do it all):");
    for step in Step::ALL.into_iter().filter(|s| *s >= failed) {
        let hand = step
            .by_hand(t)
            .map(|h| format!(": {h}"))
            .unwrap_or_default();
        text.push_str(&format!("\n  - {}{hand}", step.title(t)));
    }
    if failed <= Step::Stop {
        text.push_str("\n(to keep the host in the pool instead: byoh-agent maintenance off)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::byohost::{HostClaim, MachineReference, NeedsCleanup};
    use byoh_api::common::LocalObjectReference;

    fn target() -> Target {
        Target {
            namespace: "pool".into(),
            name: "h1".into(),
            lease_namespace: "byoh-system".into(),
            identity_files: vec![
                "/var/lib/byoh/kubeconfig".into(),
                "/var/lib/byoh/pending-csr.json".into(),
            ],
            kept_kubeconfig: None,
        }
    }

    fn claimed(releasing: bool) -> ByoHost {
        let mut h = ByoHost::new("h1", Default::default());
        h.spec.claim = Some(HostClaim {
            machine_ref: MachineReference {
                name: "md-0-abc".into(),
                uid: "u1".into(),
            },
            cluster_name: "c".into(),
            bootstrap_secret_ref: LocalObjectReference { name: "s".into() },
            release_requested: releasing,
            ..Default::default()
        });
        h
    }

    #[test]
    fn standing_of_free_claimed_and_unclean_hosts() {
        assert_eq!(
            standing(&ByoHost::new("h1", Default::default())),
            Standing::Free
        );
        assert_eq!(
            standing(&claimed(true)),
            Standing::Claimed {
                machine: "md-0-abc".into(),
                releasing: true
            }
        );
        let mut h = ByoHost::new("h1", Default::default());
        h.spec.needs_cleanup = Some(NeedsCleanup {
            machine_uid: "u1".into(),
            reason: "ForcedRelease".into(),
        });
        assert_eq!(
            standing(&h),
            Standing::NeedsCleanup {
                reason: "ForcedRelease".into()
            }
        );
    }

    #[test]
    fn the_refusal_names_the_byomachine_and_force() {
        let text = refusal(&target(), "md-0-abc");
        assert!(text.contains("ByoMachine md-0-abc"), "{text}");
        assert!(text.contains("--force"), "{text}");
        assert!(text.contains("ByoHost pool/h1"), "{text}");
    }

    #[test]
    fn what_is_left_starts_at_the_failed_step() {
        let t = target();
        let left = left_after(Step::DeleteLease, &t);
        assert!(!left.contains("disable"), "{left}");
        assert!(
            left.contains("kubectl -n byoh-system delete lease pool.h1"),
            "{left}"
        );
        assert!(left.contains("kubectl -n pool delete byohost h1"), "{left}");
        assert!(
            left.contains("rm -f /var/lib/byoh/kubeconfig /var/lib/byoh/pending-csr.json"),
            "{left}"
        );
        assert!(!left.contains("maintenance off"), "{left}");
        let all = left_after(Step::Maintenance, &t);
        assert_eq!(all.lines().count(), 2 + Step::ALL.len(), "{all}");
        assert!(all.ends_with("byoh-agent maintenance off)"), "{all}");
        assert!(all.contains("systemctl disable byoh-agent"), "{all}");
        assert!(all.contains("systemctl stop byoh-agent"), "{all}");
    }

    #[test]
    fn an_operators_kubeconfig_is_kept() {
        let mut settings =
            crate::config::load_or_defaults(std::path::Path::new("/nonexistent/agent.toml"))
                .expect("defaults are valid");
        settings.state_dir = "/s".into();
        let t = Target::new(&settings, "h1");
        assert_eq!(
            t.identity_files,
            vec![
                PathBuf::from("/s/kubeconfig"),
                PathBuf::from("/s/pending-csr.json")
            ]
        );
        assert_eq!(t.kept_kubeconfig, None);
        settings.credentials = Credentials::Kubeconfig("/etc/byoh/admin.kubeconfig".into());
        let t = Target::new(&settings, "h1");
        assert_eq!(t.identity_files, vec![PathBuf::from("/s/pending-csr.json")]);
        assert_eq!(
            t.kept_kubeconfig,
            Some(PathBuf::from("/etc/byoh/admin.kubeconfig"))
        );
    }
}
