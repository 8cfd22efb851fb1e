//! `ByoMachine` (CAPI InfraMachine) and `ByoMachineTemplate` (InfraMachineTemplate).

use crate::common::{Initialization, MachineAddress, TemplateMeta, TypedLocalObjectReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Desired state of a ByoMachine: which hosts it may claim and how to install Kubernetes.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "ByoMachine",
    plural = "byomachines",
    namespaced,
    status = "ByoMachineStatus",
    shortname = "byom",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']","description":"Cluster this machine belongs to"}"#,
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".status.hostRef.name","description":"Claimed ByoHost"}"#,
    printcolumn = r#"{"name":"ProviderID","type":"string","jsonPath":".spec.providerID"}"#,
    printcolumn = r#"{"name":"Provisioned","type":"boolean","jsonPath":".status.initialization.provisioned"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineSpec {
    /// Narrows the ByoHosts this machine may claim (in its own namespace). Absent matches all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// Fewest CPUs a host must have: its online logical CPUs (`status.hostInfo.cpus`, what the
    /// kubelet reports as `cpu` capacity), at least 1.
    #[serde(default, rename = "minCPU", skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("minCPU must be at least 1"))]
    pub min_cpu: Option<i32>,

    /// Least memory a host must have (`status.hostInfo.memoryBytes`, the kernel's `MemTotal`,
    /// what the kubelet reports as `memory` capacity), a Kubernetes quantity such as `16Gi`.
    /// A 16 GiB machine reports a little less than `16Gi`: ask for `15Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isQuantity(string(self))").message("minMemory must be a Kubernetes quantity such as 16Gi"))]
    pub min_memory: Option<Quantity>,

    /// Vendor of an accelerator the host must have (`status.hostInfo.accelerators`): `nvidia`,
    /// `amd` or `intel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['nvidia', 'amd', 'intel']").message("acceleratorVendor must be nvidia, amd or intel"))]
    pub accelerator_vendor: Option<String>,

    /// Provider ID of the claimed host, `byoh://<host>/<unique id>`; set by the controller once
    /// the host is claimed, then immutable.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self.startsWith('byoh://')").message("providerID must start with byoh://"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("providerID is immutable once set"))]
    pub provider_id: Option<String>,

    /// The `K8sInstallerConfigTemplate` to clone for this machine. Absent means Kubernetes is
    /// pre-installed on the hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installer_ref: Option<TypedLocalObjectReference>,
}

/// Observed state of a ByoMachine.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineStatus {
    /// CAPI v1beta2 contract: `provisioned` becomes true once the host bootstrapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// The claimed ByoHost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ref: Option<HostReference>,

    /// Node addresses reported by the host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,

    /// Failure domain of the claimed host, if it carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,

    /// Standard conditions: `Ready`, `Paused`, `HostClaimed`, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// Reference to the ByoHost a machine claimed.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostReference {
    /// Name of the ByoHost (same namespace).
    pub name: String,
    /// UID of the ByoHost.
    pub uid: String,
}

/// A template for ByoMachines, used by KubeadmControlPlane, MachineDeployment and ClusterClass.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "ByoMachineTemplate",
    plural = "byomachinetemplates",
    namespaced,
    status = "ByoMachineTemplateStatus",
    shortname = "byomt",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"CPU","type":"string","jsonPath":".status.capacity.cpu","description":"CPUs every fitting host has (autoscaling from zero)"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".status.capacity.memory","description":"Memory every fitting host has (autoscaling from zero)"}"#,
    printcolumn = r#"{"name":"Arch","type":"string","jsonPath":".status.nodeInfo.architecture","description":"Architecture of the fitting hosts"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineTemplateSpec {
    /// The ByoMachine to stamp out.
    pub template: ByoMachineTemplateResource,
}

/// What a Node made from a ByoMachineTemplate has, for autoscaling from zero (Cluster API's
/// InfraMachineTemplate contract, optional part: the cluster-autoscaler's `clusterapi` provider
/// reads it). Written by the controller from the ByoHosts that fit the template: the minimum
/// over them (see `controller/src/byomachinetemplate.rs`).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineTemplateStatus {
    /// Resources every fitting host has (a `corev1.ResourceList`): `cpu`, `memory` and
    /// accelerator counts such as `nvidia.com/gpu`. Empty when no host fits.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,

    /// Architecture and operating system of the Nodes; absent when no host fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}

/// `status.nodeInfo` of an InfraMachineTemplate (Cluster API contract).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// `amd64`, `arm64`, `s390x` or `ppc64le`, as Go names architectures; absent when the
    /// fitting hosts differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// `linux` (every BYOH host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}

/// `spec.template` of a ByoMachineTemplate.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoMachineTemplateResource {
    /// Labels and annotations for the created ByoMachines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of the created ByoMachines.
    pub spec: ByoMachineSpec,
}
