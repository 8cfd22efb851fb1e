//! System test of how the installer meets a unit that fails to start, on a booted host with
//! Debian's containerd (whose unit has `Restart=always`, `RestartSec=5`), through a real claim
//! with a tarball install (which restarts containerd for its cgroup driver):
//! - containerd fails its first start and systemd starts it again by itself (a busy machine,
//!   a slow disk): the install goes on and the host is Provisioned, nothing undone;
//! - containerd fails every start: the install fails within the restart grace, the conditions
//!   say how (`its main process exited with status 7`) and where to look (`journalctl -u
//!   containerd.service`, once), and what the install changed is reverted.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use byoh_tests::packages_claim::{condition, exists, release, wait_phase};
use byoh_tests::tarball;

/// Bootstrap data that only says it succeeded.
const SUCCEED: &str = "#cloud-config\nruncmd:\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// A drop-in of containerd.service on the host: `service` is its `[Service]` body.
async fn containerd_drop_in(host: &Host, service: &str) {
    host.write_file(
        "/etc/systemd/system/containerd.service.d/byoh-test.conf",
        format!("[Service]\n{service}").as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "daemon-reload"]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unit_that_fails_to_start_is_waited_for_while_systemd_restarts_it_and_reported_when_it_stays_down()
 {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "unit-restart")
        .await
        .unwrap();
    let host = Host::boot("unit-restart").await.unwrap();
    let name = host.name().to_string();
    let byohosts = agent::register_in(&client, ns.name(), &host).await.unwrap();
    let server = tarball::server().await.unwrap();
    tarball::create_config(&client, ns.name(), "good", &server, None)
        .await
        .unwrap();
    agent::create_bootstrap_secret(&client, ns.name(), "data", SUCCEED)
        .await
        .unwrap();
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();

    // Fails once, then starts: the install waits for systemd's own restart and goes on.
    containerd_drop_in(
        &host,
        "ExecStartPre=/bin/sh -c 'test -e /run/byoh-test-failed-once && exit 0; touch /run/byoh-test-failed-once; exit 7'\n",
    )
    .await;
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-once",
        "uid-once-01",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(&byohosts, &name, "Provisioned", 120).await;
    assert!(
        exists(&host, "/run/byoh-test-failed-once").await,
        "containerd never failed: the test proved nothing"
    );
    assert_eq!(
        host.run(&["systemctl", "is-active", "containerd.service"])
            .await
            .unwrap()
            .trim(),
        "active"
    );
    release(&client, ns.name(), &byohosts, &name, "uid-once-01").await;

    // Fails every time: the claim fails with the exit status, and the install is reverted.
    containerd_drop_in(&host, "ExecStart=\nExecStart=/bin/sh -c 'exit 7'\n").await;
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-down",
        "uid-down-01",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(&byohosts, &name, "Failed", 180).await;
    let installed = condition(&byohosts, &name, "K8sComponentsInstalled")
        .await
        .unwrap();
    let message = installed.message;
    assert_eq!(installed.reason, "InstallationFailed", "{message}");
    for want in [
        "restarting containerd.service",
        "its main process exited with status 7",
        "what the install had changed was reverted",
    ] {
        assert!(message.contains(want), "{want:?} not in {message}");
    }
    assert_eq!(
        message
            .matches("see journalctl -u containerd.service")
            .count(),
        1,
        "{message}"
    );
    assert!(
        !exists(&host, "/usr/local/bin/kubelet").await,
        "not reverted"
    );
    assert!(!exists(&host, "/run/cluster-api/bootstrap-success.complete").await);
    host.run(&[
        "rm",
        "/etc/systemd/system/containerd.service.d/byoh-test.conf",
    ])
    .await
    .unwrap();
    host.run(&["systemctl", "daemon-reload"]).await.unwrap();
    release(&client, ns.name(), &byohosts, &name, "uid-down-01").await;
    ns.cleanup(&client).await.unwrap();
}
