//! The test control plane is a real one: server-side apply of our CRDs, optimistic concurrency,
//! CAPI v1beta2 objects, garbage collection by kube-controller-manager, CSR signing by the
//! cluster CA, bootstrap tokens (authentication and clean-up) and ValidatingAdmissionPolicy.
//! Each test works in its own namespace.

#![allow(clippy::expect_used)] // test code: a panic is the failure report

use byoh_api::{ByoCluster, ByoClusterSpec, ByoHost, ByoHostSpec, ByoMachine, ByoMachineSpec};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::eventually;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

fn is_not_found<T>(r: &Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 404)
}

fn capi(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind))
}

#[tokio::test]
async fn our_crds_apply_server_side_and_are_established() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../controller/config/crd");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read controller/config/crd") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read CRD");
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).expect("parse CRD");
        let name = crd.name_any();
        // `up` applied the same files with another field manager; force takes over the fields.
        let pp = PatchParams::apply("byoh-tests").force();
        let applied = crds
            .patch(&name, &pp, &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("server-side apply of {}: {e}", path.display()));
        let managers: Vec<_> = applied
            .managed_fields()
            .iter()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(managers.iter().any(|m| m == "byoh-tests"), "{managers:?}");
        names.push(name);
    }
    assert_eq!(names.len(), 10, "CRDs in {}: {names:?}", dir.display());
    for name in names {
        eventually(
            &format!("CRD {name} Established"),
            Duration::from_secs(30),
            || async {
                let crd = crds.get(&name).await.ok()?;
                let established = crd
                    .status?
                    .conditions?
                    .into_iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            },
        )
        .await;
    }
}

#[tokio::test]
async fn byohost_create_read_update_conflict_delete() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "byohost-crud")
        .await
        .expect("namespace");
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());

    let created = hosts
        .create(
            &PostParams::default(),
            &ByoHost::new("worker-01", ByoHostSpec::default()),
        )
        .await
        .expect("create ByoHost");
    let first_version = created.resource_version().expect("resourceVersion");
    let mut read = hosts.get("worker-01").await.expect("get ByoHost");
    assert_eq!(read.spec, ByoHostSpec::default());
    assert_eq!(read.uid(), created.uid());

    read.labels_mut().insert("site".into(), "apac".into());
    let updated = hosts
        .replace("worker-01", &PostParams::default(), &read)
        .await
        .expect("update ByoHost with its current resourceVersion");
    assert_eq!(
        updated.labels().get("site").map(String::as_str),
        Some("apac")
    );
    assert_ne!(updated.resource_version(), Some(first_version));

    // An update based on the first read (stale resourceVersion) loses: 409 Conflict.
    let mut stale = created.clone();
    stale.labels_mut().insert("site".into(), "emea".into());
    match hosts
        .replace("worker-01", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("stale update must be a 409 Conflict, got {other:?}"),
    }
    let now = hosts.get("worker-01").await.expect("get ByoHost");
    assert_eq!(now.labels().get("site").map(String::as_str), Some("apac"));

    hosts
        .delete("worker-01", &DeleteParams::default())
        .await
        .expect("delete ByoHost");
    eventually("ByoHost gone", Duration::from_secs(30), || async {
        is_not_found(&hosts.get("worker-01").await).then_some(())
    })
    .await;
    ns.cleanup(&client).await.expect("cleanup");
}

#[tokio::test]
async fn capi_v1beta2_cluster_and_machine_reference_byo_objects() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "capi-objects")
        .await
        .expect("namespace");
    let pp = PostParams::default();
    Api::<ByoCluster>::namespaced(client.clone(), ns.name())
        .create(&pp, &ByoCluster::new("c1", ByoClusterSpec::default()))
        .await
        .expect("create ByoCluster");
    Api::<ByoMachine>::namespaced(client.clone(), ns.name())
        .create(&pp, &ByoMachine::new("c1-m1", ByoMachineSpec::default()))
        .await
        .expect("create ByoMachine");

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns.name(), &capi("Cluster"));
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": "c1" },
        "spec": {
            "infrastructureRef": {
                "apiGroup": byoh_api::GROUP, "kind": "ByoCluster", "name": "c1"
            }
        }
    }))
    .expect("Cluster JSON");
    clusters
        .create(&pp, &cluster)
        .await
        .expect("create Cluster");

    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns.name(), &capi("Machine"));
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": { "name": "c1-m1", "labels": { "cluster.x-k8s.io/cluster-name": "c1" } },
        "spec": {
            "clusterName": "c1",
            "bootstrap": { "dataSecretName": "c1-m1-bootstrap" },
            "infrastructureRef": {
                "apiGroup": byoh_api::GROUP, "kind": "ByoMachine", "name": "c1-m1"
            }
        }
    }))
    .expect("Machine JSON");
    machines
        .create(&pp, &machine)
        .await
        .expect("create Machine");

    let read = machines.get("c1-m1").await.expect("get Machine");
    assert_eq!(read.data["spec"]["infrastructureRef"]["kind"], "ByoMachine");
    assert_eq!(read.data["spec"]["clusterName"], "c1");
    let read = clusters.get("c1").await.expect("get Cluster");
    assert_eq!(read.data["spec"]["infrastructureRef"]["name"], "c1");

    // The v1beta2 schema is enforced: a Machine without clusterName is refused (422).
    let mut invalid = machine.clone();
    invalid.metadata.name = Some("c1-m2".into());
    if let Some(spec) = invalid.data["spec"].as_object_mut() {
        spec.remove("clusterName");
    }
    match machines.create(&pp, &invalid).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{s:?}"),
        other => panic!("a Machine without spec.clusterName must be invalid, got {other:?}"),
    }
    ns.cleanup(&client).await.expect("cleanup");
}

#[tokio::test]
async fn dependents_are_garbage_collected_after_their_owner() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "garbage-collection")
        .await
        .expect("namespace");
    let machines: Api<ByoMachine> = Api::namespaced(client.clone(), ns.name());
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let owner = machines
        .create(
            &PostParams::default(),
            &ByoMachine::new("m1", ByoMachineSpec::default()),
        )
        .await
        .expect("create ByoMachine");
    let owner_ref = OwnerReference {
        api_version: ByoMachine::api_version(&()).into_owned(),
        kind: ByoMachine::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().expect("uid"),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("m1-data".into());
    cm.metadata.owner_references = Some(vec![owner_ref]);
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .expect("create owned ConfigMap");

    // Foreground: the garbage collector deletes the dependent first, then the owner.
    machines
        .delete("m1", &DeleteParams::foreground())
        .await
        .expect("delete ByoMachine");
    eventually(
        "owned ConfigMap deleted by the garbage collector",
        Duration::from_secs(90),
        || async { is_not_found(&configmaps.get("m1-data").await).then_some(()) },
    )
    .await;
    eventually(
        "ByoMachine gone after its dependents",
        Duration::from_secs(30),
        || async { is_not_found(&machines.get("m1").await).then_some(()) },
    )
    .await;
    ns.cleanup(&client).await.expect("cleanup");
}

#[tokio::test]
async fn csr_for_kube_apiserver_client_is_approved_signed_and_authenticates() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let user = format!(
        "byoh-test-csr-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    );
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key");
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user.as_str());
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "byoh-testers");
    let request_pem = params
        .serialize_request(&key)
        .expect("CSR")
        .pem()
        .expect("CSR PEM");

    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(request_pem.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            expiration_seconds: Some(600),
            ..CertificateSigningRequestSpec::default()
        },
        ..CertificateSigningRequest::default()
    };
    csr.metadata.name = Some(user.clone());
    let created = csrs
        .create(&PostParams::default(), &csr)
        .await
        .expect("create CSR");

    // Approve as the admin, through the approval subresource.
    let mut approved = created.clone();
    approved.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("ByohTest".into()),
            message: Some("approved by the control-plane test".into()),
            ..CertificateSigningRequestCondition::default()
        }]),
        ..CertificateSigningRequestStatus::default()
    });
    csrs.replace_subresource("approval", &user, &PostParams::default(), &approved)
        .await
        .expect("approve CSR");

    // kube-controller-manager signs it with the cluster CA.
    let certificate = eventually(
        "status.certificate of the approved CSR",
        Duration::from_secs(60),
        || async {
            let csr = csrs.get(&user).await.ok()?;
            csr.status?.certificate.filter(|c| !c.0.is_empty())
        },
    )
    .await;
    let pem = String::from_utf8(certificate.0.clone()).expect("PEM text");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");

    // The signed certificate authenticates as the requested user.
    let path = control_plane::kubeconfig_path().expect("kubeconfig path");
    let mut kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    // ByteString serializes as base64, the encoding kubeconfig's *-data fields use.
    let b64 = |bytes: Vec<u8>| -> String {
        serde_json::from_value(serde_json::to_value(ByteString(bytes)).expect("base64"))
            .expect("base64 string")
    };
    for named in &mut kubeconfig.auth_infos {
        let auth = named.auth_info.get_or_insert_default();
        auth.client_certificate_data = Some(b64(certificate.0.clone()));
        auth.client_key_data = Some(b64(key.serialize_pem().into_bytes()).into());
    }
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("config with the signed certificate");
    let as_user = Client::try_from(config).expect("client");
    let review = Api::<SelfSubjectReview>::all(as_user)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview with the signed certificate");
    let info = review.status.and_then(|s| s.user_info).expect("userInfo");
    assert_eq!(info.username.as_deref(), Some(user.as_str()));
    assert!(
        info.groups
            .unwrap_or_default()
            .iter()
            .any(|g| g == "byoh-testers"),
        "groups from O="
    );
    csrs.delete(&user, &DeleteParams::default())
        .await
        .expect("delete CSR");
}

/// A random lower-case hex string of `len` (at most 16) characters.
fn random_hex(len: usize) -> String {
    use std::hash::BuildHasher as _;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos();
    let h = std::collections::hash_map::RandomState::new().hash_one(nanos);
    format!("{h:016x}")[..len].to_string()
}

/// A bootstrap token Secret (`kube-system/bootstrap-token-<id>`), as `kubeadm token create`
/// makes it; see <https://kubernetes.io/docs/reference/access-authn-authz/bootstrap-tokens/>.
fn bootstrap_token_secret(id: &str, secret: &str, expiration: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": { "name": format!("bootstrap-token-{id}"), "namespace": "kube-system" },
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": secret,
            "expiration": expiration,
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": "system:bootstrappers:byoh-test",
        }
    }))
    .expect("bootstrap token Secret JSON")
}

#[tokio::test]
async fn bootstrap_tokens_authenticate_and_expired_ones_are_cleaned_up() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let (id, secret) = (random_hex(6), random_hex(16));
    secrets
        .create(
            &PostParams::default(),
            &bootstrap_token_secret(&id, &secret, "2099-01-01T00:00:00Z"),
        )
        .await
        .expect("create bootstrap token");

    let path = control_plane::kubeconfig_path().expect("kubeconfig path");
    let mut config = control_plane::config_from(&path).await.expect("config");
    config.auth_info = kube::config::AuthInfo {
        token: Some(format!("{id}.{secret}").into()),
        ..kube::config::AuthInfo::default()
    };
    let as_bootstrapper = Client::try_from(config).expect("client");
    byoh_tests::agent::wait_authenticates(&client, &format!("{id}.{secret}"))
        .await
        .expect("the bootstrap token authenticates");
    let review = Api::<SelfSubjectReview>::all(as_bootstrapper)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview with the bootstrap token");
    let info = review.status.and_then(|s| s.user_info).expect("userInfo");
    assert_eq!(info.username, Some(format!("system:bootstrap:{id}")));
    let groups = info.groups.unwrap_or_default();
    for group in ["system:bootstrappers", "system:bootstrappers:byoh-test"] {
        assert!(groups.iter().any(|g| g == group), "{group} in {groups:?}");
    }
    secrets
        .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
        .await
        .expect("delete bootstrap token");

    // The tokencleaner controller deletes expired tokens.
    let expired = random_hex(6);
    let name = format!("bootstrap-token-{expired}");
    secrets
        .create(
            &PostParams::default(),
            &bootstrap_token_secret(&expired, &random_hex(16), "2000-01-01T00:00:00Z"),
        )
        .await
        .expect("create expired bootstrap token");
    eventually(
        "expired bootstrap token deleted by tokencleaner",
        Duration::from_secs(60),
        || async { is_not_found(&secrets.get(&name).await).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn validating_admission_policies_are_enforced() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "admission-policy")
        .await
        .expect("namespace");
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": { "name": ns.name() },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"]
            }]},
            "validations": [{
                "expression": "!has(object.data) || !('forbidden' in object.data)",
                "message": "key 'forbidden' is not allowed"
            }]
        }
    }))
    .expect("policy JSON");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": { "name": ns.name() },
        "spec": {
            "policyName": ns.name(),
            "validationActions": ["Deny"],
            "matchResources": { "namespaceSelector": {
                "matchLabels": { "kubernetes.io/metadata.name": ns.name() }
            }}
        }
    }))
    .expect("binding JSON");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let pp = PostParams::default();
    policies.create(&pp, &policy).await.expect("create policy");
    bindings
        .create(&pp, &binding)
        .await
        .expect("create binding");

    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns.name());
    let configmap = |name: &str, key: &str| -> ConfigMap {
        serde_json::from_value(json!({ "metadata": { "name": name }, "data": { key: "x" } }))
            .expect("ConfigMap JSON")
    };
    // Policies take effect shortly after they are created: retry until the denial shows.
    let denial = eventually(
        "the policy to deny a ConfigMap",
        Duration::from_secs(30),
        || async {
            match configmaps
                .create(&pp, &configmap("denied", "forbidden"))
                .await
            {
                Err(kube::Error::Api(s)) => Some(s),
                Ok(_) => {
                    let _ = configmaps.delete("denied", &DeleteParams::default()).await;
                    None
                }
                Err(e) => panic!("create ConfigMap: {e}"),
            }
        },
    )
    .await;
    assert!(
        denial.message.contains("key 'forbidden' is not allowed"),
        "{denial:?}"
    );
    configmaps
        .create(&pp, &configmap("allowed", "fine"))
        .await
        .expect("a ConfigMap the policy allows");

    bindings
        .delete(ns.name(), &DeleteParams::default())
        .await
        .expect("delete binding");
    policies
        .delete(ns.name(), &DeleteParams::default())
        .await
        .expect("delete policy");
    ns.cleanup(&client).await.expect("cleanup");
}

#[tokio::test]
async fn test_namespace_is_deleted_when_dropped() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "dropped")
        .await
        .expect("namespace");
    let name = ns.name().to_string();
    assert!(name.starts_with("t-dropped-"), "{name}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let created = namespaces.get(&name).await.expect("get namespace");
    assert_eq!(
        created
            .labels()
            .get(control_plane::NAMESPACE_LABEL)
            .map(String::as_str),
        Some("true")
    );
    drop(ns);
    // Deleted means terminating (its contents are being finalized) or already gone.
    match namespaces.get(&name).await {
        Ok(ns) => assert!(
            ns.metadata.deletion_timestamp.is_some(),
            "{name} not deleted"
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("get namespace {name}: {e}"),
    }
}
