//! Cluster API core types the provider reads (`cluster.x-k8s.io/v1beta2` Cluster and Machine),
//! as much as BYOH needs.
//!
//! These are read-only views: unknown fields are ignored, and BYOH writes these objects only
//! twice: it deletes a Machine when its host asks to be decommissioned (`crate::byomachine`
//! decommission), and sets a Machine's `OwnerRemediated` condition when a ByoRemediation hands
//! it back to its owner (`crate::remediation`).
//! Shapes follow CAPI v1.14 `api/core/v1beta2/{cluster,machine}_types.go`; references are
//! `ContractVersionedObjectReference`s (`{apiGroup, kind, name}`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ApiResource, GroupVersionKind};
use kube::core::Object;
use serde::{Deserialize, Serialize};

/// API group of the CAPI core kinds.
pub const GROUP: &str = "cluster.x-k8s.io";
/// Version of the CAPI core kinds BYOH reads.
pub const VERSION: &str = "v1beta2";
/// CAPI label on control-plane Machines (`cluster.x-k8s.io/control-plane`, any value).
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";
/// CAPI label for `--watch-filter` (multi-tenancy): only objects with this label value are
/// reconciled when a filter is set.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// A `cluster.x-k8s.io/v1beta2` Cluster (spec and status views).
pub type Cluster = Object<ClusterSpec, ClusterStatus>;
/// A `cluster.x-k8s.io/v1beta2` Machine (spec view; status unused).
pub type Machine = Object<MachineSpec, MachineStatus>;

/// The `ApiResource` of `cluster.x-k8s.io/v1beta2` Cluster.
pub fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "Cluster"),
        "clusters",
    )
}

/// The `ApiResource` of `cluster.x-k8s.io/v1beta2` Machine.
pub fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "Machine"),
        "machines",
    )
}

/// Api for Clusters in `namespace`.
pub fn clusters(client: kube::Client, namespace: &str) -> Api<Cluster> {
    Api::namespaced_with(client, namespace, &cluster_resource())
}

/// Api for Machines in `namespace`.
pub fn machines(client: kube::Client, namespace: &str) -> Api<Machine> {
    Api::namespaced_with(client, namespace, &machine_resource())
}

/// `Cluster.spec`, the fields BYOH reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// `spec.paused`: reconcilers of the Cluster's objects do nothing while true.
    #[serde(default)]
    pub paused: Option<bool>,
    /// `spec.controlPlaneEndpoint`, when the user sets it on the Cluster.
    #[serde(default)]
    pub control_plane_endpoint: Option<byoh_api::common::ApiEndpoint>,
    /// `spec.infrastructureRef`: the ByoCluster.
    #[serde(default)]
    pub infrastructure_ref: Option<ContractReference>,
    /// `spec.clusterNetwork`: the service and pod CIDRs.
    #[serde(default)]
    pub cluster_network: Option<ClusterNetwork>,
}

/// `Cluster.spec.clusterNetwork`, the fields BYOH reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNetwork {
    /// `services`: the service CIDRs.
    #[serde(default)]
    pub services: Option<NetworkRanges>,
    /// `pods`: the pod CIDRs.
    #[serde(default)]
    pub pods: Option<NetworkRanges>,
}

/// A CAPI `NetworkRanges`: `{cidrBlocks: [...]}`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRanges {
    /// The CIDRs, e.g. `10.96.0.0/12`.
    #[serde(default)]
    pub cidr_blocks: Vec<String>,
}

impl ClusterSpec {
    /// `clusterNetwork.services.cidrBlocks` and `clusterNetwork.pods.cidrBlocks` (empty when
    /// not set).
    pub fn cidrs(&self) -> (Vec<String>, Vec<String>) {
        let blocks =
            |r: Option<&NetworkRanges>| r.map(|r| r.cidr_blocks.clone()).unwrap_or_default();
        let n = self.cluster_network.as_ref();
        (
            blocks(n.and_then(|n| n.services.as_ref())),
            blocks(n.and_then(|n| n.pods.as_ref())),
        )
    }
}

/// `Cluster.status`, the fields BYOH reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// `status.initialization`.
    #[serde(default)]
    pub initialization: Option<ClusterInitialization>,
    /// `status.conditions` (`metav1.Condition`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// `Cluster.status.initialization`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// Copied by CAPI from the InfraCluster's `status.initialization.provisioned`.
    #[serde(default)]
    pub infrastructure_provisioned: Option<bool>,
    /// True once the control plane answers (first control-plane Machine bootstrapped).
    #[serde(default)]
    pub control_plane_initialized: Option<bool>,
}

/// A CAPI v1beta2 `ContractVersionedObjectReference`: `{apiGroup, kind, name}`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContractReference {
    /// API group of the referent.
    #[serde(default)]
    pub api_group: String,
    /// Kind of the referent.
    #[serde(default)]
    pub kind: String,
    /// Name of the referent (same namespace).
    #[serde(default)]
    pub name: String,
}

/// `Machine.spec`, the fields BYOH reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// `spec.clusterName`.
    #[serde(default)]
    pub cluster_name: String,
    /// `spec.bootstrap`.
    #[serde(default)]
    pub bootstrap: MachineBootstrap,
    /// `spec.version`: the Kubernetes version, e.g. `v1.36.1`.
    #[serde(default)]
    pub version: Option<String>,
    /// `spec.failureDomain`: the host must be in this failure domain.
    #[serde(default)]
    pub failure_domain: Option<String>,
    /// `spec.infrastructureRef`: the ByoMachine.
    #[serde(default)]
    pub infrastructure_ref: Option<ContractReference>,
    /// `spec.providerID`: copied by Cluster API from `ByoMachine.spec.providerID`
    /// (`byoh://<host>/<id>`) once the host has bootstrapped.
    #[serde(default, rename = "providerID")]
    pub provider_id: Option<String>,
}

/// `Machine.spec.bootstrap`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineBootstrap {
    /// `configRef`: the bootstrap config (e.g. CABPK's `KubeadmConfig`) whose provider makes
    /// the data Secret.
    #[serde(default)]
    pub config_ref: Option<ContractReference>,
    /// Name of the Secret holding the bootstrap data (key `value`); absent while not ready.
    #[serde(default)]
    pub data_secret_name: Option<String>,
}

/// `Machine.status`, the fields BYOH reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct MachineStatus {
    /// `status.conditions` (`metav1.Condition`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Whether a MachineHealthCheck found that `machine`'s Node never appeared in time: condition
/// `HealthCheckSucceeded=False` with reason `NodeStartupTimeout` (Cluster API v1beta2,
/// `MachineHealthCheckNodeStartupTimeoutReason`; set before the MachineSet or KCP deletes the
/// Machine to remediate it).
pub fn node_startup_timed_out(machine: &Machine) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == "HealthCheckSucceeded"
                && c.status == "False"
                && c.reason == "NodeStartupTimeout"
        })
    })
}

/// Whether a Cluster is paused (`spec.paused` or the `cluster.x-k8s.io/paused` annotation).
pub fn cluster_paused(cluster: &Cluster) -> bool {
    cluster.spec.paused == Some(true)
        || cluster
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(byoh_api::labels::PAUSED))
}

/// Whether the Cluster's infrastructure is provisioned
/// (`status.initialization.infrastructureProvisioned`).
pub fn infrastructure_provisioned(cluster: &Cluster) -> bool {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.infrastructure_provisioned)
        == Some(true)
}

/// Whether the Cluster's control plane is initialized
/// (`status.initialization.controlPlaneInitialized`, or the `ControlPlaneInitialized` condition).
pub fn control_plane_initialized(cluster: &Cluster) -> bool {
    cluster.status.as_ref().is_some_and(|s| {
        s.initialization
            .as_ref()
            .and_then(|i| i.control_plane_initialized)
            == Some(true)
            || byoh_api::conditions::is_true(&s.conditions, "ControlPlaneInitialized")
    })
}

/// Whether a Machine is a control-plane Machine (label [`CONTROL_PLANE_LABEL`]).
pub fn is_control_plane(machine: &Machine) -> bool {
    machine
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v1beta2_cluster_and_machine_json() {
        let cluster: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "n"},
            "spec": {"paused": false, "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "ByoCluster", "name": "c"}, "topology": {"x": 1},
                     "clusterNetwork": {"services": {"cidrBlocks": ["10.96.0.0/12"]}, "pods": {"cidrBlocks": ["192.168.0.0/16", "fd00::/48"]}}},
            "status": {"initialization": {"infrastructureProvisioned": true}, "conditions": [{"type": "ControlPlaneInitialized", "status": "True", "reason": "x", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        }))
        .unwrap();
        assert!(!cluster_paused(&cluster));
        assert!(infrastructure_provisioned(&cluster));
        assert!(control_plane_initialized(&cluster));
        assert_eq!(
            cluster.spec.cidrs(),
            (
                vec!["10.96.0.0/12".to_string()],
                vec!["192.168.0.0/16".to_string(), "fd00::/48".to_string()]
            )
        );
        let bare: ClusterSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(bare.cidrs(), (vec![], vec![]));
        let machine: Machine = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "n", "labels": {"cluster.x-k8s.io/control-plane": ""}},
            "spec": {"clusterName": "c", "bootstrap": {"dataSecretName": "s"}, "version": "v1.36.1",
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "ByoMachine", "name": "m"}}
        }))
        .unwrap();
        assert!(is_control_plane(&machine));
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("s")
        );
        assert_eq!(machine.spec.version.as_deref(), Some("v1.36.1"));
    }
}
