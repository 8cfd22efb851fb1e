//! `ByoCluster` (CAPI InfraCluster) and `ByoClusterTemplate` (InfraClusterTemplate).

use crate::common::{ApiEndpoint, FailureDomain, Initialization, TemplateMeta};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of a ByoCluster.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "ByoCluster",
    plural = "byoclusters",
    namespaced,
    status = "ByoClusterStatus",
    shortname = "byoc",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.controlPlaneEndpoint.host"}"#,
    printcolumn = r#"{"name":"Provisioned","type":"boolean","jsonPath":".status.initialization.provisioned"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterSpec {
    /// The control plane's API endpoint: a free address in the hosts' subnet (for example
    /// served by kube-vip). Port defaults to 6443.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.port == 0 || (self.port >= 1 && self.port <= 65535)").message("port must be within 1-65535"))]
    pub control_plane_endpoint: Option<ApiEndpoint>,

    /// Failure domains of this cluster; a host belongs to the one named by its
    /// `topology.kubernetes.io/zone` label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub failure_domains: Vec<FailureDomain>,
}

/// Observed state of a ByoCluster.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterStatus {
    /// CAPI v1beta2 contract: `provisioned` is true once the endpoint is known; never reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,

    /// Failure domains, mirrored from `spec.failureDomains` for CAPI.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub failure_domains: Vec<FailureDomain>,

    /// Standard conditions: `Ready`, `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// A template for ByoClusters, used by ClusterClass.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "ByoClusterTemplate",
    plural = "byoclustertemplates",
    namespaced,
    shortname = "byoct",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterTemplateSpec {
    /// The ByoCluster to stamp out.
    pub template: ByoClusterTemplateResource,
}

/// `spec.template` of a ByoClusterTemplate.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ByoClusterTemplateResource {
    /// Labels and annotations for the created ByoCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of the created ByoCluster.
    pub spec: ByoClusterSpec,
}
