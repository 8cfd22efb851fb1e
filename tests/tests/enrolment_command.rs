//! Enrolment in one command (issue 40, item 3), as an operator runs it against the real API
//! server with the controller running (its binary, the components' ServiceAccount):
//! `byoh-controller enrolment-kubeconfig --namespace POOL --ttl 30m` with the operator's
//! kubeconfig prints a bootstrap kubeconfig whose server and CA are the operator's and whose
//! token the API server authenticates, ending after the asked lifetime; asked
//! for a pool no controller watches, it fails after its timeout saying why, and prints nothing.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::controller::ControllerProcess;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

fn enrolment_kubeconfig(args: &[&str]) -> std::process::Output {
    std::process::Command::new(agent::repo_root().join("target/debug/byoh-controller"))
        .arg("enrolment-kubeconfig")
        .args(args)
        .env("KUBECONFIG", control_plane::kubeconfig_path().unwrap())
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_command_prints_a_bootstrap_kubeconfig_for_a_pool() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    byoh_tests::access::install_components(&admin)
        .await
        .unwrap();
    let pool = TestNamespace::create(&admin, "enrol-cmd").await.unwrap();
    let _controller = ControllerProcess::start(
        &admin,
        &control_plane::kubeconfig_path().unwrap(),
        pool.name(),
    )
    .await
    .unwrap();

    let out = enrolment_kubeconfig(&["--namespace", pool.name(), "--ttl", "30m"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let printed: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    let admin_kc: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(control_plane::kubeconfig_path().unwrap()).unwrap(),
    )
    .unwrap();
    let server = |v: &serde_json::Value| {
        v["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .trim_end_matches('/')
            .to_string()
    };
    assert_eq!(server(&printed), server(&admin_kc));
    assert!(
        printed["clusters"][0]["cluster"]["certificate-authority-data"]
            .as_str()
            .is_some_and(|d| !d.is_empty()),
        "{text}"
    );
    // The token is one the API server takes; it ends in 30 minutes.
    let token = printed["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    agent::wait_authenticates(&admin, &token).await.unwrap();
    let id = token.split('.').next().unwrap();
    let stored = Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .get(&format!("bootstrap-token-{id}"))
        .await
        .unwrap();
    let expiration =
        String::from_utf8(stored.data.unwrap().get("expiration").unwrap().0.clone()).unwrap();
    let ends: k8s_openapi::jiff::Timestamp = expiration.parse().unwrap();
    let left = ends.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!(
        (25 * 60..=30 * 60).contains(&left),
        "{expiration}: {left} s left"
    );

    // A pool no controller watches: the token never comes; it says so and prints nothing.
    let other = TestNamespace::create(&admin, "enrol-none").await.unwrap();
    let out = enrolment_kubeconfig(&["--namespace", other.name(), "--timeout", "3s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains(&format!(
            "BootstrapKubeconfig {}/enrolment is not Ready after 3 s",
            other.name()
        )) && stderr.contains("is byoh-controller running and watching"),
        "{stderr}"
    );

    other.cleanup(&admin).await.unwrap();
    pool.cleanup(&admin).await.unwrap();
}
