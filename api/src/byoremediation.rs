//! `ByoRemediation` and `ByoRemediationTemplate`: Cluster API's external remediation for BYOH
//! Machines, a remedy for hosts that cannot simply be replaced.
//!
//! A MachineHealthCheck whose `spec.remediation.templateRef` names a `ByoRemediationTemplate`
//! does not have an unhealthy Machine deleted: it creates a `ByoRemediation` named as the Machine
//! (owned by it) from the template's `spec.template`, and deletes it once the Machine is healthy
//! again (Cluster API's MachineHealthCheck controller, "external remediation"). BYOH's controller
//! then carries out [`ByoRemediationSpec::steps`] in order on the Machine's host — the agent
//! restarts containerd and the kubelet, or reboots the host — giving the Machine
//! [`ByoRemediationSpec::step_timeout_seconds`] after each to become healthy. After the last it
//! hands the Machine back to its owner (MachineSet, KubeadmControlPlane), which replaces it: it
//! sets the Machine's `OwnerRemediated` condition False, as Cluster API's own remediation does.

use crate::common::TemplateMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One remedy the agent carries out on the host of an unhealthy Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RemediationAction {
    /// Restart `containerd.service` (when the host has it) and then `kubelet.service`, through
    /// systemd.
    RestartServices,
    /// Reboot the host (systemd's `reboot.target`). The kubelet starts again once the agent
    /// has confirmed that the claim still holds.
    Reboot,
}

impl RemediationAction {
    /// The name used in the API, Events and logs (`RestartServices`, `Reboot`).
    pub fn as_str(self) -> &'static str {
        match self {
            RemediationAction::RestartServices => "RestartServices",
            RemediationAction::Reboot => "Reboot",
        }
    }
}

/// Steps when a ByoRemediation names none.
pub const DEFAULT_STEPS: [RemediationAction; 2] = [
    RemediationAction::RestartServices,
    RemediationAction::Reboot,
];
/// Seconds a Machine may stay unhealthy after a step when the ByoRemediation sets none.
pub const DEFAULT_STEP_TIMEOUT_SECONDS: i32 = 300;

/// An external remediation request for the Machine of the same name (created by a
/// MachineHealthCheck from a [`ByoRemediationTemplate`]).
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "ByoRemediation",
    plural = "byoremediations",
    namespaced,
    status = "ByoRemediationStatus",
    shortname = "byor",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"Running: steps under way; HandedOver: the Machine went back to its owner for replacement"}"#,
    printcolumn = r#"{"name":"Step","type":"string","jsonPath":".status.steps[-1:].action","description":"The last step asked of the host"}"#,
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".status.steps[-1:].host","description":"The Machine's ByoHost"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ByoRemediationSpec {
    /// The remedies, in order; empty means `[RestartServices, Reboot]`. After the last one's
    /// timeout the Machine goes to its owner for replacement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = Rule::new("size(self) <= 4").message("at most 4 steps"))]
    pub steps: Vec<RemediationAction>,

    /// Seconds the Machine may stay unhealthy after a step before the next one (or the
    /// hand-over); 30 to 3600, default 300. Longer than the host takes to reboot and its Node to
    /// report Ready, shorter than the MachineHealthCheck's patience for the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 30 && self <= 3600").message("stepTimeoutSeconds must be 30 to 3600"))]
    pub step_timeout_seconds: Option<i32>,
}

impl ByoRemediationSpec {
    /// The steps to carry out ([`DEFAULT_STEPS`] when none are named).
    pub fn effective_steps(&self) -> Vec<RemediationAction> {
        if self.steps.is_empty() {
            DEFAULT_STEPS.to_vec()
        } else {
            self.steps.clone()
        }
    }

    /// The timeout after each step, seconds ([`DEFAULT_STEP_TIMEOUT_SECONDS`] when unset).
    pub fn effective_step_timeout_seconds(&self) -> i32 {
        self.step_timeout_seconds
            .unwrap_or(DEFAULT_STEP_TIMEOUT_SECONDS)
    }
}

/// What the controller did for a ByoRemediation.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoRemediationStatus {
    /// `Running` while steps are carried out, `HandedOver` once the Machine's owner was asked
    /// to replace it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,

    /// The steps asked of the host so far, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<RemediationStepStatus>,
}

/// One step asked of the host.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStepStatus {
    /// The remedy.
    pub action: RemediationAction,
    /// The ByoHost it was asked of.
    pub host: String,
    /// When it was asked.
    pub started_at: Time,
}

/// `ByoRemediationStatus.phase` while steps are carried out.
pub const PHASE_RUNNING: &str = "Running";
/// `ByoRemediationStatus.phase` once the Machine went back to its owner.
pub const PHASE_HANDED_OVER: &str = "HandedOver";

/// A template for ByoRemediations, named by a MachineHealthCheck's
/// `spec.remediation.templateRef`.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "ByoRemediationTemplate",
    plural = "byoremediationtemplates",
    namespaced,
    shortname = "byort",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ByoRemediationTemplateSpec {
    /// The ByoRemediation to stamp out.
    pub template: ByoRemediationTemplateResource,
}

/// `spec.template` of a ByoRemediationTemplate.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoRemediationTemplateResource {
    /// Labels and annotations for the created ByoRemediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// The created ByoRemediation's spec.
    #[serde(default)]
    pub spec: ByoRemediationSpec,
}

/// A remedy the controller asks of a claimed host (`spec.claim.remediation`): the agent carries
/// it out once per `id` while the host is a node, and reports it in `status.remediation`.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRemediation {
    /// Unique per step: `<ByoRemediation UID>/<step index>`.
    pub id: String,
    /// The remedy.
    pub action: RemediationAction,
}

/// The last remedy the agent carried out (`status.remediation`).
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostRemediationStatus {
    /// The request's [`HostRemediation::id`].
    pub id: String,
    /// What happened: `Done`, or `Failed: <reason>`, or `Skipped: <reason>` (the host was not
    /// a node of this claim).
    pub result: String,
}
