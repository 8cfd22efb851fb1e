//! Issue 37 on the real API server: a host whose bootstrap failed is not handed out again at
//! once. The ByoMachine reconciler runs in-process (`byoh_controller::run::run`, admin
//! client); the host's side is written as the agent writes it (status merge patches), the
//! Machines' as Cluster API writes them (a MachineHealthCheck's `HealthCheckSucceeded`
//! condition on the Machine's status, the Machine's deletion as a MachineSet's remediation
//! does).
//!
//! Asserted: a claim the host reports `Failed` shows on the ByoMachine (`Ready=False` with the
//! host's reason and message); its release records the failure on the ByoHost (annotation
//! `byoh.infrastructure.cluster.x-k8s.io/bootstrap-failures`, count 1); the next ByoMachine
//! gets no host while the back-off runs and says so (`BootstrapBackOff`, when it ends); an
//! administrator's removal of the annotation frees the host at once; each of these steps is an
//! Event too (`BootstrapFailed` on the ByoHost, `HostReleased`, `NoHostAvailable` and
//! `HostClaimed` on the ByoMachines). With a short back-off:
//! a Machine remediated for `NodeStartupTimeout` while the host was still bootstrapping counts
//! as a failure too (count 1 again: the reset cleared the history); the next ByoMachine gets
//! the host once the back-off has passed, without any event of the host; a successful
//! bootstrap removes the record.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::{ByoHost, ByoMachine, labels};
use byoh_controller::bootstrap_failures::{BackOff, BootstrapFailures, recorded};
use byoh_controller::run::Settings;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::*;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);
const HOST: &str = "host-1";

/// Creates ByoMachine (and Machine) `name`, waits for it to claim [`HOST`], returns its UID.
async fn claimed(client: &kube::Client, ns: &str, name: &str) -> String {
    let uid = create_machine(client, ns, "c1", name, &MachineOpts::ready())
        .await
        .uid()
        .unwrap();
    eventually(&format!("{name} claims {HOST}"), T, || async {
        let h = get_host(client, ns, HOST).await;
        (h.claimed_by() == Some(uid.as_str())).then_some(())
    })
    .await;
    uid
}

/// The ByoHost's status as the agent writes it for claim `uid` in `phase`, with
/// `BootstrapSucceeded` `(status, reason, message)`.
async fn host_reports(
    client: &kube::Client,
    ns: &str,
    uid: &str,
    phase: &str,
    bootstrap: (&str, &str, &str),
) {
    let (status, reason, message) = bootstrap;
    agent_status(
        client,
        ns,
        HOST,
        json!({
            "phase": phase,
            "observedMachineUID": uid,
            "conditions": [
                {"type": "Registered", "status": "True", "reason": "AsExpected", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "BootstrapSucceeded", "status": status, "reason": reason, "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        }),
    )
    .await;
}

/// Deletes ByoMachine `name`, waits for the release request, then deletes its Machine, as a
/// remediation goes (the Machine, kept by Cluster API's finalizer until its ByoMachine is gone,
/// is deleted first there); returns the host's failure record at the release request.
async fn remediated(client: &kube::Client, ns: &str, name: &str) -> Option<BootstrapFailures> {
    Api::<ByoMachine>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    let host = eventually(&format!("release of {name} requested"), T, || async {
        let h = get_host(client, ns, HOST).await;
        h.spec.claim.as_ref().filter(|c| c.release_requested)?;
        Some(h)
    })
    .await;
    machines(client, ns)
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    recorded(&host)
}

/// The agent's clean-up of claim `uid`: the host Available again, the claim dropped.
async fn cleaned(client: &kube::Client, ns: &str, uid: &str) {
    agent_status(
        client,
        ns,
        HOST,
        json!({"phase": "Available", "cleanedMachineUID": uid}),
    )
    .await;
    eventually("the claim dropped after the clean-up", T, || async {
        get_host(client, ns, HOST)
            .await
            .spec
            .claim
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_whose_bootstrap_failed_is_held_back_until_its_back_off_passes_or_an_administrator_resets_it()
 {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-bootfail")
        .await
        .unwrap();
    let n = ns.name().to_string();
    let start = |base: u64| {
        let b = Duration::from_secs(base);
        Running::start(
            &client,
            &n,
            Settings {
                bootstrap_backoff: BackOff { base: b, max: b },
                ..settings()
            },
        )
    };
    // A back-off far longer than the test: only the administrator's reset frees the host.
    let ctl = start(3600);
    ready_cluster(&client, &n, "c1").await;
    create_host(&client, &n, HOST, &HostOpts::default()).await;

    // m1's bootstrap fails on the host (its own package policy, say): the ByoMachine says so.
    let uid1 = claimed(&client, &n, "m1").await;
    let message = "installing kubeadm=1.36.1-1.1: apt-get exited with status 100";
    host_reports(
        &client,
        &n,
        &uid1,
        "Failed",
        ("False", "InstallationFailed", message),
    )
    .await;
    let bm = eventually("m1 reports the host's failure", T, || async {
        let bm = get_bm(&client, &n, "m1").await?;
        (bm_condition(&bm, "Ready") == Some(("False".into(), "InstallationFailed".into())))
            .then_some(bm)
    })
    .await;
    let ready = condition(&bm.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert!(
        ready.message.contains(HOST) && ready.message.contains(message),
        "{}",
        ready.message
    );

    // Remediated: the release records the failure before the agent's clean-up.
    let record = remediated(&client, &n, "m1")
        .await
        .expect("a failure record");
    assert_eq!(
        (
            record.count,
            record.machine.as_str(),
            record.machine_uid.as_str()
        ),
        (1, "m1", uid1.as_str())
    );
    // And says so where an operator looks: a Warning Event on the ByoHost.
    let note = controller_event(
        &client,
        &n,
        ("ByoHost", HOST),
        ("Warning", "BootstrapFailed"),
        "Machine m1",
    )
    .await;
    assert!(
        note.contains("1 in a row") && note.contains("held back from new claims until"),
        "{note}"
    );
    cleaned(&client, &n, &uid1).await;
    // The claim dropped after the agent's clean-up: a Normal Event on the ByoMachine.
    let note = controller_event(
        &client,
        &n,
        ("ByoMachine", "m1"),
        ("Normal", "HostReleased"),
        HOST,
    )
    .await;
    assert_eq!(
        note,
        format!("ByoHost {HOST} reset by its agent and back in the pool")
    );

    // The next ByoMachine waits, and says for what and until when.
    create_machine(&client, &n, "c1", "m2", &MachineOpts::ready()).await;
    let bm = eventually("m2 waits for a host", T, || async {
        let bm = get_bm(&client, &n, "m2").await?;
        (bm_condition(&bm, "Ready") == Some(("False".into(), "NoHostAvailable".into())))
            .then_some(bm)
    })
    .await;
    let waiting = condition(&bm.status.as_ref().unwrap().conditions, "Ready").unwrap();
    assert!(
        waiting.message.contains("1 BootstrapBackOff")
            && waiting
                .message
                .contains("back-off after failed bootstraps ends at"),
        "{}",
        waiting.message
    );
    controller_event(
        &client,
        &n,
        ("ByoMachine", "m2"),
        ("Warning", "NoHostAvailable"),
        "1 BootstrapBackOff",
    )
    .await;
    assert!(get_host(&client, &n, HOST).await.spec.claim.is_none());

    // The administrator fixed the host and removes the record: m2 gets it at once.
    Api::<ByoHost>::namespaced(client.clone(), &n)
        .patch(
            HOST,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {labels::BOOTSTRAP_FAILURES: null}}})),
        )
        .await
        .unwrap();
    let uid2 = eventually("m2 claims the host after the reset", T, || async {
        let h = get_host(&client, &n, HOST).await;
        h.claimed_by().map(str::to_string)
    })
    .await;
    let note = controller_event(
        &client,
        &n,
        ("ByoMachine", "m2"),
        ("Normal", "HostClaimed"),
        HOST,
    )
    .await;
    assert_eq!(note, format!("claimed ByoHost {HOST}"));
    ctl.stop().await;

    // A short back-off from here on.
    let ctl = start(4);
    // m2's join hangs; a MachineHealthCheck finds its Node never came and the MachineSet
    // deletes the Machine: a failure, though the host never reported one.
    host_reports(
        &client,
        &n,
        &uid2,
        "Bootstrapping",
        ("False", "Bootstrapping", "running kubeadm join"),
    )
    .await;
    machines(&client, &n)
        .patch_status(
            "m2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "HealthCheckSucceeded", "status": "False", "reason": "NodeStartupTimeout", "message": "Health check failed: Node failed to report startup in 4m0s", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}})),
        )
        .await
        .unwrap();
    // The controller reads the Machine from its watch cache: give the watch a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let record = remediated(&client, &n, "m2")
        .await
        .expect("a failure record");
    assert_eq!(
        (record.count, record.machine_uid.as_str()),
        (1, uid2.as_str()),
        "counted from the reset"
    );
    cleaned(&client, &n, &uid2).await;

    // m3 gets the host once the back-off has passed, with no event of the host in between.
    create_machine(&client, &n, "c1", "m3", &MachineOpts::ready()).await;
    let host = eventually("m3 claims the host after the back-off", T, || async {
        let h = get_host(&client, &n, HOST).await;
        h.spec.claim.is_some().then_some(h)
    })
    .await;
    let claim = host.spec.claim.as_ref().unwrap();
    let uid3 = claim.machine_ref.uid.clone();
    let claimed_at = claim.claimed_at.as_ref().unwrap().0;
    // `claimedAt` has whole seconds.
    let ends = record.last_failure + k8s_openapi::jiff::SignedDuration::from_secs(3);
    assert!(
        claim.machine_ref.name == "m3" && claimed_at >= ends,
        "claimed by {} at {claimed_at}, before the back-off ended at {ends}",
        claim.machine_ref.name
    );
    // Its bootstrap succeeds: the record goes.
    host_reports(
        &client,
        &n,
        &uid3,
        "Provisioned",
        ("True", "AsExpected", ""),
    )
    .await;
    eventually(
        "the record removed after a successful bootstrap",
        T,
        || async {
            recorded(&get_host(&client, &n, HOST).await)
                .is_none()
                .then_some(())
        },
    )
    .await;
    finish(&client, ns, vec![ctl]).await;
}
