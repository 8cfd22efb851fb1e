//! System test of issue 40 (metrics Prometheus can scrape safely), against the real API server:
//! the controller as deployed (its binary with the Deployment's metrics and probe flags,
//! authenticated as the components' ServiceAccount, so only the generated RBAC applies) serves
//! `/metrics` over HTTPS, and the API server decides who reads it. A scrape without a token, or
//! with a token the API server does not accept, is refused (401); a ServiceAccount's token is
//! authenticated but refused until it is bound to ClusterRole `byoh-metrics-reader` of
//! `infrastructure-components.yaml` (403); bound, it reads the controller's metrics. The
//! kubelet's probes `/healthz` and `/readyz` answer on their own port without a token, and
//! `/metrics` is not there.

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
