//! Issue 17 #4: `byoh-agent decommission` on a booted host running the packaged agent
//! (`dist/*.deb`, installed with apt), registered through a BootstrapKubeconfig while
//! `byoh-controller` runs with the RBAC of `infrastructure-components.yaml`: the per-host Role
//! and the admission policies apply as in production, and every outcome is read from the real
//! API server (objects gone, or refused to the attacker) and from the host's systemd.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::access;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::controller::ControllerProcess;
use byoh_tests::hosts::{self, Host};
use byoh_tests::pool;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use std::time::Duration;

/// A kubeadm that only logs its arguments: the claim's bootstrap and the clean-up run it.
const FAKE_KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nexit 0\n";

/// The identity files the decommission removes.
const IDENTITY: &[&str] = &["/var/lib/byoh/kubeconfig", "/var/lib/byoh/pending-csr.json"];

struct Bed {
    admin: Client,
    ns: TestNamespace,
    controller: ControllerProcess,
    host: Host,
    hosts: Api<ByoHost>,
}

/// Components, a pool namespace, the controller, one booted host with the agent from the
/// `.deb`, registered (Available). `None` when a part of the test bed is missing.
async fn setup(label: &str) -> Option<Bed> {
    let admin = control_plane::client().await?;
    if !hosts::available() {
        return None;
    }
    pool::deb_on_machine()?;
    access::install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, label).await.unwrap();
    let kubeconfig = control_plane::kubeconfig_path().unwrap();
    let controller = ControllerProcess::start(&admin, &kubeconfig, ns.name())
        .await
        .unwrap();
    let host = Host::boot(label).await.unwrap();
    host.write_file("/usr/local/bin/kubeadm", FAKE_KUBEADM.as_bytes(), 0o755)
        .await
        .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cluster = kc.clusters[0].cluster.clone().unwrap();
    if let Err(e) = pool::register(
        &admin,
        ns.name(),
        cluster.server.as_deref().unwrap(),
        cluster.certificate_authority_data.as_deref().unwrap(),
        &[(&host, label)],
    )
    .await
    {
        panic!(
            "registering {}: {e:#}\ncontroller:\n{}\n{}",
            host.name(),
            controller.log(),
            pool::journals(std::slice::from_ref(&host)).await
        );
    }
    let hosts = Api::namespaced(admin.clone(), ns.name());
    Some(Bed {
        admin,
        ns,
        controller,
        host,
        hosts,
    })
}

/// `byoh-agent decommission ARGS` on `host`.
async fn decommission(host: &Host, args: &[&str]) -> hosts::ExecOutput {
    let mut all = vec!["byoh-agent", "decommission"];
    all.extend_from_slice(args);
    host.exec(&all).await.unwrap()
}

/// Whether `status` is a refusal (403, by RBAC or an admission policy).
fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> kube::core::Status {
    let s = access::refused(what, r);
    assert_eq!(s.code, 403, "{what}: {s:?}");
    s
}

/// Asserts everything of host `name` is gone: ByoHost, Lease, per-host Role and RoleBinding
/// (the garbage collector's, eventually) as the API server reports them; identity files; the
/// service disabled and inactive.
async fn assert_decommissioned(bed: &Bed) {
    let name = bed.host.name();
    let ns = bed.ns.name();
    assert!(
        bed.hosts.get_opt(name).await.unwrap().is_none(),
        "ByoHost left"
    );
    let leases = byoh_tests::objects::host_leases(&bed.admin);
    assert!(
        leases
            .get_opt(&byoh_tests::objects::host_lease_name(ns, name))
            .await
            .unwrap()
            .is_none(),
        "Lease left"
    );
    let role = format!("byoh-host-{name}");
    let roles: Api<Role> = Api::namespaced(bed.admin.clone(), ns);
    let bindings: Api<RoleBinding> = Api::namespaced(bed.admin.clone(), ns);
    wait_for(
        "the garbage collector to delete the host's Role and RoleBinding",
        Duration::from_secs(60),
        || async {
            Ok(
                (roles.get_opt(&role).await?.is_none() && bindings.get_opt(&role).await?.is_none())
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
    for path in IDENTITY {
        let out = bed.host.exec(&["test", "-e", path]).await.unwrap();
        assert!(!out.success(), "{path} left on the host");
    }
    let enabled = bed
        .host
        .exec(&["systemctl", "is-enabled", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(enabled.stdout.trim(), "disabled", "{}", enabled.stderr);
    let active = bed
        .host
        .exec(&["systemctl", "is-active", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(active.stdout.trim(), "inactive", "{}", active.stderr);
}

/// A registered host refuses to leave while claimed (nothing changes), the attacker cases are
/// refused by the API server, then a free host decommissions completely, and a rerun is a
/// no-op that succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_free_host_decommissions_and_a_claimed_one_refuses() {
    let Some(bed) = setup("decom").await else {
        return;
    };
    let name = bed.host.name().to_string();
    let ns = bed.ns.name().to_string();

    // Claimed (as the controller writes a claim) and bootstrapped: refused, naming the
    // ByoMachine and --force, with nothing changed.
    agent::create_bootstrap_secret(
        &bed.admin,
        &ns,
        "m-decom-bootstrap",
        &agent::cabpk_worker_join(),
    )
    .await
    .unwrap();
    agent::claim_host(
        &bed.admin,
        &ns,
        &name,
        "m-decom",
        "uid-decom-1",
        "m-decom-bootstrap",
    )
    .await
    .unwrap();
    agent::wait_phase(&bed.hosts, &name, "Provisioned", Duration::from_secs(90))
        .await
        .unwrap();
    let out = decommission(&bed.host, &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("ByoMachine m-decom"), "{}", out.stderr);
    assert!(out.stderr.contains("--force"), "{}", out.stderr);
    assert!(bed.hosts.get_opt(&name).await.unwrap().is_some());
    bed.host
        .run(&["systemctl", "is-active", "byoh-agent"])
        .await
        .unwrap();
    bed.host.run(&["test", "-s", IDENTITY[0]]).await.unwrap();

    // Attackers, against the real API server: the claimed host itself may not delete its
    // ByoHost (admission); another host may delete neither its ByoHost nor its Lease (RBAC).
    let own = access::host_client(&name).await.unwrap();
    let s = forbidden(
        "the claimed host deletes its ByoHost",
        Api::<ByoHost>::namespaced(own.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await,
    );
    assert!(s.message.contains("while it is claimed"), "{s:?}");
    let other = access::host_client(&format!("{name}-other")).await.unwrap();
    forbidden(
        "another host deletes the ByoHost",
        Api::<ByoHost>::namespaced(other.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await,
    );
    forbidden(
        "another host deletes the Lease",
        byoh_tests::objects::host_leases(&other)
            .delete(
                &byoh_tests::objects::host_lease_name(&ns, &name),
                &DeleteParams::default(),
            )
            .await,
    );

    // Released as the controller releases (the agent cleans, then the claim goes): free.
    agent::request_release(&bed.admin, &ns, &name)
        .await
        .unwrap();
    wait_for("the agent's clean-up", Duration::from_secs(90), || async {
        Ok(bed.hosts.get_opt(&name).await?.filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.cleaned_machine_uid.as_deref())
                == Some("uid-decom-1")
        }))
    })
    .await
    .unwrap();
    agent::drop_claim(&bed.admin, &ns, &name).await.unwrap();
    agent::wait_phase(&bed.hosts, &name, "Available", Duration::from_secs(60))
        .await
        .unwrap();
    let out = decommission(&bed.host, &[]).await;
    assert!(
        out.success(),
        "{}{}\ncontroller:\n{}",
        out.stdout,
        out.stderr,
        bed.controller.log()
    );
    for step in [
        "Maintenance=True",
        "not claimed",
        "disable byoh-agent.service: disabled",
        "stop byoh-agent.service: inactive",
        &format!("delete Lease byoh-system/{ns}.{name}: deleted"),
        &format!("delete ByoHost {ns}/{name}: deleted"),
        "remove the host's identity: removed /var/lib/byoh/kubeconfig",
    ] {
        assert!(
            out.stdout.contains(step),
            "{step:?} not in:\n{}",
            out.stdout
        );
    }
    assert_decommissioned(&bed).await;

    // A rerun finds everything done and succeeds.
    let out = decommission(&bed.host, &[]).await;
    assert!(out.success(), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("no identity on this host"),
        "{}",
        out.stdout
    );
    assert_decommissioned(&bed).await;

    bed.ns.cleanup(&bed.admin).await.unwrap();
}

fn capi(admin: &Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        admin.clone(),
        ns,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
            plural,
        ),
    )
}

/// `--force` on a host the controller claimed for a Machine: the controller deletes the
/// Machine, the ByoMachine goes (garbage collector), the running agent cleans the host, and the
/// decommission then finishes.
#[tokio::test(flavor = "multi_thread")]
async fn force_releases_a_claimed_host_through_its_machine_then_decommissions() {
    let Some(bed) = setup("decom-force").await else {
        return;
    };
    let name = bed.host.name().to_string();
    let ns = bed.ns.name().to_string();
    let pp = PostParams::default();

    // A Cluster and a worker Machine as CAPI leaves them, and the Machine's ByoMachine.
    let clusters = capi(&bed.admin, &ns, "Cluster", "clusters");
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": ns},
        "spec": {"infrastructureRef": {"apiGroup": byoh_api::GROUP, "kind": "ByoCluster", "name": "c1"}}
    }))
    .unwrap();
    clusters.create(&pp, &cluster).await.unwrap();
    clusters
        .patch_status(
            "c1",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"status": {"initialization": {
                "infrastructureProvisioned": true, "controlPlaneInitialized": true}}})),
        )
        .await
        .unwrap();
    agent::create_machine_bootstrap_data(
        &bed.admin,
        &ns,
        "m1",
        "m1-bootstrap",
        &agent::cabpk_worker_join(),
    )
    .await
    .unwrap();
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m1", "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {
            "clusterName": "c1",
            "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "m1"},
                "dataSecretName": "m1-bootstrap"},
            "infrastructureRef": {"apiGroup": byoh_api::GROUP, "kind": "ByoMachine", "name": "m1"},
        }
    }))
    .unwrap();
    let machine = capi(&bed.admin, &ns, "Machine", "machines")
        .create(&pp, &machine)
        .await
        .unwrap();
    let bm: byoh_api::ByoMachine = serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", byoh_api::GROUP, byoh_api::VERSION),
        "kind": "ByoMachine",
        "metadata": {
            "name": "m1", "namespace": ns,
            "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "name": "m1", "uid": machine.uid(), "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {}
    }))
    .unwrap();
    let bms: Api<byoh_api::ByoMachine> = Api::namespaced(bed.admin.clone(), &ns);
    bms.create(&pp, &bm).await.unwrap();
    if let Err(e) =
        agent::wait_phase(&bed.hosts, &name, "Provisioned", Duration::from_secs(90)).await
    {
        panic!(
            "{e:#}\ncontroller:\n{}\n{}",
            bed.controller.log(),
            pool::journals(std::slice::from_ref(&bed.host)).await
        );
    }

    // Without --force: refused, the claim stays.
    let out = decommission(&bed.host, &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("ByoMachine m1"), "{}", out.stderr);

    let out = decommission(&bed.host, &["--force", "--timeout", "3m"]).await;
    assert!(
        out.success(),
        "{}{}\ncontroller:\n{}\n{}",
        out.stdout,
        out.stderr,
        bed.controller.log(),
        pool::journals(std::slice::from_ref(&bed.host)).await
    );
    assert!(
        out.stdout
            .contains("asked the controller to release the claim of ByoMachine m1"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("released and cleaned"),
        "{}",
        out.stdout
    );
    // The controller deleted the Machine; the ByoMachine went with it once the host was clean.
    assert!(
        capi(&bed.admin, &ns, "Machine", "machines")
            .get_opt("m1")
            .await
            .unwrap()
            .is_none()
    );
    wait_for(
        "the ByoMachine to be gone",
        Duration::from_secs(60),
        || async { Ok(bms.get_opt("m1").await?.is_none().then_some(())) },
    )
    .await
    .unwrap();
    // The clean-up ran (kubeadm reset by the agent), before the host left.
    let log = bed
        .host
        .run(&["cat", "/run/byoh-test-kubeadm.log"])
        .await
        .unwrap();
    assert!(log.contains("reset"), "{log}");
    assert_decommissioned(&bed).await;

    bed.ns.cleanup(&bed.admin).await.unwrap();
}
