//! The BootstrapKubeconfig reconciler on the real API server, in-process as the controller's
//! ServiceAccount: a BootstrapKubeconfig yields a bootstrap token Secret and a kubeconfig
//! Secret; that kubeconfig authenticates as `system:bootstrap:<id>` in
//! `system:bootstrappers:byoh`, files a CSR that the approver approves and the signer signs;
//! the token is nowhere in status; deleting the object deletes the token Secret.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::{BootstrapKubeconfig, BootstrapKubeconfigSpec};
use byoh_controller::bootstrapkubeconfig::{self, BootstrapKubeconfigOptions};
use byoh_controller::csr::{self, CsrOptions};
use byoh_tests::access::*;
use byoh_tests::control_plane::{self, TestNamespace};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use std::time::Duration;

/// `(server, base64 CA)` of the admin kubeconfig.
fn server_and_ca() -> (String, String) {
    use base64::Engine as _;
    let path = control_plane::kubeconfig_path().unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cluster = kc.clusters[0].cluster.clone().unwrap();
    let ca = match (
        cluster.certificate_authority_data,
        cluster.certificate_authority,
    ) {
        (Some(d), _) => d,
        (None, Some(f)) => base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(path.parent().unwrap().join(f)).unwrap()),
        (None, None) => panic!("admin kubeconfig has no CA"),
    };
    (cluster.server.unwrap(), ca)
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_kubeconfig_issues_a_working_token_and_cleans_it_up() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "bootstrap-kubeconfig")
        .await
        .unwrap();
    let sa = controller_client().await.unwrap();
    let reconciler = tokio::spawn(bootstrapkubeconfig::run(
        sa.clone(),
        BootstrapKubeconfigOptions {
            namespace: Some(ns.name().into()),
        },
    ));
    let approver = tokio::spawn(csr::run(sa, CsrOptions::default()));

    let (server, ca) = server_and_ca();
    let bks: Api<BootstrapKubeconfig> = Api::namespaced(admin.clone(), ns.name());
    let bk = BootstrapKubeconfig::new(
        "pool",
        BootstrapKubeconfigSpec {
            api_server: server,
            certificate_authority_data: ca,
            ttl_seconds: Some(1800),
            renew: true,
        },
    );
    bks.create(&PostParams::default(), &bk).await.unwrap();

    let ready = eventually(
        "BootstrapKubeconfig Ready",
        Duration::from_secs(30),
        || async {
            bks.get("pool").await.ok().filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| byoh_api::conditions::is_true(&s.conditions, "Ready"))
            })
        },
    )
    .await;
    assert!(
        ready
            .metadata
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .contains(&byoh_api::finalizers::BOOTSTRAP_KUBECONFIG.to_string())
    );
    let status = ready.status.clone().unwrap();
    let id = status.token_id.clone().unwrap();
    assert_eq!(id.len(), 6);
    let expires = status.expiration_time.clone().unwrap().0;
    let lifetime = expires.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!((1700..=1800).contains(&lifetime), "{lifetime}");

    // The token Secret in kube-system.
    let system_secrets: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
    let token_secret = system_secrets
        .get(&format!("bootstrap-token-{id}"))
        .await
        .unwrap();
    assert_eq!(
        token_secret.type_.as_deref(),
        Some("bootstrap.kubernetes.io/token")
    );
    let data = token_secret.data.clone().unwrap();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    assert_eq!(text("token-id"), id);
    assert_eq!(text("token-secret").len(), 16);
    assert_eq!(text("usage-bootstrap-authentication"), "true");
    assert_eq!(text("auth-extra-groups"), "system:bootstrappers:byoh");
    assert!(text("description").contains(&format!("{}/pool", ns.name())));
    assert_eq!(
        token_secret.metadata.labels.unwrap()[bootstrapkubeconfig::TOKEN_OWNER_LABEL],
        ready.metadata.uid.clone().unwrap()
    );
    let secret_half = text("token-secret");
    // The token is not in status.
    assert!(
        !serde_json::to_string(&ready)
            .unwrap()
            .contains(&secret_half)
    );

    // The kubeconfig Secret, owned by the BootstrapKubeconfig.
    let kc_name = status.kubeconfig_secret_ref.unwrap().name;
    let kc_secret = Api::<Secret>::namespaced(admin.clone(), ns.name())
        .get(&kc_name)
        .await
        .unwrap();
    let owner = &kc_secret.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("BootstrapKubeconfig", "pool")
    );
    let kubeconfig_text =
        String::from_utf8(kc_secret.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    assert!(kubeconfig_text.contains(&format!("{id}.{secret_half}")));

    // The kubeconfig authenticates as the bootstrap token and may file a CSR, which the
    // approver approves.
    let kc: kube::config::Kubeconfig = serde_yaml_ng::from_str(&kubeconfig_text).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    let as_bootstrapper = kube::Client::try_from(config).unwrap();
    byoh_tests::agent::wait_authenticates(&admin, &format!("{id}.{secret_half}"))
        .await
        .unwrap();
    let (user, groups) = whoami(&as_bootstrapper).await.unwrap();
    assert_eq!(user, format!("system:bootstrap:{id}"));
    assert!(
        groups.iter().any(|g| g == "system:bootstrappers:byoh"),
        "{groups:?}"
    );
    let host = format!("bk-{}", random_lower(6));
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("byoh:host:{host}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "byoh:hosts");
    let csr_name = format!("byoh-{host}-{}", random_lower(6));
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(csr_name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(
                params
                    .serialize_request(&key)
                    .unwrap()
                    .pem()
                    .unwrap()
                    .into_bytes(),
            ),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            expiration_seconds: Some(7200),
            ..Default::default()
        },
        status: None,
    };
    Api::<CertificateSigningRequest>::all(as_bootstrapper.clone())
        .create(&PostParams::default(), &csr)
        .await
        .unwrap();
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    eventually(
        "the bootstrap CSR signed",
        Duration::from_secs(60),
        || async {
            csrs.get(&csr_name)
                .await
                .ok()?
                .status?
                .certificate
                .filter(|c| !c.0.is_empty())
        },
    )
    .await;
    // A bootstrap token can do nothing else: reading Secrets is forbidden.
    let status = refused(
        "bootstrapper reading the kubeconfig Secret",
        Api::<Secret>::namespaced(as_bootstrapper.clone(), ns.name())
            .get(&kc_name)
            .await,
    );
    assert_eq!(status.code, 403);

    // Deleting the BootstrapKubeconfig deletes the token Secret (finalizer).
    bks.delete("pool", &DeleteParams::default()).await.unwrap();
    eventually(
        "the token Secret and the BootstrapKubeconfig gone",
        Duration::from_secs(30),
        || async {
            let token_gone = matches!(
                system_secrets.get(&format!("bootstrap-token-{id}")).await,
                Err(kube::Error::Api(s)) if s.code == 404
            );
            let bk_gone =
                matches!(bks.get("pool").await, Err(kube::Error::Api(s)) if s.code == 404);
            (token_gone && bk_gone).then_some(())
        },
    )
    .await;

    reconciler.abort();
    approver.abort();
    let _ = csrs.delete(&csr_name, &DeleteParams::default()).await;
    ns.cleanup(&admin).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_token_is_renewed_when_asked() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "bootstrap-kubeconfig-renew")
        .await
        .unwrap();
    let reconciler = tokio::spawn(bootstrapkubeconfig::run(
        controller_client().await.unwrap(),
        BootstrapKubeconfigOptions {
            namespace: Some(ns.name().into()),
        },
    ));
    let (server, ca) = server_and_ca();
    let bks: Api<BootstrapKubeconfig> = Api::namespaced(admin.clone(), ns.name());
    let bk = BootstrapKubeconfig::new(
        "short",
        BootstrapKubeconfigSpec {
            api_server: server,
            certificate_authority_data: ca,
            ttl_seconds: Some(60), // the shortest the CRD allows
            renew: true,
        },
    );
    bks.create(&PostParams::default(), &bk).await.unwrap();
    let token_id = |b: &BootstrapKubeconfig| {
        b.status
            .as_ref()
            .filter(|s| byoh_api::conditions::is_true(&s.conditions, "Ready"))
            .and_then(|s| s.token_id.clone())
    };
    let first = eventually("the first token", Duration::from_secs(30), || async {
        token_id(&bks.get("short").await.ok()?)
    })
    .await;
    let second = eventually("a renewed token", Duration::from_secs(120), || async {
        token_id(&bks.get("short").await.ok()?).filter(|id| *id != first)
    })
    .await;
    let system_secrets: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
    let new_secret = system_secrets
        .get(&format!("bootstrap-token-{second}"))
        .await
        .unwrap();
    let secret_half =
        String::from_utf8(new_secret.data.unwrap()["token-secret"].0.clone()).unwrap();
    eventually(
        "the expired token Secret deleted",
        Duration::from_secs(30),
        || async {
            matches!(
                system_secrets.get(&format!("bootstrap-token-{first}")).await,
                Err(kube::Error::Api(s)) if s.code == 404
            )
            .then_some(())
        },
    )
    .await;
    let kc = Api::<Secret>::namespaced(admin.clone(), ns.name())
        .get(&bootstrapkubeconfig::kubeconfig_secret_name("short"))
        .await
        .unwrap();
    let text = String::from_utf8(kc.data.unwrap()["kubeconfig"].0.clone()).unwrap();
    assert!(text.contains(&format!("{second}.{secret_half}")));

    bks.delete("short", &DeleteParams::default()).await.unwrap();
    eventually(
        "the renewed token Secret deleted",
        Duration::from_secs(30),
        || async {
            matches!(
                system_secrets.get(&format!("bootstrap-token-{second}")).await,
                Err(kube::Error::Api(s)) if s.code == 404
            )
            .then_some(())
        },
    )
    .await;
    reconciler.abort();
    ns.cleanup(&admin).await.unwrap();
}
