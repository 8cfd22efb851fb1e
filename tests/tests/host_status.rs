//! System test of issue 20 (status that goes backwards or lies): a registered agent on a booted
//! host is claimed with a K8sInstallerConfig (the loopback `tarball` stand-ins), bootstraps and
//! is released, while a watch records every phase the ByoHost passes through and its conditions
//! as it enters each. The phases move forward only, in the order docs/architecture.md gives
//! ("ByoHost phases"), and every condition says something true at each step: after the release
//! nothing is installed and no kubelet runs, and a free host's conditions read as normal, not
//! as faults. The agent's journal of it holds no warning, and its lines carry their detail
//! (the download with version, URL and sha256, each uninstall step, the kubeadm reset and its
//! duration). The claim is written by the test as the controller would.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use byoh_tests::tarball;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bootstrap data that joins with the kubeadm stand-in and reports success.
const JOIN: &str = "#cloud-config\nruncmd:\n- [ \"/usr/local/bin/kubeadm\", \"join\", \"--config\", \"/dev/null\" ]\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// Each phase the watch saw the ByoHost enter, with its conditions at that moment.
type Seen = Arc<Mutex<Vec<(String, Vec<Condition>)>>>;

/// Records into `seen` every change of the phase of ByoHost `name`, until aborted.
fn record_phases(hosts: Api<ByoHost>, name: &str, seen: Seen) -> tokio::task::JoinHandle<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = watcher(hosts, config).applied_objects().boxed();
        while let Some(event) = events.next().await {
            let Ok(host) = event else { continue };
            let status = host.status.unwrap_or_default();
            let Some(phase) = status.phase else { continue };
            let mut seen = seen.lock().unwrap();
            if seen.last().map(|(p, _)| p) != Some(&phase) {
                seen.push((phase, status.conditions));
            }
        }
    })
}

/// `(status, reason)` of condition `type_` in `conds`, or `("absent", "")`.
fn state<'a>(conds: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
    conds
        .iter()
        .find(|c| c.type_ == type_)
        .map_or(("absent", ""), |c| (c.status.as_str(), c.reason.as_str()))
}

/// Waits until ByoHost `name` has condition `type_` with `status` and `reason`; returns it.
async fn wait_condition(
    hosts: &Api<ByoHost>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> Condition {
    let what = format!("{type_}={status} ({reason})");
    wait_for(&what, Duration::from_secs(60), || async {
        Ok(hosts.get_status(name).await?.status.and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == type_ && c.status == status && c.reason == reason)
        }))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_and_its_release_move_the_phase_forward_and_keep_every_condition_true() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "host-status").await.unwrap();
    let host = Host::boot("host-status").await.unwrap();
    let name = host.name().to_string();
    // containerd runs as on a real host (the installer restarts it for its cgroup driver).
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();
    let hosts = agent::register_in(&client, ns.name(), &host).await.unwrap();

    // A free host: no kubelet, which is its normal state, not a fault.
    let kubelet = wait_condition(&hosts, &name, "KubeletActive", "False", "WaitingForClaim").await;
    assert!(kubelet.message.contains("not-found"), "{}", kubelet.message);
    wait_condition(&hosts, &name, "ContainerdActive", "True", "AsExpected").await;

    let seen: Seen = Arc::default();
    let recorder = record_phases(hosts.clone(), &name, seen.clone());
    let server = tarball::server().await.unwrap();
    tarball::create_config(&client, ns.name(), "stand-ins", &server, None)
        .await
        .unwrap();
    agent::create_bootstrap_secret(&client, ns.name(), "data", JOIN)
        .await
        .unwrap();
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m1",
        "uid-status-01",
        "data",
        Some(("stand-ins", tarball::VERSION)),
    )
    .await
    .unwrap();
    let done = agent::wait_phase(&hosts, &name, "Provisioned", Duration::from_secs(120))
        .await
        .unwrap();
    let conds = done.status.unwrap().conditions;
    for (type_, want) in [
        ("Ready", ("True", "AsExpected")),
        ("BootstrapSucceeded", ("True", "AsExpected")),
        ("K8sComponentsInstalled", ("True", "AsExpected")),
    ] {
        assert_eq!(state(&conds, type_), want, "{type_} when Provisioned");
    }
    wait_condition(&hosts, &name, "KubeletActive", "True", "AsExpected").await;

    // The release: reset, uninstall, report; the controller drops the claim.
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_for("cleanedMachineUID", Duration::from_secs(60), || async {
        Ok(hosts
            .get_status(&name)
            .await?
            .status
            .filter(|s| s.cleaned_machine_uid.as_deref() == Some("uid-status-01")))
    })
    .await
    .unwrap();
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_condition(&hosts, &name, "Ready", "True", "WaitingForClaim").await;
    // The kubelet is stopped and uninstalled: back to the free host's neutral state.
    wait_condition(&hosts, &name, "KubeletActive", "False", "WaitingForClaim").await;
    let free = hosts.get_status(&name).await.unwrap().status.unwrap();
    assert_eq!(free.phase.as_deref(), Some("Available"));
    for (type_, want) in [
        ("BootstrapSucceeded", ("False", "WaitingForClaim")),
        ("K8sComponentsInstalled", ("False", "WaitingForClaim")),
        ("CleanupSucceeded", ("True", "AsExpected")),
        ("ContainerdActive", ("True", "AsExpected")),
    ] {
        assert_eq!(
            state(&free.conditions, type_),
            want,
            "{type_} after the release"
        );
    }
    recorder.abort();

    // The phases, in the order the watch saw them enter, with the conditions they came with.
    let seen = seen.lock().unwrap().clone();
    let phases: Vec<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        phases,
        [
            "Available",
            "Installing",
            "Bootstrapping",
            "Provisioned",
            "CleaningUp",
            "Available"
        ],
        "the phase must move forward only"
    );
    let expect = |i: usize, type_: &str, want: (&str, &str)| {
        assert_eq!(
            state(&seen[i].1, type_),
            want,
            "{type_} on entering {}",
            seen[i].0
        );
    };
    expect(1, "Ready", ("True", "WaitingForBootstrap"));
    expect(1, "BootstrapSucceeded", ("False", "WaitingForBootstrap"));
    expect(
        1,
        "K8sComponentsInstalled",
        ("False", "WaitingForBootstrap"),
    );
    expect(2, "K8sComponentsInstalled", ("True", "AsExpected"));
    expect(2, "BootstrapSucceeded", ("False", "WaitingForBootstrap"));
    expect(3, "BootstrapSucceeded", ("True", "AsExpected"));
    expect(4, "CleanupSucceeded", ("False", "Releasing"));
    expect(5, "CleanupSucceeded", ("True", "AsExpected"));
    expect(5, "K8sComponentsInstalled", ("False", "WaitingForClaim"));
    expect(5, "BootstrapSucceeded", ("False", "WaitingForClaim"));
    expect(5, "Ready", ("True", "Releasing"));

    // The agent's journal of this normal claim and release (issue 20 #4): no warning, and each
    // line says what happened with its detail.
    let journal = host.journal("byoh-agent").await.unwrap();
    let warnings: Vec<&serde_json::Value> = journal
        .iter()
        .filter(|e| {
            e["PRIORITY"]
                .as_str()
                .and_then(|p| p.parse::<u8>().ok())
                .is_some_and(|p| p <= 4)
        })
        .map(|e| &e["MESSAGE"])
        .collect();
    assert!(
        warnings.is_empty(),
        "a normal claim and release logged warnings: {warnings:#?}"
    );
    let messages = host.journal_messages("byoh-agent").await.unwrap();
    let has = |prefix: &str| messages.iter().any(|m| m.starts_with(prefix));
    for line in [
        format!(
            "downloading kubeadm {} from {}/kubeadm (sha256 ",
            tarball::VERSION,
            server.base()
        ),
        "kubeadm reset succeeded in ".into(),
        "uninstall: delete /usr/local/bin/kubelet: done".into(),
        "claim by ByoMachine m1 accepted".into(),
        "bootstrap for ByoMachine m1 succeeded".into(),
    ] {
        assert!(
            has(&line),
            "no journal line starts with {line:?}: {messages:#?}"
        );
    }
    // Structured fields stay next to the text.
    let reset = journal
        .iter()
        .find(|e| {
            e["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.starts_with("kubeadm reset succeeded"))
        })
        .unwrap();
    assert!(reset["DURATION_SECS"].is_string(), "{reset}");
    assert!(
        !messages.iter().any(|m| m.contains("s3cr3t")),
        "a URL's token reached the journal"
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
