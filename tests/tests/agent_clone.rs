//! System test of the clone guard: a host cloned from a registered one (same ByoHost name, a
//! copy of its `/var/lib/byoh` with its key and certificate, but its own `/etc/machine-id`)
//! refuses to act on the original's ByoHost, while the original keeps working.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::time::Duration;

/// Applies this workspace's ByoHost CRD (as `tests/control-plane/up` does with the generated
/// files), so the API server keeps `status.identity` on a test bed started before the field
/// existed, and waits until the served schema has it.
async fn apply_byohost_crd(client: &kube::Client) {
    let crd = byoh_api::crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == "ByoHost")
        .unwrap();
    let name = crd.metadata.name.clone().unwrap();
    let mut value = serde_json::to_value(&crd).unwrap();
    value["apiVersion"] = "apiextensions.k8s.io/v1".into();
    value["kind"] = "CustomResourceDefinition".into();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply("byoh-test-control-plane").force(),
        &Patch::Apply(value),
    )
    .await
    .unwrap();
    // The API server serves a new schema a moment after the update.
    tokio::time::sleep(Duration::from_secs(2)).await;
}

async fn renew_time(leases: &Api<Lease>, name: &str) -> Option<String> {
    let lease = leases.get_opt(name).await.ok()??;
    lease.spec?.renew_time.map(|t| t.0.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_of_a_registered_host_refuses_to_act_and_the_original_keeps_working() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    apply_byohost_crd(&client).await;
    let ns = TestNamespace::create(&client, "agent-clone").await.unwrap();
    // A host pool namespace, for test beds whose admission policy already asks for one (the
    // label is harmless where it does not).
    Api::<Namespace>::all(client.clone())
        .patch(
            ns.name(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": { "labels": { "byoh.infrastructure.cluster.x-k8s.io/host-pool": "true" } }
            })),
        )
        .await
        .unwrap();
    let admin = control_plane::kubeconfig_path().unwrap();
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let leases: Api<Lease> = byoh_tests::objects::host_leases(&client);

    let (original, clone) = {
        let mut booted = Host::boot_many(&["clone-orig", "clone-copy"])
            .await
            .unwrap();
        let clone = booted.pop().unwrap();
        (booted.pop().unwrap(), clone)
    };
    let name = original.name().to_string();
    agent::register(&client, &admin, ns.name(), &original, "")
        .await
        .unwrap();

    // The original recorded its identity: hashes only, never the raw machine-id.
    let registered = wait_for(
        "the ByoHost with its identity",
        Duration::from_secs(30),
        || async {
            Ok(hosts_api
                .get_opt(&name)
                .await?
                .filter(|h| h.status.as_ref().is_some_and(|s| s.identity.is_some())))
        },
    )
    .await
    .unwrap();
    let identity = registered.status.clone().unwrap().identity.unwrap();
    let machine_id = original.read_to_string("/etc/machine-id").await.unwrap();
    let machine_id = machine_id.trim();
    assert_eq!(identity.machine_id_hash.len(), 64, "{identity:?}");
    assert!(
        !serde_json::to_string(&registered)
            .unwrap()
            .contains(machine_id),
        "the raw machine-id must not be published"
    );
    assert!(
        identity
            .key_fingerprint
            .as_ref()
            .is_some_and(|k| k.len() == 64),
        "{identity:?}"
    );

    // The clone: another machine-id (tests/hosts/boot gives each host its own), the original's
    // /etc/byoh and /var/lib/byoh, and the original's name.
    let clone_machine_id = clone.read_to_string("/etc/machine-id").await.unwrap();
    assert_ne!(clone_machine_id.trim(), machine_id);
    let state = original
        .run(&[
            "sh",
            "-c",
            "tar -C / -cf - etc/byoh var/lib/byoh | base64 -w0",
        ])
        .await
        .unwrap();
    let out = clone
        .exec_with_input(
            &["sh", "-c", "base64 -d | tar -C / -xpf -"],
            state.as_bytes(),
        )
        .await
        .unwrap();
    assert!(out.success(), "unpacking the copy in the clone: {out:?}");
    let config = clone.read_to_string("/etc/byoh/agent.toml").await.unwrap();
    clone
        .write_file(
            "/etc/byoh/agent.toml",
            format!("{config}\n[host]\nname = \"{name}\"\n").as_bytes(),
            0o600,
        )
        .await
        .unwrap();
    clone
        .run(&[
            "install",
            "-m",
            "0755",
            agent::AGENT_IN_HOST,
            "/usr/bin/byoh-agent",
        ])
        .await
        .unwrap();
    clone
        .copy_in(
            &agent::repo_root().join("systemd/byoh-agent.service"),
            "/etc/systemd/system/byoh-agent.service",
            0o644,
        )
        .await
        .unwrap();
    clone.run(&["systemctl", "daemon-reload"]).await.unwrap();

    let before = hosts_api.get(&name).await.unwrap();
    let before_status = before.status.clone().unwrap();
    clone
        .run(&["systemctl", "start", "--no-block", "byoh-agent"])
        .await
        .unwrap();

    // The clone refuses with the documented message and stops for good (exit 69, no restart).
    let message = clone
        .wait_for_journal(
            "byoh-agent",
            &format!("refusing to act as ByoHost {}/{name}", ns.name()),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    for needle in [
        "/etc/machine-id differs",
        "remove /var/lib/byoh",
        "set a new [host] name",
        "new bootstrap token",
    ] {
        assert!(message.contains(needle), "{needle:?} missing in: {message}");
    }
    let shown = wait_for(
        "the clone's agent to stop",
        Duration::from_secs(30),
        || async {
            let shown = clone
                .run(&[
                    "systemctl",
                    "show",
                    "byoh-agent",
                    "-p",
                    "ActiveState,ExecMainStatus,NRestarts",
                ])
                .await?;
            Ok(
                (shown.contains("ActiveState=failed") || shown.contains("ActiveState=inactive"))
                    .then_some(shown),
            )
        },
    )
    .await
    .unwrap();
    assert!(
        shown.contains("ExecMainStatus=69") && shown.contains("NRestarts=0"),
        "{shown}"
    );
    assert!(
        !clone
            .journal_messages("byoh-agent")
            .await
            .unwrap()
            .iter()
            .any(|m| m.contains("registered as ByoHost") || m.contains("recording this host")),
        "the clone must not have registered"
    );

    // The original keeps working: its Lease is renewed after the clone gave up, its agent is
    // active, and its ByoHost still carries its own identity and conditions.
    let lease_name = byoh_tests::objects::host_lease_name(ns.name(), &name);
    let last = renew_time(&leases, &lease_name).await.unwrap();
    wait_for(
        "a Lease renewal by the original",
        Duration::from_secs(20),
        || {
            let (leases, name, last) = (leases.clone(), lease_name.clone(), last.clone());
            async move { Ok(renew_time(&leases, &name).await.filter(|t| *t != last)) }
        },
    )
    .await
    .unwrap();
    let active = original
        .run(&["systemctl", "is-active", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(active.trim(), "active");
    let after = hosts_api.get(&name).await.unwrap();
    let after_status = after.status.clone().unwrap();
    assert_eq!(after_status.identity, Some(identity.clone()));
    assert_eq!(after_status.conditions, before_status.conditions);
    assert_eq!(after_status.phase, before_status.phase);
    assert_eq!(after.metadata.labels, before.metadata.labels);

    // A restart of the original matches its record and registers again.
    if let Err(e) = original.run(&["systemctl", "restart", "byoh-agent"]).await {
        let journal = original
            .run(&[
                "journalctl",
                "-u",
                "byoh-agent",
                "--no-pager",
                "-o",
                "short-precise",
                "-n",
                "60",
            ])
            .await
            .unwrap_or_else(|j| format!("(journal not read: {j:#})"));
        panic!("restarting the original's agent: {e:#}\njournal of byoh-agent:\n{journal}");
    }
    let active = original
        .run(&["systemctl", "is-active", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(active.trim(), "active");
    let again = hosts_api.get(&name).await.unwrap();
    assert_eq!(again.status.unwrap().identity, Some(identity));

    clone.stop().await.unwrap();
    original.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
