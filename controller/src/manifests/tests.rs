use super::*;

#[test]
fn the_controllers_namespace_is_never_a_host_pool() {
    // Its leader-election Lease must be out of every host's reach (admission.rs).
    assert!(byoh_api::labels::RESERVED_NAMESPACES.contains(&NAMESPACE));
}

#[test]
fn writes_one_file_per_crd_that_parses_back() {
    let dir = tempfile::tempdir().unwrap();
    let paths = write_crds(dir.path()).unwrap();
    assert_eq!(paths.len(), 10);
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(GENERATED_HEADER));
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(crd.spec.group, byoh_api::GROUP);
    }
}

fn objects(text: &str) -> Vec<serde_json::Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect()
}

#[test]
fn components_follow_the_clusterctl_contract() {
    let objs = objects(&infrastructure_components().unwrap());
    let namespaces: Vec<_> = objs.iter().filter(|o| o["kind"] == "Namespace").collect();
    assert_eq!(namespaces.len(), 1);
    assert_eq!(namespaces[0]["metadata"]["name"], NAMESPACE);
    for o in &objs {
        assert_eq!(
            o["metadata"]["labels"][labels::PROVIDER],
            labels::PROVIDER_NAME,
            "{} {}",
            o["kind"],
            o["metadata"]["name"]
        );
        if let Some(ns) = o["metadata"]["namespace"].as_str() {
            assert_eq!(ns, NAMESPACE);
        }
    }
    let deployment = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "manager");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--namespace=${BYOH_WATCH_NAMESPACE:=\"\"}"));
    // Every variable with its default, as the header lists it.
    let text = serde_json::to_string(container).unwrap();
    for (name, default, _) in COMPONENT_VARIABLES {
        let default = if default.is_empty() {
            "\\\"\\\""
        } else {
            default
        };
        assert!(text.contains(&format!("${{{name}:={default}}}")), "{name}");
    }
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        objs.iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .count(),
        10
    );
}

#[test]
fn manager_role_cannot_list_secrets_or_escalate() {
    for r in manager_cluster_role().rules.unwrap() {
        let resources = r.resources.unwrap_or_default();
        assert!(
            !r.verbs
                .iter()
                .any(|v| v == "*" || v == "escalate" || v == "bind")
        );
        if resources.iter().any(|x| x == "secrets") {
            assert!(!r.verbs.iter().any(|v| v == "list" || v == "watch"));
        }
    }
}

#[test]
fn templates_use_the_contract_variables_and_no_provider_id() {
    for var in TEMPLATE_VARIABLES {
        assert!(CLUSTER_TEMPLATE.contains(&format!("${{{var}}}")), "{var}");
    }
    for t in [
        CLUSTER_TEMPLATE,
        CLUSTER_TEMPLATE_TOPOLOGY,
        CLUSTERCLASS_QUICKSTART,
    ] {
        assert!(!t.contains("name: provider-id") && !t.contains("provider-id:"));
        assert_eq!(objects(t).len(), t.matches("\nkind: ").count());
    }
}

#[test]
fn write_all_writes_every_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_all(dir.path()).unwrap();
    for f in [
        "infrastructure-components.yaml",
        "metadata.yaml",
        "templates/cluster-template.yaml",
        "templates/cluster-template-topology.yaml",
        "templates/clusterclass-byoh-quickstart.yaml",
        "rbac/manager_role.yaml",
        "admission/byoh-host-restriction.yaml",
        "optional/metrics-servicemonitor.yaml",
    ] {
        assert!(written.contains(&dir.path().join(f)), "{f}");
    }
    let meta: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(dir.path().join("metadata.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(meta["releaseSeries"][0]["contract"], "v1beta2");
}

/// RBAC lets the controller grant only what it holds: every (group, resource, verb) of a
/// host Role must be in the manager ClusterRole without a name restriction.
#[test]
fn manager_role_holds_everything_it_grants_to_hosts() {
    use byoh_api::byohost::{HostClaim, MachineReference};
    use byoh_api::common::{LocalObjectReference, TypedLocalObjectReference};
    let mut host = byoh_api::ByoHost::new("a", Default::default());
    host.spec.claim = Some(HostClaim {
        machine_ref: MachineReference::default(),
        cluster_name: "c".into(),
        bootstrap_secret_ref: LocalObjectReference { name: "s".into() },
        installer_ref: Some(TypedLocalObjectReference {
            api_group: byoh_api::GROUP.into(),
            kind: "K8sInstallerConfig".into(),
            name: "i".into(),
        }),
        provider_id: "byoh://a/x".into(),
        ..Default::default()
    });
    let manager = manager_cluster_role().rules.unwrap();
    for rule in hostaccess::host_rules(&host) {
        for group in rule.api_groups.clone().unwrap() {
            for resource in rule.resources.clone().unwrap() {
                for verb in &rule.verbs {
                    assert!(
                        manager.iter().any(|m| m.resource_names.is_none()
                            && m.api_groups.as_ref().unwrap().contains(&group)
                            && m.resources.as_ref().unwrap().contains(&resource)
                            && m.verbs.contains(verb)),
                        "the manager role lacks {verb} {group}/{resource}"
                    );
                }
            }
        }
    }
}
