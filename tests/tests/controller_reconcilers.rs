//! Issue 6 part A on the real API server: the ByoCluster and ByoMachine reconcilers run
//! in-process (`byoh_controller::run::run` on a tokio task, admin client), against objects
//! shaped as CAPI v1beta2 and the agent write them.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::installer::{
    K8sInstallerConfig, K8sInstallerConfigSpec, K8sInstallerConfigTemplate,
    K8sInstallerConfigTemplateSpec, PreinstalledSource,
};
use byoh_api::{ByoCluster, ByoHost, ByoMachine, finalizers, labels};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::*;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread")]
async fn byocluster_is_provisioned_paused_and_deleted_after_its_machines() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-byocluster")
        .await
        .unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    create_cluster(&client, &n, "c1").await;
    let api = Api::<ByoCluster>::namespaced(client.clone(), &n);

    let bc = eventually("ByoCluster provisioned", T, || async {
        let bc = api.get("c1").await.unwrap();
        let st = bc.status.clone()?;
        (st.initialization.as_ref()?.provisioned == Some(true)
            && byoh_api::conditions::is_true(&st.conditions, "Ready"))
        .then_some(bc)
    })
    .await;
    let st = bc.status.clone().unwrap();
    assert_eq!(
        bc.spec.control_plane_endpoint.as_ref().unwrap().port,
        6443,
        "port defaults to 6443"
    );
    assert_eq!(st.failure_domains.len(), 1, "failure domains mirrored");
    let paused = condition(&st.conditions, "Paused").unwrap();
    assert_eq!(
        (paused.status.as_str(), paused.reason.as_str()),
        ("False", "NotPaused")
    );
    assert_eq!(paused.observed_generation, bc.metadata.generation);
    assert!(bc.finalizers().iter().any(|f| f == finalizers::BYOCLUSTER));

    // Cluster.spec.paused → Paused=True (the Cluster watch triggers the reconcile).
    clusters(&client, &n)
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .unwrap();
    eventually("Paused=True", T, || async {
        let bc = api.get("c1").await.unwrap();
        byoh_api::conditions::is_true(&bc.status?.conditions, "Paused").then_some(())
    })
    .await;
    clusters(&client, &n)
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .unwrap();
    eventually("Paused=False", T, || async {
        let bc = api.get("c1").await.unwrap();
        (!byoh_api::conditions::is_true(&bc.status?.conditions, "Paused")).then_some(())
    })
    .await;

    // Deletion waits while a ByoMachine of the cluster exists (and never for ByoHosts: none).
    // This ByoMachine has no owner Machine, so it carries no finalizer and goes at once.
    let mut bm = ByoMachine::new("orphan", Default::default());
    bm.metadata.labels = Some([(labels::CLUSTER_NAME.to_string(), "c1".to_string())].into());
    Api::<ByoMachine>::namespaced(client.clone(), &n)
        .create(&PostParams::default(), &bm)
        .await
        .unwrap();
    api.delete("c1", &DeleteParams::default()).await.unwrap();
    eventually("ByoCluster Ready=False Deleting", T, || async {
        let bc = api.get("c1").await.unwrap();
        (bm_like(&bc) == Some(("False".into(), "Deleting".into()))).then_some(())
    })
    .await;
    Api::<ByoMachine>::namespaced(client.clone(), &n)
        .delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    eventually("ByoCluster gone", T, || async {
        api.get_opt("c1").await.unwrap().is_none().then_some(())
    })
    .await;
    finish(&client, ns, vec![ctl]).await;
}

fn bm_like(bc: &ByoCluster) -> Option<(String, String)> {
    bc.status
        .as_ref()
        .and_then(|s| condition(&s.conditions, "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

#[tokio::test(flavor = "multi_thread")]
async fn happy_path_claim_provision_and_normal_release() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-happy").await.unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    create_host(&client, &n, "host-1", &HostOpts::default()).await;
    // An installer template the ByoMachine references.
    let mut tpl = K8sInstallerConfigTemplate::new(
        "preinstalled",
        K8sInstallerConfigTemplateSpec {
            template: byoh_api::installer::K8sInstallerConfigTemplateResource {
                metadata: Some(byoh_api::common::TemplateMeta {
                    labels: [("team".to_string(), "a".to_string())].into(),
                    annotations: Default::default(),
                }),
                spec: K8sInstallerConfigSpec {
                    preinstalled: Some(PreinstalledSource::default()),
                    ..Default::default()
                },
            },
        },
    );
    tpl.metadata.namespace = Some(n.clone());
    Api::<K8sInstallerConfigTemplate>::namespaced(client.clone(), &n)
        .create(&PostParams::default(), &tpl)
        .await
        .unwrap();
    let opts = MachineOpts {
        control_plane: true,
        spec: byoh_api::ByoMachineSpec {
            installer_ref: Some(byoh_api::common::TypedLocalObjectReference {
                api_group: byoh_api::GROUP.into(),
                kind: "K8sInstallerConfigTemplate".into(),
                name: "preinstalled".into(),
            }),
            ..Default::default()
        },
        ..MachineOpts::ready()
    };
    let bm = create_machine(&client, &n, "c1", "m1", &opts).await;
    let uid = bm.uid().unwrap();

    let host = eventually("the host claimed", T, || async {
        let h = get_host(&client, &n, "host-1").await;
        h.spec.claim.is_some().then_some(h)
    })
    .await;
    let claim = host.spec.claim.clone().unwrap();
    assert_eq!(claim.machine_ref.name, "m1");
    assert_eq!(claim.machine_ref.uid, uid);
    assert_eq!(claim.cluster_name, "c1");
    assert_eq!(claim.bootstrap_secret_ref.name, "m1-bootstrap");
    assert_eq!(claim.kubernetes_version.as_deref(), Some("v1.36.1"));
    let installer = claim.installer_ref.clone().unwrap();
    assert_eq!(
        (installer.kind.as_str(), installer.name.as_str()),
        ("K8sInstallerConfig", "m1")
    );
    let pid = claim.provider_id.strip_prefix("byoh://host-1/").unwrap();
    assert!(
        pid.len() == 6
            && pid
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
        "{pid}"
    );
    assert!(claim.claimed_at.is_some());
    assert!(!claim.release_requested);
    // The Cluster's endpoint, for the agent's clean-up (kube-vip's address).
    let endpoint = claim.control_plane_endpoint.clone().unwrap();
    assert_eq!(
        (endpoint.host.as_str(), endpoint.port),
        ("192.0.2.10", 6443)
    );
    // Its service and pod CIDRs, for the agent's no_proxy.
    assert_eq!(claim.service_cidrs, ["10.96.0.0/12"]);
    assert_eq!(claim.pod_cidrs, ["192.168.0.0/16"]);
    let hl = host.labels();
    assert_eq!(hl.get(labels::CLUSTER_NAME).map(String::as_str), Some("c1"));
    assert_eq!(hl.get(labels::MACHINE_NAME).map(String::as_str), Some("m1"));

    // The per-machine installer config: owned, finalized, ready, cloned from the template.
    let cfg = Api::<K8sInstallerConfig>::namespaced(client.clone(), &n)
        .get("m1")
        .await
        .unwrap();
    assert!(cfg.spec.preinstalled.is_some());
    assert!(
        cfg.finalizers()
            .iter()
            .any(|f| f == finalizers::K8S_INSTALLER_CONFIG)
    );
    let oref = &cfg.owner_references()[0];
    assert_eq!(
        (oref.kind.as_str(), oref.uid.as_str(), oref.controller),
        ("ByoMachine", uid.as_str(), Some(true))
    );
    assert_eq!(cfg.labels().get("team").map(String::as_str), Some("a"));
    assert_eq!(
        cfg.labels().get(labels::CLUSTER_NAME).map(String::as_str),
        Some("c1")
    );
    let cst = eventually("installer config ready", T, || async {
        let c = Api::<K8sInstallerConfig>::namespaced(client.clone(), &n)
            .get("m1")
            .await
            .unwrap();
        c.status.filter(|s| s.ready)
    })
    .await;
    assert_eq!(cst.kubernetes_version.as_deref(), Some("v1.36.1"));

    let bm = eventually(
        "ByoMachine HostClaimed, waiting for bootstrap",
        T,
        || async {
            let bm = get_bm(&client, &n, "m1").await?;
            (bm_condition(&bm, "HostClaimed") == Some(("True".into(), "AsExpected".into()))
                && bm_condition(&bm, "Ready")
                    == Some(("False".into(), "WaitingForBootstrap".into())))
            .then_some(bm)
        },
    )
    .await;
    assert_eq!(
        bm.status.as_ref().unwrap().host_ref.as_ref().unwrap().name,
        "host-1"
    );
    assert!(bm.finalizers().iter().any(|f| f == finalizers::BYOMACHINE));
    assert!(bm.spec.provider_id.is_none());

    // The agent reports the bootstrap.
    agent_status(
        &client,
        &n,
        "host-1",
        json!({
            "phase": "Provisioned",
            "observedMachineUID": uid,
            "conditions": [
                {"type": "Registered", "status": "True", "reason": "AsExpected", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "BootstrapSucceeded", "status": "True", "reason": "AsExpected", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        }),
    )
    .await;
    let bm = eventually("ByoMachine provisioned", T, || async {
        let bm = get_bm(&client, &n, "m1").await?;
        let st = bm.status.clone()?;
        (st.initialization.as_ref()?.provisioned == Some(true)).then_some(bm)
    })
    .await;
    assert_eq!(
        bm.spec.provider_id.as_deref(),
        Some(claim.provider_id.as_str())
    );
    let st = bm.status.clone().unwrap();
    assert!(
        st.addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "192.0.2.50")
    );
    assert_eq!(
        bm_condition(&bm, "Ready"),
        Some(("True".into(), "AsExpected".into()))
    );

    // Normal release: the host is asked to reset; nothing goes before the agent confirms.
    Api::<ByoMachine>::namespaced(client.clone(), &n)
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    let host = eventually("release requested", T, || async {
        let h = get_host(&client, &n, "host-1").await;
        h.spec.claim.as_ref().filter(|c| c.release_requested)?;
        Some(h)
    })
    .await;
    assert!(
        host.annotations()
            .contains_key(labels::RELEASE_REQUESTED_AT)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bm = get_bm(&client, &n, "m1")
        .await
        .expect("kept until the agent confirms");
    assert_eq!(
        bm_condition(&bm, "Ready"),
        Some(("False".into(), "Releasing".into()))
    );
    assert!(
        Api::<K8sInstallerConfig>::namespaced(client.clone(), &n)
            .get_opt("m1")
            .await
            .unwrap()
            .is_some()
    );

    agent_status(
        &client,
        &n,
        "host-1",
        json!({"phase": "Available", "cleanedMachineUID": uid}),
    )
    .await;
    eventually("ByoMachine gone", T, || async {
        get_bm(&client, &n, "m1").await.is_none().then_some(())
    })
    .await;
    let host = get_host(&client, &n, "host-1").await;
    assert!(host.spec.claim.is_none());
    assert!(
        host.spec.needs_cleanup.is_none(),
        "a confirmed clean-up leaves no mark"
    );
    let m1 = machines(&client, &n).get("m1").await.unwrap();
    let previous = host.spec.previous_machine_ref.clone().unwrap();
    assert_eq!(
        (previous.name.as_str(), Some(previous.uid.as_str())),
        ("m1", m1.uid().as_deref()),
        "the claim's CAPI Machine is remembered"
    );
    assert!(!host.labels().contains_key(labels::CLUSTER_NAME));
    assert!(!host.labels().contains_key(labels::MACHINE_NAME));
    assert!(
        !host
            .annotations()
            .contains_key(labels::RELEASE_REQUESTED_AT)
    );
    // The garbage collector (kube-controller-manager) deletes the installer config.
    eventually(
        "K8sInstallerConfig garbage-collected",
        Duration::from_secs(60),
        || async {
            Api::<K8sInstallerConfig>::namespaced(client.clone(), &n)
                .get_opt("m1")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;

    // The host is not handed out while Machine m1 exists (CAPI deletes m1's Node, named after
    // the host, only after its ByoMachine is gone); m1's deletion frees it at once.
    create_machine(&client, &n, "c1", "m2", &MachineOpts::ready()).await;
    let bm2 = eventually("m2 waits: host held for m1", T, || async {
        let bm = get_bm(&client, &n, "m2").await?;
        (bm_condition(&bm, "HostClaimed") == Some(("False".into(), "NoHostAvailable".into())))
            .then_some(bm)
    })
    .await;
    let msg = condition(&bm2.status.unwrap().conditions, "HostClaimed")
        .unwrap()
        .message
        .clone();
    assert!(msg.contains("1 PreviousMachineExists"), "{msg}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(get_host(&client, &n, "host-1").await.spec.claim.is_none());
    // As after `clusterctl move`: the ByoHost is copied as it is, so the hold names m1's UID on
    // the source cluster, while m1 is a new object whose spec.providerID (Cluster API's copy of
    // the ByoMachine's) names this host. The host stays held, and m1's deletion frees it.
    machines(&client, &n)
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerID": claim.provider_id}})),
        )
        .await
        .unwrap();
    // (The Machine first: the controller sees it before the hold changes.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    Api::<ByoHost>::namespaced(client.clone(), &n)
        .patch(
            "host-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"previousMachineRef": {
                "name": "m1", "uid": "6f1c1f43-uid-of-m1-on-the-source"
            }}})),
        )
        .await
        .unwrap();
    create_machine(&client, &n, "c1", "m3", &MachineOpts::ready()).await;
    eventually("m3 waits too: host held for the moved m1", T, || async {
        let bm = get_bm(&client, &n, "m3").await?;
        let st = bm.status?;
        condition(&st.conditions, "HostClaimed")
            .filter(|c| c.reason == "NoHostAvailable")
            .filter(|c| c.message.contains("1 PreviousMachineExists"))
            .map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(get_host(&client, &n, "host-1").await.spec.claim.is_none());
    machines(&client, &n)
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    let host = eventually("m2 or m3 claims the host once m1 is gone", T, || async {
        let h = get_host(&client, &n, "host-1").await;
        let by = h.claimed_by()?;
        let waiting = [
            get_bm(&client, &n, "m2").await?.uid()?,
            get_bm(&client, &n, "m3").await?.uid()?,
        ];
        waiting.iter().any(|u| u == by).then_some(h)
    })
    .await;
    assert!(
        host.spec.previous_machine_ref.is_none(),
        "a claim clears the previous Machine"
    );
    finish(&client, ns, vec![ctl]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn waits_for_cluster_infrastructure_bootstrap_data_and_control_plane() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-waits").await.unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    create_cluster(&client, &n, "c1").await;
    create_host(&client, &n, "host-1", &HostOpts::default()).await;
    let worker = MachineOpts {
        bootstrap_data: BootstrapData::None,
        ..MachineOpts::ready()
    };
    create_machine(&client, &n, "c1", "w1", &worker).await;
    let reason = |want: &'static str| {
        let client = client.clone();
        let n = n.clone();
        async move {
            eventually(want, T, || async {
                let bm = get_bm(&client, &n, "w1").await?;
                (bm_condition(&bm, "Ready") == Some(("False".into(), want.into()))).then_some(())
            })
            .await
        }
    };
    reason("WaitingForClusterInfrastructure").await;
    set_cluster_status(&client, &n, "c1", true, false).await;
    reason("WaitingForBootstrapData").await;
    byoh_tests::agent::create_machine_bootstrap_data(
        &client,
        &n,
        "w1",
        "w1-data",
        "#cloud-config\n",
    )
    .await
    .unwrap();
    machines(&client, &n)
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"bootstrap": {"dataSecretName": "w1-data"}}})),
        )
        .await
        .unwrap();
    reason("WaitingForControlPlaneInitialized").await;
    assert!(get_host(&client, &n, "host-1").await.spec.claim.is_none());
    set_cluster_status(&client, &n, "c1", true, true).await;
    let h = eventually("worker claims", T, || async {
        get_host(&client, &n, "host-1")
            .await
            .spec
            .claim
            .filter(|c| c.machine_ref.name == "w1")
    })
    .await;
    assert_eq!(h.bootstrap_secret_ref.name, "w1-data");
    finish(&client, ns, vec![ctl]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_machines_one_host_then_a_new_host_is_claimed_on_its_event() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-two").await.unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    create_host(&client, &n, "host-1", &HostOpts::default()).await;
    create_machine(&client, &n, "c1", "m1", &MachineOpts::ready()).await;
    create_machine(&client, &n, "c1", "m2", &MachineOpts::ready()).await;
    eventually("one claimed, one NoHostAvailable", T, || async {
        let (a, b) = (
            get_bm(&client, &n, "m1").await?,
            get_bm(&client, &n, "m2").await?,
        );
        let claimed = [&a, &b]
            .iter()
            .filter(|bm| bm_condition(bm, "HostClaimed").is_some_and(|c| c.0 == "True"))
            .count();
        let waiting = [&a, &b]
            .iter()
            .filter(|bm| {
                bm_condition(bm, "HostClaimed") == Some(("False".into(), "NoHostAvailable".into()))
            })
            .count();
        (claimed == 1 && waiting == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hs = hosts(&client, &n).await;
    assert_eq!(hs.iter().filter(|h| h.spec.claim.is_some()).count(), 1);

    // A new host: its events (not a poll; the safety requeue is 60 s) get it claimed quickly.
    let started = std::time::Instant::now();
    create_host(&client, &n, "host-2", &HostOpts::default()).await;
    eventually("both claimed", Duration::from_secs(15), || async {
        let hs = hosts(&client, &n).await;
        (hs.iter().filter(|h| h.spec.claim.is_some()).count() == 2).then_some(())
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(15));
    let hs = hosts(&client, &n).await;
    let machines: std::collections::HashSet<_> = hs
        .iter()
        .map(|h| h.spec.claim.clone().unwrap().machine_ref.name)
        .collect();
    assert_eq!(machines.len(), 2, "{machines:?}");
    finish(&client, ns, vec![ctl]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn selection_skips_expired_leases_wrong_arch_needs_cleanup_and_busy_hosts() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-select").await.unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    create_host(
        &client,
        &n,
        "expired",
        &HostOpts {
            lease: Some((120, 40)),
            ..HostOpts::default()
        },
    )
    .await;
    create_host(
        &client,
        &n,
        "arm",
        &HostOpts {
            arch: "arm64",
            ..HostOpts::default()
        },
    )
    .await;
    create_host(&client, &n, "dirty", &HostOpts::default()).await;
    Api::<ByoHost>::namespaced(client.clone(), &n)
        .patch(
            "dirty",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"needsCleanup": {"machineUID": "old", "reason": "ForcedRelease"}}}),
            ),
        )
        .await
        .unwrap();
    create_host(
        &client,
        &n,
        "busy",
        &HostOpts {
            phase: "CleaningUp",
            ..HostOpts::default()
        },
    )
    .await;
    create_host(
        &client,
        &n,
        "nolease",
        &HostOpts {
            lease: None,
            ..HostOpts::default()
        },
    )
    .await;
    // Out of the pool for maintenance: one by an administrator's annotation, one by the
    // host's own condition (`byoh-agent maintenance on`).
    create_host(&client, &n, "maint-admin", &HostOpts::default()).await;
    Api::<ByoHost>::namespaced(client.clone(), &n)
        .patch(
            "maint-admin",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {labels::MAINTENANCE: "disk swap"}}})),
        )
        .await
        .unwrap();
    create_host(&client, &n, "maint-host", &HostOpts::default()).await;
    agent_status(
        &client,
        &n,
        "maint-host",
        json!({"conditions": [{"type": "Maintenance", "status": "True", "reason": "MaintenanceRequested",
            "message": "disk swap", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    )
    .await;
    create_host(
        &client,
        &n,
        "unselected",
        &HostOpts {
            labels: [("site".into(), "b".into())].into(),
            ..HostOpts::default()
        },
    )
    .await;
    let opts = MachineOpts {
        labels: [(labels::HOST_ARCH.to_string(), "amd64".to_string())].into(),
        spec: byoh_api::ByoMachineSpec {
            selector: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_expressions: Some(vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                            key: "site".into(),
                            operator: "NotIn".into(),
                            values: Some(vec!["b".into()]),
                        },
                    ]),
                    ..Default::default()
                },
            ),
            ..Default::default()
        },
        ..MachineOpts::ready()
    };
    create_machine(&client, &n, "c1", "m1", &opts).await;
    let bm = eventually("NoHostAvailable", T, || async {
        let bm = get_bm(&client, &n, "m1").await?;
        (bm_condition(&bm, "HostClaimed") == Some(("False".into(), "NoHostAvailable".into())))
            .then_some(bm)
    })
    .await;
    let msg = condition(&bm.status.unwrap().conditions, "HostClaimed")
        .unwrap()
        .message
        .clone();
    for part in [
        "1 NeedsCleanup",
        "1 NoLease",
        "1 LeaseExpired",
        "1 NotAvailable",
        "1 Selector",
        "1 Arch",
        "2 Maintenance",
    ] {
        assert!(msg.contains(part), "{part} missing in {msg:?}");
    }
    // The expired host comes back (its agent renews the Lease): the Lease event gets it claimed.
    set_lease(&client, &n, "expired", 0, 40).await;
    let claim = eventually("claimed after the Lease renewal", T, || async {
        get_host(&client, &n, "expired").await.spec.claim
    })
    .await;
    assert_eq!(claim.machine_ref.name, "m1");
    assert_free(
        &client,
        &n,
        &[
            "arm",
            "dirty",
            "busy",
            "nolease",
            "unselected",
            "maint-admin",
            "maint-host",
        ],
    )
    .await;
    finish(&client, ns, vec![ctl]).await;
}

async fn claimed_pair(
    client: &kube::Client,
    n: &str,
    host: &str,
    machine: &str,
    lease: (i64, i32),
    annotations: &[(&str, &str)],
) -> String {
    create_host(
        client,
        n,
        host,
        &HostOpts {
            lease: Some(lease),
            ..HostOpts::default()
        },
    )
    .await;
    let opts = MachineOpts {
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        spec: byoh_api::ByoMachineSpec {
            selector: Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: Some(
                        [("kubernetes.io/hostname".to_string(), host.to_string())].into(),
                    ),
                    ..Default::default()
                },
            ),
            ..Default::default()
        },
        ..MachineOpts::ready()
    };
    // The selector pins the machine to its host.
    Api::<ByoHost>::namespaced(client.clone(), n)
        .patch(
            host,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kubernetes.io/hostname": host}}})),
        )
        .await
        .unwrap();
    let bm = create_machine(client, n, "c1", machine, &opts).await;
    eventually("claimed", T, || async {
        get_host(client, n, host)
            .await
            .spec
            .claim
            .filter(|c| c.machine_ref.name == machine)
    })
    .await;
    bm.uid().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn release_of_offline_forced_timed_out_and_vanished_hosts() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-release").await.unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(
        &client,
        &n,
        byoh_controller::run::Settings {
            release_timeout: Duration::from_secs(6),
            ..settings()
        },
    );
    ready_cluster(&client, &n, "c1").await;
    let bms = Api::<ByoMachine>::namespaced(client.clone(), &n);

    // Offline: the Lease is not renewed after the deletion; once it expires the host is
    // released (before the 6 s timeout).
    let offline_uid = claimed_pair(&client, &n, "offline", "m-offline", (0, 3600), &[]).await;
    // Forced: released at once.
    let forced_uid = claimed_pair(
        &client,
        &n,
        "forced",
        "m-forced",
        (0, 3600),
        &[(labels::FORCE_RELEASE, "")],
    )
    .await;
    // Timed out: live host whose agent never confirms; --release-timeout is 6 s here.
    let slow_uid = claimed_pair(&client, &n, "slow", "m-slow", (0, 3600), &[]).await;
    // Vanished: the ByoHost is deleted; the ByoMachine goes at once.
    claimed_pair(&client, &n, "vanished", "m-vanished", (0, 3600), &[]).await;

    set_lease(&client, &n, "offline", 0, 3).await;
    let started = std::time::Instant::now();
    for m in ["m-forced", "m-offline", "m-slow", "m-vanished"] {
        bms.delete(m, &DeleteParams::default()).await.unwrap();
    }
    Api::<ByoHost>::namespaced(client.clone(), &n)
        .delete("vanished", &DeleteParams::default())
        .await
        .unwrap();

    eventually("forced release", Duration::from_secs(5), || async {
        get_bm(&client, &n, "m-forced")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let h = get_host(&client, &n, "forced").await;
    assert!(h.spec.claim.is_none());
    let mark = h.spec.needs_cleanup.clone().unwrap();
    assert_eq!(
        (mark.machine_uid.as_str(), mark.reason.as_str()),
        (forced_uid.as_str(), "ForcedRelease")
    );
    // Where an operator looks: a Warning Event on the (gone) ByoMachine naming the reason.
    controller_event(
        &client,
        &n,
        ("ByoMachine", "m-forced"),
        ("Warning", "HostReleased"),
        "without its agent's clean-up (ForcedRelease)",
    )
    .await;
    eventually(
        "vanished host's machine released",
        Duration::from_secs(5),
        || async {
            get_bm(&client, &n, "m-vanished")
                .await
                .is_none()
                .then_some(())
        },
    )
    .await;

    eventually("offline release", Duration::from_secs(20), || async {
        get_bm(&client, &n, "m-offline")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let h = get_host(&client, &n, "offline").await;
    assert!(h.spec.claim.is_none());
    let mark = h.spec.needs_cleanup.clone().unwrap();
    assert_eq!(
        (mark.machine_uid.as_str(), mark.reason.as_str()),
        (offline_uid.as_str(), "HostOfflineRelease")
    );
    // Where an operator looks: a Warning Event on the (gone) ByoMachine naming the reason.
    controller_event(
        &client,
        &n,
        ("ByoMachine", "m-offline"),
        ("Warning", "HostReleased"),
        "without its agent's clean-up (HostOfflineRelease)",
    )
    .await;

    eventually("timed-out release", Duration::from_secs(20), || async {
        get_bm(&client, &n, "m-slow").await.is_none().then_some(())
    })
    .await;
    let h = get_host(&client, &n, "slow").await;
    let mark = h.spec.needs_cleanup.clone().unwrap();
    assert_eq!(
        (mark.machine_uid.as_str(), mark.reason.as_str()),
        (slow_uid.as_str(), "ReleaseTimedOut")
    );
    // Where an operator looks: a Warning Event on the (gone) ByoMachine naming the reason.
    controller_event(
        &client,
        &n,
        ("ByoMachine", "m-slow"),
        ("Warning", "HostReleased"),
        "without its agent's clean-up (ReleaseTimedOut)",
    )
    .await;
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "not before the timeout"
    );

    // The agent cleans the forced host and says so: the controller clears the mark.
    agent_status(
        &client,
        &n,
        "forced",
        json!({"cleanedMachineUID": forced_uid}),
    )
    .await;
    eventually("needsCleanup cleared", T, || async {
        get_host(&client, &n, "forced")
            .await
            .spec
            .needs_cleanup
            .is_none()
            .then_some(())
    })
    .await;
    // A mark for another UID stays.
    agent_status(
        &client,
        &n,
        "slow",
        json!({"cleanedMachineUID": "someone-else"}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get_host(&client, &n, "slow")
            .await
            .spec
            .needs_cleanup
            .is_some()
    );
    finish(&client, ns, vec![ctl]).await;
}
