//! The generated clusterctl artifacts on the real API server: `infrastructure-components.yaml`
//! applies with clusterctl-like `${VAR:=default}` substitution and its CRDs, RBAC and
//! admission policies come up; template specs are immutable except for ClusterClass dry-runs;
//! the cluster templates and the ClusterClass pass the API server's validation (server-side
//! dry-run against CAPI's v1beta2 CRDs); the Deployment runs the binary where both ways of
//! building the image put it.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::byomachine::ByoMachineTemplateResource;
use byoh_api::{ByoMachineSpec, ByoMachineTemplate, ByoMachineTemplateSpec};
use byoh_tests::access::*;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::manifests::{apply_yaml, components_text, config_file, documents, envsubst};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn infrastructure_components_apply_and_come_up() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    let raw = std::fs::read_to_string(config_file("infrastructure-components.yaml")).unwrap();
    // Every variable has a default: clusterctl needs none set. The image is a literal, as
    // clusterctl's image overrides need.
    let image = byoh_controller::manifests::DEFAULT_IMAGE;
    let text = envsubst(&raw, &BTreeMap::from([("BYOH_WATCH_NAMESPACE", "")])).unwrap();
    assert!(!text.contains("${"), "unsubstituted variable left");
    let docs = documents(&text).unwrap();
    assert_eq!(docs.iter().filter(|d| d["kind"] == "Namespace").count(), 1);
    for d in &docs {
        assert_eq!(
            d["metadata"]["labels"]["cluster.x-k8s.io/provider"], "infrastructure-byoh",
            "{} {}",
            d["kind"], d["metadata"]["name"]
        );
    }
    let deployment_doc = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment_doc["spec"]["template"]["spec"]["containers"][0]["image"],
        image
    );
    // Applied with the defaults (other tests of this binary install them concurrently).
    apply_yaml(&admin, &components_text().unwrap(), false)
        .await
        .unwrap();

    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in byoh_api::crds::all() {
        let name = crd.metadata.name.unwrap();
        eventually(
            &format!("CRD {name} established"),
            Duration::from_secs(30),
            || async {
                let c = crds.get(&name).await.ok()?;
                c.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await;
    }
    for name in [
        "byoh-manager",
        "byoh-aggregate-to-capi-manager",
        "byoh-host",
        "byoh-bootstrapper",
    ] {
        Api::<ClusterRole>::all(admin.clone())
            .get(name)
            .await
            .unwrap();
    }
    for name in ["byoh-manager", "byoh-host", "byoh-bootstrapper"] {
        Api::<ClusterRoleBinding>::all(admin.clone())
            .get(name)
            .await
            .unwrap();
    }
    let aggregate = Api::<ClusterRole>::all(admin.clone())
        .get("byoh-aggregate-to-capi-manager")
        .await
        .unwrap();
    assert_eq!(
        aggregate.metadata.labels.unwrap()["cluster.x-k8s.io/aggregate-to-manager"],
        "true"
    );
    for name in [
        "byoh-host-restriction",
        "byoh-host-lease-restriction",
        "byoh-template-immutability",
    ] {
        let policy = Api::<ValidatingAdmissionPolicy>::all(admin.clone())
            .get(name)
            .await
            .unwrap();
        // The API server type-checked the CEL against the CRD schemas: no warnings.
        let warnings = eventually(
            &format!("{name} type-checked"),
            Duration::from_secs(30),
            || async {
                let p = Api::<ValidatingAdmissionPolicy>::all(admin.clone())
                    .get(name)
                    .await
                    .ok()?;
                p.status?
                    .type_checking
                    .map(|t| t.expression_warnings.unwrap_or_default())
            },
        )
        .await;
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
        assert_eq!(policy.spec.unwrap().failure_policy.as_deref(), Some("Fail"));
        Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
            .get(name)
            .await
            .unwrap();
    }
    let deployment = Api::<Deployment>::namespaced(admin.clone(), "byoh-system")
        .get("byoh-controller-manager")
        .await
        .unwrap();
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    assert_eq!(container.name, "manager");
    assert_eq!(
        container.image.as_deref(),
        Some(byoh_controller::manifests::DEFAULT_IMAGE)
    );
    // BYOH_WATCH_NAMESPACE defaults to `""` (clusterctl refuses an empty default as unset);
    // the controller reads `""` as all namespaces (unit test in controller/src/cli.rs).
    let args = container.args.as_ref().unwrap();
    assert!(args.contains(&"--namespace=\"\"".to_string()), "{args:?}");
    use clap::Parser as _;
    let cli = byoh_controller::cli::Cli::try_parse_from(
        std::iter::once("byoh-controller").chain(args.iter().map(String::as_str)),
    )
    .unwrap();
    let byoh_controller::cli::Command::Run(run) = cli.command else {
        panic!("the Deployment does not run `byoh-controller run`: {args:?}");
    };
    assert_eq!(run.namespace, "", "all namespaces by default");
}

fn template(name: &str) -> ByoMachineTemplate {
    ByoMachineTemplate::new(
        name,
        ByoMachineTemplateSpec {
            template: ByoMachineTemplateResource {
                metadata: None,
                spec: ByoMachineSpec::default(),
            },
        },
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn template_specs_are_immutable_except_for_clusterclass_dry_runs() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "template-immutability")
        .await
        .unwrap();
    let templates: Api<ByoMachineTemplate> = Api::namespaced(admin.clone(), ns.name());
    templates
        .create(&PostParams::default(), &template("t"))
        .await
        .unwrap();
    let change_spec = json!({ "spec": { "template": { "spec": {
        "selector": { "matchLabels": { "site": "lab" } }
    } } } });
    let status = eventually(
        "the spec update to be denied",
        Duration::from_secs(30),
        || async {
            match templates
                .patch("t", &PatchParams::default(), &Patch::Merge(&change_spec))
                .await
            {
                Err(kube::Error::Api(s)) => Some(s),
                Ok(_) => {
                    // Not enforced yet: put the spec back and retry.
                    let back = json!({ "spec": { "template": { "spec": { "selector": null } } } });
                    templates
                        .patch("t", &PatchParams::default(), &Patch::Merge(&back))
                        .await
                        .ok();
                    None
                }
                Err(e) => panic!("patch: {e}"),
            }
        },
    )
    .await;
    assert!(status.message.contains("is immutable"), "{status:?}");

    // Metadata changes are fine.
    templates
        .patch(
            "t",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "owner": "team-a" } } })),
        )
        .await
        .unwrap();
    // The ClusterClass annotation alone exempts nothing: anyone who may update a template could
    // add it. Cluster API exempts a request only when it is a dry run *and* carries it.
    let annotated = json!({
        "metadata": { "annotations": { byoh_api::labels::TOPOLOGY_DRY_RUN: "" } },
        "spec": { "template": { "spec": { "selector": { "matchLabels": { "site": "lab" } } } } }
    });
    let denied = templates
        .patch("t", &PatchParams::default(), &Patch::Merge(&annotated))
        .await
        .expect_err("an annotated spec change that is not a dry run must be refused");
    assert!(
        matches!(&denied, kube::Error::Api(s) if s.message.contains("is immutable")),
        "{denied:?}"
    );
    let kept = templates.get("t").await.unwrap();
    assert!(
        kept.spec.template.spec.selector.is_none(),
        "the refused update changed the template: {:?}",
        kept.spec
    );
    // A dry run without the annotation is refused too.
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    templates
        .patch("t", &dry, &Patch::Merge(&change_spec))
        .await
        .expect_err("a dry run without the ClusterClass annotation must be refused");
    // A ClusterClass dry-run (a dry run whose object carries the annotation) may change the spec.
    templates
        .patch("t", &dry, &Patch::Merge(&annotated))
        .await
        .unwrap();
    ns.cleanup(&admin).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_templates_and_clusterclass_pass_api_validation() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "cluster-templates")
        .await
        .unwrap();
    let vars = BTreeMap::from([
        ("CLUSTER_NAME", "c1"),
        ("NAMESPACE", ns.name()),
        ("KUBERNETES_VERSION", "v1.36.1"),
        ("CONTROL_PLANE_MACHINE_COUNT", "1"),
        ("WORKER_MACHINE_COUNT", "2"),
        ("CONTROL_PLANE_ENDPOINT_IP", "192.0.2.10"),
    ]);
    for file in [
        "templates/cluster-template.yaml",
        "templates/cluster-template-topology.yaml",
        "templates/clusterclass-byoh-quickstart.yaml",
    ] {
        let raw = std::fs::read_to_string(config_file(file)).unwrap();
        let text = envsubst(&raw, &vars).unwrap();
        for doc in documents(&text).unwrap() {
            assert_eq!(doc["metadata"]["namespace"], ns.name(), "{file}");
        }
        apply_yaml(&admin, &text, true)
            .await
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
    }
    ns.cleanup(&admin).await.unwrap();
}

/// The Deployment's `command` names the binary where both images have it: `controller/Dockerfile`
/// (its COPY and ENTRYPOINT) and `packaging/build-image` (its install and `--config.entrypoint`;
/// tests/tests/packages.rs checks the built archive's Entrypoint against the Deployment too).
/// They disagreed once (`/byoh-controller` in the Dockerfile, issue 44): such a Deployment
/// never starts.
#[test]
fn the_deployment_runs_the_binary_where_both_images_put_it() {
    let docs = documents(&components_text().unwrap()).unwrap();
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let command = deployment["spec"]["template"]["spec"]["containers"][0]["command"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(command.starts_with('/'), "{command}");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dockerfile = std::fs::read_to_string(repo.join("controller/Dockerfile")).unwrap();
    let entrypoint = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .unwrap();
    let entrypoint: Vec<String> = serde_json::from_str(entrypoint).unwrap();
    assert_eq!(
        entrypoint,
        std::slice::from_ref(&command),
        "Dockerfile ENTRYPOINT"
    );
    let copy = dockerfile
        .lines()
        .find(|l| l.starts_with("COPY --from=build"))
        .unwrap();
    assert!(copy.ends_with(&format!(" {command}")), "Dockerfile: {copy}");
    let build_image = std::fs::read_to_string(repo.join("packaging/build-image")).unwrap();
    assert!(
        build_image.contains(&format!("--config.entrypoint {command}")),
        "packaging/build-image's entrypoint is not {command}"
    );
    assert!(
        build_image.contains(&format!("\"$rootfs{command}\"")),
        "packaging/build-image does not install the binary at {command}"
    );
}
