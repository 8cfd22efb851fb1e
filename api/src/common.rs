//! Shapes shared by several kinds: references, addresses, endpoints, template metadata.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `status.initialization` of an infrastructure object, as the CAPI v1beta2 contract defines it.
///
/// Source: Cluster API book, "Contract rules for InfraMachine" / "InfraCluster", rule
/// "InfraMachine initialization completed".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Initialization {
    /// True once the infrastructure is provisioned. Never flips back to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// A reference to an object of a known API group and kind in the referrer's namespace,
/// shaped like Cluster API v1beta2's `ContractVersionedObjectReference` (no apiVersion: the
/// version is resolved from the CRD's contract label).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    /// API group of the referent, e.g. `infrastructure.cluster.x-k8s.io`.
    pub api_group: String,
    /// Kind of the referent, e.g. `K8sInstallerConfigTemplate`.
    pub kind: String,
    /// Name of the referent.
    pub name: String,
}

/// A reference to a named object in the referrer's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the referent.
    pub name: String,
}

/// A network address of a machine, as CAPI's `MachineAddress`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineAddress {
    /// One of `Hostname`, `ExternalIP`, `InternalIP`, `ExternalDNS`, `InternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address: an IP (no prefix length) or a DNS name.
    pub address: String,
}

/// An API server endpoint, as CAPI's `APIEndpoint`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// Host name or IP address of the endpoint.
    #[serde(default)]
    pub host: String,
    /// TCP port, 1–65535 (0 or absent means "use the default", 6443).
    #[serde(default)]
    pub port: i32,
}

/// A failure domain, as CAPI v1beta2's `FailureDomain` (a list entry, not a map value).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain; hosts carry it in the label
    /// [`crate::labels::FAILURE_DOMAIN`].
    pub name: String,
    /// Whether control plane machines may be placed in this failure domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes of the failure domain.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// Labels and annotations that a template stamps onto the objects made from it
/// (`spec.template.metadata`, as CAPI's `ObjectMeta`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMeta {
    /// Labels to copy onto the created object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to copy onto the created object.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}
