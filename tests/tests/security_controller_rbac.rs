//! The controller's privileges cut to what it uses (issue 43, item 5), as the real API server
//! enforces the generated RBAC on the controller's ServiceAccount: it may create and update
//! Leases in the provider's namespace (its leader Lease; the hosts' are read there), and in no
//! other namespace — not kube-scheduler's or kube-controller-manager's leader Lease in
//! `kube-system`, which a Lease right of the ClusterRole gave it before.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_controller::manifests;
use byoh_tests::access::{self, controller_client};
use byoh_tests::control_plane;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

fn lease(name: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_controller_takes_leases_only_in_the_providers_namespace() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    access::install_components(&admin).await.unwrap();
    let controller = controller_client().await.unwrap();
    let name = format!("byoh-test-rbac-{}", std::process::id());

    let own: Api<Lease> = Api::namespaced(controller.clone(), manifests::NAMESPACE);
    own.create(&PostParams::default(), &lease(&name))
        .await
        .unwrap();
    own.list(&Default::default()).await.unwrap();
    own.delete(&name, &DeleteParams::default())
        .await
        .expect_err("the controller deletes no Lease");
    Api::<Lease>::namespaced(admin.clone(), manifests::NAMESPACE)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();

    for ns in ["kube-system", "default"] {
        let other: Api<Lease> = Api::namespaced(controller.clone(), ns);
        let refused = other
            .create(&PostParams::default(), &lease(&name))
            .await
            .unwrap_err();
        assert!(
            byoh_api::apierror::is_forbidden(&refused),
            "{ns}: {refused}"
        );
        assert!(
            byoh_api::apierror::is_forbidden(&other.get("kube-scheduler").await.unwrap_err()),
            "{ns}: the controller reads no other Lease"
        );
    }
}
