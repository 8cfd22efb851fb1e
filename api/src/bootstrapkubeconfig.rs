//! `BootstrapKubeconfig`: asks the controller for a short-lived bootstrap kubeconfig that new
//! hosts use once, to request their own client certificate (TLS bootstrap).
//!
//! The token never appears in `status`: the kubeconfig is stored in a Secret that `status`
//! points to, and the token itself in a `bootstrap.kubernetes.io/token` Secret in `kube-system`.

use crate::common::LocalObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired bootstrap kubeconfig.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "BootstrapKubeconfig",
    plural = "bootstrapkubeconfigs",
    namespaced,
    status = "BootstrapKubeconfigStatus",
    shortname = "byobk",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"API server","type":"string","jsonPath":".spec.apiServer"}"#,
    printcolumn = r#"{"name":"Expires","type":"date","jsonPath":".status.expirationTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapKubeconfigSpec {
    /// URL of the management cluster's API server as the hosts reach it, `https://host:port`.
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("apiServer must be an https:// URL"))]
    pub api_server: String,

    /// Base64 of the PEM CA bundle that signs the API server's certificate.
    pub certificate_authority_data: String,

    /// Lifetime of the bootstrap token in seconds (default 3600, at most 7 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 60 && self <= 604800").message("ttlSeconds must be within 60-604800"))]
    pub ttl_seconds: Option<i64>,

    /// Issue a new token (and kubeconfig) when the current one expires.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub renew: bool,
}

/// Observed state of a BootstrapKubeconfig.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapKubeconfigStatus {
    /// Secret (same namespace) whose key `kubeconfig` holds the bootstrap kubeconfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret_ref: Option<LocalObjectReference>,
    /// ID of the bootstrap token (the public half; Secret `kube-system/bootstrap-token-<id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// When the token expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<Time>,
    /// Standard conditions: `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
