//! The objects of the controller's metrics endpoint in `infrastructure-components.yaml` (issue
//! 40): the ClusterRole a scraper is bound to, and the Service Prometheus discovers the endpoint
//! through. Built from what `manifests/` passes in (names, labels, port), so this module
//! needs nothing of it. The endpoint itself is `serve.rs`, its access rule `metrics_auth.rs`.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The ClusterRole that may read the controller's `/metrics`: bind it to the scraper's
/// ServiceAccount (Prometheus'), as Cluster API's providers ship theirs.
pub const METRICS_READER_ROLE: &str = "byoh-metrics-reader";
/// The Service in front of the metrics endpoint (port `https`).
pub const METRICS_SERVICE: &str = "byoh-controller-manager-metrics";

/// The metrics reader ClusterRole with `metadata` ([`METRICS_READER_ROLE`]): `get` on the
/// non-resource URL `/metrics`, nothing else.
pub fn metrics_reader_role(metadata: ObjectMeta) -> ClusterRole {
    ClusterRole {
        metadata,
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        aggregation_rule: None,
    }
}

/// The metrics Service with `metadata` ([`METRICS_SERVICE`]): the Pods matching `selector`,
/// port `https` = `port` to the container port named `metrics`.
pub fn metrics_service(
    metadata: ObjectMeta,
    selector: BTreeMap<String, String>,
    port: i32,
) -> Service {
    Service {
        metadata,
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The optional `metrics-servicemonitor.yaml` (issue 40): a Prometheus Operator ServiceMonitor
/// (`monitoring.coreos.com/v1`, the CRD of prometheus-operator's `example/prometheus-operator-crd`)
/// in `namespace` that scrapes the Service whose labels are `service_labels` on its port `https`
/// with the scraping Prometheus' own ServiceAccount token — which [`METRICS_READER_ROLE`] must be
/// bound to — skipping the verification of the controller's self-made certificate (the token,
/// not the server, is what is checked: `metrics_auth.rs`). Not part of
/// `infrastructure-components.yaml`: only clusters running the Prometheus Operator have the kind.
pub fn service_monitor(
    namespace: &str,
    service_labels: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": "byoh-controller-manager",
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {
            "selector": {"matchLabels": service_labels},
            "endpoints": [{
                "port": "https",
                "scheme": "https",
                "path": "/metrics",
                "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "tlsConfig": {"insecureSkipVerify": true},
            }],
        },
    })
}
