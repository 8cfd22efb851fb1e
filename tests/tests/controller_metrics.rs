//! System test of issue 40 (metrics Prometheus can scrape safely), against the real API server:
//! the controller as deployed (its binary with the Deployment's metrics and probe flags,
//! authenticated as the components' ServiceAccount, so only the generated RBAC applies) serves
//! `/metrics` over HTTPS, and the API server decides who reads it. A scrape without a token, or
//! with a token the API server does not accept, is refused (401); a ServiceAccount's token is
//! authenticated but refused until it is bound to ClusterRole `byoh-metrics-reader` of
//! `infrastructure-components.yaml` (403); bound, it reads the controller's metrics. The
//! kubelet's probes `/healthz` and `/readyz` answer on their own port without a token, and
//! `/metrics` is not there. The release's optional ServiceMonitor is valid against the
//! Prometheus Operator's CRD and selects that Service's port.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::controller::{ControllerProcess, service_account_token};
use byoh_tests::{access, eventually};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use std::time::Duration;

/// `GET url` with `token` as bearer (none when `None`): the status and the body.
async fn get(client: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = client.get(url);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn only_callers_the_api_server_allows_read_the_controllers_metrics() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    access::install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "ctl-metrics").await.unwrap();
    let (metrics_port, health_port) = (
        byoh_tests::free_loopback_port(),
        byoh_tests::free_loopback_port(),
    );
    let controller = ControllerProcess::start_with(
        &admin,
        &control_plane::kubeconfig_path().unwrap(),
        ns.name(),
        &[
            &format!("--metrics-address=127.0.0.1:{metrics_port}"),
            &format!("--health-probe-address=127.0.0.1:{health_port}"),
        ],
    )
    .await
    .unwrap();
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The scraper does not know the controller's own certificate (a ServiceMonitor's
    // insecureSkipVerify); what is checked is the caller.
    let https = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let plain = reqwest::Client::new();
    let metrics = format!("https://127.0.0.1:{metrics_port}/metrics");
    let health = format!("http://127.0.0.1:{health_port}");

    eventually(
        "the controller's /readyz",
        Duration::from_secs(60),
        || async {
            let r = plain.get(format!("{health}/readyz")).send().await.ok()?;
            (r.status().as_u16() == 200).then_some(())
        },
    )
    .await;
    assert_eq!(get(&plain, &format!("{health}/healthz"), None).await.0, 200);
    assert_eq!(get(&plain, &format!("{health}/metrics"), None).await.0, 404);
    // Plain HTTP is not served on the metrics port.
    assert!(
        plain
            .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .send()
            .await
            .is_err_and(|e| !e.is_status()),
        "plain HTTP answered on the metrics port"
    );

    // No token, or one the API server does not accept.
    let (status, body) = get(&https, &metrics, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get(&https, &metrics, Some("not-a-token")).await;
    assert_eq!(status, 401, "{body}");

    // A ServiceAccount of the test namespace: authenticated, not allowed.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns.name());
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some("scraper".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let token = service_account_token(&admin, ns.name(), "scraper", 600)
        .await
        .unwrap();
    let (status, body) = get(&https, &metrics, Some(&token)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains(&format!(
            "system:serviceaccount:{}:scraper\" may not get path \"/metrics\"",
            ns.name()
        )),
        "{body}"
    );

    // Bound to the components' metrics reader: it reads the metrics.
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let binding = format!("{}-scraper", ns.name());
    bindings
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some(binding.clone()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: byoh_controller::manifests_metrics::METRICS_READER_ROLE.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "scraper".into(),
                    namespace: Some(ns.name().into()),
                    api_group: None,
                }]),
            },
        )
        .await
        .unwrap();
    let body = eventually(
        "the bound scraper reads /metrics",
        Duration::from_secs(30),
        || async {
            let (status, body) = get(&https, &metrics, Some(&token)).await;
            (status == 200).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("byoh_controller_build_info{") && body.ends_with("# EOF\n"),
        "{body}"
    );
    // The token never reaches the log.
    assert!(!controller.log().contains(&token));

    bindings
        .delete(&binding, &DeleteParams::default())
        .await
        .unwrap();
    drop(controller);
    ns.cleanup(&admin).await.unwrap();
}

/// The prometheus-operator release whose ServiceMonitor CRD the optional component is checked
/// against (its module, from the Go module proxy).
const PROMETHEUS_OPERATOR: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";

/// The ServiceMonitor CRD of [`PROMETHEUS_OPERATOR`] (`example/prometheus-operator-crd/`), or
/// `None` after the missing-part rule when the module cannot be downloaded.
fn service_monitor_crd() -> Option<String> {
    let out = std::process::Command::new("go")
        .args(["mod", "download", "-json", PROMETHEUS_OPERATOR])
        .current_dir(std::env::temp_dir())
        .output();
    let dir = out
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["Dir"].as_str().map(std::path::PathBuf::from));
    let Some(dir) = dir else {
        byoh_tests::missing_part(&format!(
            "go mod download {PROMETHEUS_OPERATOR} failed (needs go and the Go module proxy)"
        ));
        return None;
    };
    Some(
        std::fs::read_to_string(
            dir.join("example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"),
        )
        .unwrap(),
    )
}

/// The release's optional `metrics-servicemonitor.yaml`, applied as its README says to a real API
/// server that has the Prometheus Operator's ServiceMonitor CRD: accepted with strict field
/// validation (no field the CRD does not know is dropped), and it selects exactly the
/// components' metrics Service and names its `https` port, whose target is the Deployment's
/// metrics container port.
#[tokio::test(flavor = "multi_thread")]
async fn the_optional_service_monitor_selects_the_metrics_service() {
    use byoh_tests::manifests::{apply_yaml, components_text, config_file, documents};
    use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams, ValidationDirective};
    let Some(admin) = control_plane::client().await else {
        return;
    };
    let Some(crd) = service_monitor_crd() else {
        return;
    };
    access::install_components(&admin).await.unwrap();
    apply_yaml(&admin, &crd, false).await.unwrap();
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor");
    let (ar, _) = eventually(
        "the ServiceMonitor CRD served",
        Duration::from_secs(30),
        || async { kube::discovery::pinned_kind(&admin, &gvk).await.ok() },
    )
    .await;

    let text =
        std::fs::read_to_string(config_file("optional/metrics-servicemonitor.yaml")).unwrap();
    let monitor = documents(&text).unwrap().remove(0);
    let ns = monitor["metadata"]["namespace"].as_str().unwrap();
    let name = monitor["metadata"]["name"].as_str().unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &ar);
    let mut pp = PatchParams::apply("byoh-tests").force();
    pp.field_validation = Some(ValidationDirective::Strict);
    let stored = api.patch(name, &pp, &Patch::Apply(&monitor)).await.unwrap();
    assert_eq!(
        stored.data["spec"], monitor["spec"],
        "the API server changed the spec"
    );

    // What it selects, among the components' objects.
    let components = documents(&components_text().unwrap()).unwrap();
    let services: Vec<&serde_json::Value> = components
        .iter()
        .filter(|d| d["kind"] == "Service" && d["metadata"]["namespace"] == ns)
        .filter(|d| {
            let labels = &d["metadata"]["labels"];
            monitor["spec"]["selector"]["matchLabels"]
                .as_object()
                .unwrap()
                .iter()
                .all(|(k, v)| labels[k] == *v)
        })
        .collect();
    assert_eq!(services.len(), 1, "selects {services:?}");
    let service = services[0];
    assert_eq!(
        service["metadata"]["name"],
        byoh_controller::manifests_metrics::METRICS_SERVICE
    );
    let port = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == monitor["spec"]["endpoints"][0]["port"])
        .expect("the ServiceMonitor's port is one of the Service's");
    let deployment = components
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    let container_ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap();
    assert!(
        container_ports
            .iter()
            .any(|p| p["name"] == port["targetPort"]),
        "the Service's target port {} is no container port: {container_ports:?}",
        port["targetPort"]
    );
    api.delete(name, &DeleteParams::default()).await.unwrap();
}
