//! The objects of the controller's metrics endpoint in `infrastructure-components.yaml` (issue
//! 40): the ClusterRole a scraper is bound to, and the Service Prometheus discovers the endpoint
//! through. The endpoint itself is `serve.rs`, its access rule `metrics_auth.rs`.

use crate::manifests::{DEPLOYMENT, METRICS_PORT, NAMESPACE};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The ClusterRole that may read the controller's `/metrics`: bind it to the scraper's
/// ServiceAccount (Prometheus'), as Cluster API's providers ship theirs.
pub const METRICS_READER_ROLE: &str = "byoh-metrics-reader";
/// The Service in front of the metrics endpoint (port `https`).
pub const METRICS_SERVICE: &str = "byoh-controller-manager-metrics";

/// [`METRICS_READER_ROLE`]: `get` on the non-resource URL `/metrics`, nothing else.
pub fn metrics_reader_role() -> ClusterRole {
    ClusterRole {
        metadata: crate::manifests::cluster_meta(METRICS_READER_ROLE),
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        aggregation_rule: None,
    }
}

/// [`METRICS_SERVICE`]: the Deployment's Pods, port `https` ([`METRICS_PORT`]).
pub fn metrics_service() -> Service {
    let mut meta = crate::manifests::cluster_meta(METRICS_SERVICE);
    meta.namespace = Some(NAMESPACE.into());
    Service {
        metadata: meta,
        spec: Some(ServiceSpec {
            selector: Some([("control-plane".to_string(), DEPLOYMENT.to_string())].into()),
            ports: Some(vec![ServicePort {
                name: Some("https".into()),
                port: METRICS_PORT,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}
