//! System test of issue 37 (a stuck bootstrap): a host whose `kubeadm join` hangs is released
//! by the controller — as it is when a MachineHealthCheck remediates the Machine for
//! `NodeStartupTimeout` — and the agent stops the join at once (its process group killed, not
//! left until `[bootstrap] command_timeout`, 30 min by default), says so in a Warning Event
//! `BootstrapAborted`, cleans up, and the host is back `Available` as it was before the claim.
//! The claim and its release are written by the test as the controller would (the Cluster API
//! remediation of a failing bootstrap is in capi_remediation).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use std::time::Duration;

/// A stand-in `kubeadm` whose `join` never returns (it records its PID first); every other
/// subcommand (the clean-up's `reset`) succeeds.
const HANGING_KUBEADM: &str = "#!/bin/sh\nif [ \"$1\" = join ]; then echo $$ > /run/byoh-test-join.pid; exec sleep 3600; fi\nexit 0\n";

const UID: &str = "uid-hang-0001";

/// Whether process `pid` of the host is alive (a zombie is not).
async fn alive(host: &Host, pid: &str) -> bool {
    host.exec(&[
        "sh",
        "-c",
        &format!("test -e /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status"),
    ])
    .await
    .unwrap()
    .success()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_released_while_kubeadm_join_hangs_stops_the_join_and_the_host_comes_back_clean() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "hostwork-abort")
        .await
        .unwrap();
    let host = Host::boot("hostwork-abort").await.unwrap();
    let name = host.name().to_string();
    host.write_file("/usr/local/bin/kubeadm", HANGING_KUBEADM.as_bytes(), 0o755)
        .await
        .unwrap();
    let hosts = agent::register_in(&client, ns.name(), &host).await.unwrap();
    let before = agent::snapshot(&host).await.unwrap();

    agent::create_bootstrap_secret(
        &client,
        ns.name(),
        "hang-bootstrap",
        &agent::cabpk_worker_join(),
    )
    .await
    .unwrap();
    agent::claim_host(&client, ns.name(), &name, "hang", UID, "hang-bootstrap")
        .await
        .unwrap();
    // The join runs and does not end.
    let pid = wait_for("kubeadm join running", Duration::from_secs(90), || async {
        let pid = host.read_to_string("/run/byoh-test-join.pid").await.ok();
        Ok(match pid.map(|p| p.trim().to_string()) {
            Some(p) if alive(&host, &p).await => Some(p),
            _ => None,
        })
    })
    .await
    .unwrap();
    let phase = hosts.get_status(&name).await.unwrap().status.unwrap().phase;
    assert_eq!(
        phase.as_deref(),
        Some("Bootstrapping"),
        "the host reports the bootstrap under way"
    );

    // The Machine is remediated: the controller asks for the host back.
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    let released = std::time::Instant::now();
    wait_for("the hung join stopped", Duration::from_secs(30), || async {
        Ok((!alive(&host, &pid).await).then_some(()))
    })
    .await
    .unwrap();
    let stopped_after = released.elapsed();
    byoh_tests::packages_claim::wait_released(&client, ns.name(), &hosts, &name, UID).await;
    eprintln!(
        "hostwork_abort: the hung join was stopped {:.1} s after the release was requested",
        stopped_after.as_secs_f64()
    );

    // Told on the ByoHost: the abort, never a failure of the bootstrap.
    let reasons = wait_for(
        "the BootstrapAborted Event",
        Duration::from_secs(30),
        || async {
            let events =
                byoh_tests::objects::events_about(&client, ns.name(), "ByoHost", &name).await;
            let reasons: Vec<(String, String)> = events
                .into_iter()
                .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
                .collect();
            Ok(reasons
                .iter()
                .any(|(_, r)| r == "Cleaned")
                .then_some(reasons))
        },
    )
    .await
    .unwrap();
    assert!(
        reasons.contains(&("Warning".into(), "BootstrapAborted".into())),
        "{reasons:?}"
    );
    assert!(
        !reasons.iter().any(|(_, r)| r == "BootstrapFailed"),
        "{reasons:?}"
    );
    let journal = host
        .run(&["journalctl", "-u", "byoh-agent", "--no-pager", "-o", "cat"])
        .await
        .unwrap();
    assert!(
        journal.contains("the claim was released while the bootstrap's commands ran"),
        "the agent's journal tells why the join stopped"
    );

    // Nothing of the claim is left; the stand-in kubeadm, there before, still is.
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    assert!(
        host.exec(&["test", "-e", "/usr/local/bin/kubeadm"])
            .await
            .unwrap()
            .success()
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
