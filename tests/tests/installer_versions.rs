//! Issue 36 on the real API server: an installer template that cannot install the Machine's
//! Kubernetes version is refused on the ByoMachine before any host is claimed, naming the fix,
//! and a template with `@minor@` in its repository URLs serves any version (the CRD's own
//! validation accepts it; the agent's resolution of it is tested in `installer_packages.rs` on
//! a booted host). A host with Kubernetes of its own (the kubelet version its agent reports,
//! `status.hostInfo.kubeletVersion`; the agent's side is tested in `agent_facts.rs` on a booted
//! host) is handed only to Machines of that version. The controller runs in-process
//! (`byoh_controller::run::run`).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoMachineSpec;
use byoh_api::common::TypedLocalObjectReference;
use byoh_api::installer::{
    K8sInstallerConfig, K8sInstallerConfigSpec, K8sInstallerConfigTemplate,
    K8sInstallerConfigTemplateResource, K8sInstallerConfigTemplateSpec, PackagesSource,
};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::*;
use kube::Api;
use kube::api::PostParams;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// Creates a `packages` installer template `name` in `ns` with apt repository `repo` (its key
/// beside it) and `pin`.
async fn template(client: &kube::Client, ns: &str, name: &str, repo: &str, pin: Option<&str>) {
    let mut tpl = K8sInstallerConfigTemplate::new(
        name,
        K8sInstallerConfigTemplateSpec {
            template: K8sInstallerConfigTemplateResource {
                metadata: None,
                spec: K8sInstallerConfigSpec {
                    packages: Some(PackagesSource {
                        apt_repository: Some(repo.into()),
                        dnf_repository: None,
                        key_url: Some(format!("{repo}Release.key")),
                        version_pin: pin.map(Into::into),
                    }),
                    ..Default::default()
                },
            },
        },
    );
    tpl.metadata.namespace = Some(ns.into());
    Api::<K8sInstallerConfigTemplate>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &tpl)
        .await
        .unwrap();
}

/// A worker Machine of `version` (and its ByoMachine) whose installer is template `tpl`.
async fn machine(client: &kube::Client, ns: &str, name: &str, version: &str, tpl: &str) {
    let opts = MachineOpts {
        version: Some(version.into()),
        spec: ByoMachineSpec {
            installer_ref: Some(TypedLocalObjectReference {
                api_group: byoh_api::GROUP.into(),
                kind: "K8sInstallerConfigTemplate".into(),
                name: tpl.into(),
            }),
            ..Default::default()
        },
        ..MachineOpts::ready()
    };
    create_machine(client, ns, "c1", name, &opts).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_installer_that_cannot_serve_the_machines_version_is_refused_before_any_claim() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "inst-versions")
        .await
        .unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    for h in ["host-1", "host-2"] {
        create_host(&client, &n, h, &HostOpts::default()).await;
    }
    // As the quickstart wrote them for v1.36: the repository of one minor, and a pin.
    template(
        &client,
        &n,
        "v1-36",
        "https://pkgs.k8s.io/core:/stable:/v1.36/deb/",
        None,
    )
    .await;
    template(
        &client,
        &n,
        "pinned",
        "https://pkgs.k8s.io/core:/stable:/@minor@/deb/",
        Some("1.36.3-1.1"),
    )
    .await;
    // One for every version: `@minor@` in the URLs, no pin (accepted by the CRD's rules).
    template(
        &client,
        &n,
        "any",
        "https://pkgs.k8s.io/core:/stable:/@minor@/deb/",
        None,
    )
    .await;

    machine(&client, &n, "minor-up", "v1.37.2", "v1-36").await;
    machine(&client, &n, "pin-off", "v1.37.2", "pinned").await;
    let refused = |name: &'static str| {
        let client = client.clone();
        let n = n.clone();
        async move {
            eventually(name, T, || async {
                let bm = get_bm(&client, &n, name).await?;
                let c = bm
                    .status
                    .as_ref()?
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "HostClaimed")?
                    .clone();
                (c.status == "False" && c.reason == "InstallerCannotServeVersion").then_some(c)
            })
            .await
        }
    };
    let minor_up = refused("minor-up").await;
    assert!(
        minor_up.message.contains("packages.aptRepository")
            && minor_up.message.contains("v1.36 only")
            && minor_up.message.contains("v1.37.2")
            && minor_up.message.contains("@minor@"),
        "{}",
        minor_up.message
    );
    let pin_off = refused("pin-off").await;
    assert!(
        pin_off.message.contains("versionPin 1.36.3-1.1") && pin_off.message.contains("v1.37.2"),
        "{}",
        pin_off.message
    );
    // Refused means no host was handed out, and the configs are not marked ready.
    for h in hosts(&client, &n).await {
        assert!(h.spec.claim.is_none(), "{:?} claimed", h.metadata.name);
    }
    let configs = Api::<K8sInstallerConfig>::namespaced(client.clone(), &n);
    for name in ["minor-up", "pin-off"] {
        let ready = configs
            .get_opt(name)
            .await
            .unwrap()
            .and_then(|c| c.status)
            .is_some_and(|s| s.ready);
        assert!(!ready, "K8sInstallerConfig {name} marked ready");
    }

    // The same version with the template for every minor: claimed, the config ready for it.
    machine(&client, &n, "any-minor", "v1.37.2", "any").await;
    let host = eventually("any-minor claims a host", T, || async {
        hosts(&client, &n).await.into_iter().find(|h| {
            h.spec
                .claim
                .as_ref()
                .is_some_and(|c| c.machine_ref.name == "any-minor")
        })
    })
    .await;
    let claim = host.spec.claim.unwrap();
    assert_eq!(claim.kubernetes_version.as_deref(), Some("v1.37.2"));
    let config = configs.get("any-minor").await.unwrap();
    let status = config.status.unwrap();
    assert!(status.ready);
    assert_eq!(status.kubernetes_version.as_deref(), Some("v1.37.2"));
    // The URL is stored as written: the agent resolves `@minor@` from the claim's version.
    assert_eq!(
        config.spec.packages.unwrap().apt_repository.as_deref(),
        Some("https://pkgs.k8s.io/core:/stable:/@minor@/deb/")
    );
    // The refused ones still hold no host, though one host is still free.
    for name in ["minor-up", "pin-off"] {
        let bm = get_bm(&client, &n, name).await.unwrap();
        assert_eq!(
            bm_condition(&bm, "HostClaimed"),
            Some(("False".into(), "InstallerCannotServeVersion".into()))
        );
    }
    finish(&client, ns, vec![ctl]).await;
}

/// What the agent reports of a host with a kubelet `version` of its own (`None`: no kubelet).
async fn report_kubelet(client: &kube::Client, ns: &str, host: &str, version: Option<&str>) {
    agent_status(
        client,
        ns,
        host,
        serde_json::json!({"hostInfo": {"hostname": host, "architecture": "amd64",
            "osName": "debian", "cpus": 4, "memoryBytes": 8_i64 << 30,
            "kubeletVersion": version}}),
    )
    .await;
}

/// The ByoHost `machine` claimed, once it has one.
async fn claimed_by(client: &kube::Client, ns: &str, machine: &str) -> String {
    eventually(&format!("{machine} claims a host"), T, || async {
        hosts(client, ns).await.into_iter().find_map(|h| {
            h.spec
                .claim
                .as_ref()
                .is_some_and(|c| c.machine_ref.name == machine)
                .then(|| h.metadata.name.clone().unwrap_or_default())
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_with_kubernetes_of_its_own_goes_only_to_machines_of_that_version() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "inst-preinstalled")
        .await
        .unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    create_host(&client, &n, "brought-v1-36", &HostOpts::default()).await;
    report_kubelet(&client, &n, "brought-v1-36", Some("v1.36.3")).await;
    template(
        &client,
        &n,
        "any",
        "https://pkgs.k8s.io/core:/stable:/@minor@/deb/",
        None,
    )
    .await;

    // A v1.37 Machine does not get the host whose own kubelet is v1.36: the reason says why.
    machine(&client, &n, "upgraded", "v1.37.2", "any").await;
    let message = host_claimed_false(&client, &n, "upgraded", "NoHostAvailable").await;
    assert!(message.contains("1 KubernetesVersion"), "{message}");
    assert_free(&client, &n, &["brought-v1-36"]).await;

    // A Machine of the host's own version (written without the `v`, as some templates do) and
    // no installer (what the host has is used) gets it.
    let same = MachineOpts {
        version: Some("1.36.3".into()),
        ..MachineOpts::ready()
    };
    create_machine(&client, &n, "c1", "same-version", &same).await;
    assert_eq!(
        claimed_by(&client, &n, "same-version").await,
        "brought-v1-36"
    );
    // A host without Kubernetes arrives: the v1.37 Machine, waiting, takes it (the installer
    // installs its version there).
    create_host(&client, &n, "bare", &HostOpts::default()).await;
    report_kubelet(&client, &n, "bare", None).await;
    assert_eq!(claimed_by(&client, &n, "upgraded").await, "bare");
    finish(&client, ns, vec![ctl]).await;
}
