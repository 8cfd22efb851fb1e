//! The committed CRD manifests match the Rust types and carry CAPI's names and labels.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use std::path::PathBuf;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../controller/config/crd")
}

#[test]
fn committed_crds_parse_as_apiextensions_v1_with_capi_names_and_labels() {
    let expected = [
        ("bootstrapkubeconfigs", "BootstrapKubeconfig"),
        ("byoclusters", "ByoCluster"),
        ("byoclustertemplates", "ByoClusterTemplate"),
        ("byohosts", "ByoHost"),
        ("byomachines", "ByoMachine"),
        ("byomachinetemplates", "ByoMachineTemplate"),
        ("byoremediations", "ByoRemediation"),
        ("byoremediationtemplates", "ByoRemediationTemplate"),
        ("k8sinstallerconfigs", "K8sInstallerConfig"),
        ("k8sinstallerconfigtemplates", "K8sInstallerConfigTemplate"),
    ];
    for (plural, kind) in expected {
        let path = crd_dir().join(format!("infrastructure.cluster.x-k8s.io_{plural}.yaml"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `make manifests`)", path.display()));
        let raw: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(raw["apiVersion"], "apiextensions.k8s.io/v1", "{plural}");
        assert_eq!(raw["kind"], "CustomResourceDefinition", "{plural}");
        let crd: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.infrastructure.cluster.x-k8s.io").as_str())
        );
        assert_eq!(crd.spec.names.kind, kind);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert!(
            crd.spec
                .names
                .short_names
                .as_ref()
                .is_some_and(|s| !s.is_empty()),
            "{plural} short name"
        );
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["cluster-api".to_string()][..])
        );
        let labels = crd.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta2").map(String::as_str),
            Some("v1beta2")
        );
        assert_eq!(
            labels.get("cluster.x-k8s.io/provider").map(String::as_str),
            Some("infrastructure-byoh")
        );
        assert_eq!(crd.spec.versions.len(), 1);
        let v = &crd.spec.versions[0];
        assert_eq!(
            (v.name.as_str(), v.served, v.storage),
            ("v1beta2", true, true)
        );
        // Committed file equals what the types generate now (the same check `make verify` does).
        let generated = byoh_api::crds::all()
            .into_iter()
            .find(|c| c.spec.names.plural == plural)
            .unwrap();
        let committed: CustomResourceDefinition = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(
            committed, generated,
            "{plural}: committed CRD is stale, run `make manifests`"
        );
    }
}

#[test]
fn byohost_and_byomachine_have_printer_columns() {
    for (plural, columns) in [
        ("byohosts", &["Machine", "OS", "Arch", "Ready", "Age"][..]),
        (
            "byomachines",
            &["Host", "ProviderID", "Provisioned", "Ready", "Age"][..],
        ),
    ] {
        let crd = byoh_api::crds::all()
            .into_iter()
            .find(|c| c.spec.names.plural == plural)
            .unwrap();
        let names: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        for col in columns {
            assert!(
                names.iter().any(|n| n == col),
                "{plural} lacks column {col}: {names:?}"
            );
        }
    }
}

/// The CEL rules of the installer config refuse, at `kubectl apply` time, strings that would
/// inject lines into the apt source or dnf repository file the agent writes (a newline in
/// `aptRepository` followed by `Trusted: yes` would disable signature checks) or options into
/// the package manager's command line.
#[tokio::test]
async fn installer_config_strings_with_newlines_or_bad_characters_are_refused_with_422() {
    use byoh_api::K8sInstallerConfig;
    use byoh_tests::control_plane::{self, TestNamespace};
    use kube::Api;
    use kube::api::PostParams;

    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "installer-strings")
        .await
        .expect("namespace");
    let api = Api::<K8sInstallerConfig>::namespaced(client.clone(), ns.name());
    let config = |name: &str, field: &str, value: &str| -> K8sInstallerConfig {
        let mut packages = serde_json::json!({
            "aptRepository": "https://mirror.example/deb/",
            "keyURL": "https://mirror.example/Release.key",
            "versionPin": "1.36.3-1.1",
        });
        packages[field] = serde_json::Value::String(value.into());
        serde_json::from_value(serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "K8sInstallerConfig",
            "metadata": { "name": name },
            "spec": { "packages": packages },
        }))
        .expect("K8sInstallerConfig JSON")
    };
    let pp = PostParams::default();
    api.create(
        &pp,
        &config("valid", "aptRepository", "http://mirror.example/deb/"),
    )
    .await
    .expect("a plain repository URL is accepted");
    for (i, (field, value)) in [
        ("aptRepository", "http://mirror.example/\nTrusted: yes"),
        ("dnfRepository", "https://mirror.example/rpm/\ngpgcheck=0"),
        ("keyURL", "https://mirror.example/key\r\n"),
        ("keyURL", "http://mirror.example/key"),
        ("versionPin", "1.36.3 --allow-downgrades"),
        ("versionPin", "-o=APT::Get::AllowUnauthenticated=1"),
    ]
    .into_iter()
    .enumerate()
    {
        match api
            .create(&pp, &config(&format!("bad-{i}"), field, value))
            .await
        {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{field}={value:?}: {s:?}");
                assert!(
                    s.message.contains(field),
                    "{field}={value:?}: {}",
                    s.message
                );
            }
            other => panic!("{field}={value:?} must be refused with 422, got {other:?}"),
        }
    }
    ns.cleanup(&client).await.expect("cleanup");
}
