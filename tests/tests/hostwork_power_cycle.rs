//! Issue 37: a host that dies while it is a node and comes back after Cluster API replaced it.
//! On a booted host with the agent registered, a stand-in kubelet unit — enabled, as kubeadm's
//! packages leave it — records every start on the host's disk, and a stand-in kubeadm's `join`
//! starts it as kubeadm's `kubelet-start` phase does. The host is claimed and provisioned,
//! switched off (`tests/hosts/stop --keep-state`), its claim released while it is off (as the
//! controller does for a host whose Lease expired), and switched on again.
//!
//! Asserted: the kubelet does not start at boot — before issue 37 systemd started it before the
//! agent had asked the management cluster anything, and a real kubelet registered its Node again
//! in a cluster that had replaced it — the agent cleans the host up and offers it again; and a
//! host switched off and on while its claim still holds starts its kubelet once the agent has
//! confirmed the claim (the node comes back). The remedies of a ByoRemediation on such a host:
//! a restart of its services, a reboot that brings the node back and is not repeated.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::Host;
use kube::Api;
use std::time::Duration;

/// A stand-in kubeadm: `join` starts the kubelet, as kubeadm's `kubelet-start` phase does.
const FAKE_KUBEADM: &str = "#!/bin/sh\nif [ \"$1\" = join ]; then systemctl restart kubelet.service || exit 1; fi\nexit 0\n";
/// A stand-in kubelet: `--version` answers as a kubelet does (the agent asks it for its
/// facts); each start appends a line to a file on the host's disk (under /var/log, which a
/// power cycle keeps), then it runs until stopped.
const FAKE_KUBELET: &str = "#!/bin/sh\ncase \"$1\" in --version) echo 'Kubernetes v1.36.3'; exit 0;; esac\necho start >> /var/log/byoh-test-kubelet.starts\nexec sleep infinity\n";
/// Its unit, enabled like the packaged kubelet's (restarted by systemd like it).
const KUBELET_UNIT: &str = "[Unit]\nDescription=stand-in kubelet\n[Service]\nExecStart=/usr/local/bin/kubelet\nRestart=always\nRestartSec=2\n[Install]\nWantedBy=multi-user.target\n";

/// How often the stand-in kubelet has started.
async fn kubelet_starts(host: &Host) -> usize {
    host.read_to_string("/var/log/byoh-test-kubelet.starts")
        .await
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

async fn kubelet_active(host: &Host) -> String {
    host.exec(&["systemctl", "is-active", "kubelet.service"])
        .await
        .unwrap()
        .stdout
        .trim()
        .to_string()
}

/// In a namespace of its own, a registered host with the stand-in kubelet and `kubeadm` as its
/// kubeadm, claimed by Machine `machine` (ByoMachine UID `uid`). `None` when a part of the test
/// bed is missing.
async fn claimed(
    label: &str,
    kubeadm: &str,
    machine: &str,
    uid: &str,
) -> Option<(kube::Client, TestNamespace, Host, Api<ByoHost>)> {
    let client = control_plane::client().await?;
    if !byoh_tests::hosts::available() {
        return None;
    }
    let ns = TestNamespace::create(&client, label).await.unwrap();
    let host = Host::boot(label).await.unwrap();
    host.write_file("/usr/local/bin/kubeadm", kubeadm.as_bytes(), 0o755)
        .await
        .unwrap();
    host.write_file("/usr/local/bin/kubelet", FAKE_KUBELET.as_bytes(), 0o755)
        .await
        .unwrap();
    host.write_file(
        "/etc/systemd/system/kubelet.service",
        KUBELET_UNIT.as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "enable", "kubelet.service"])
        .await
        .unwrap();
    let hosts = agent::register_in(&client, ns.name(), &host).await.unwrap();
    let secret = format!("{machine}-bootstrap");
    agent::create_bootstrap_secret(&client, ns.name(), &secret, &agent::cabpk_worker_join())
        .await
        .unwrap();
    agent::claim_host(&client, ns.name(), host.name(), machine, uid, &secret)
        .await
        .unwrap();
    Some((client, ns, host, hosts))
}

/// [`claimed`] with the stand-in kubeadm, and provisioned: its kubelet started once.
async fn provisioned(
    label: &str,
    machine: &str,
    uid: &str,
) -> Option<(kube::Client, TestNamespace, Host, Api<ByoHost>)> {
    let (client, ns, host, hosts) = claimed(label, FAKE_KUBEADM, machine, uid).await?;
    agent::wait_phase(&hosts, host.name(), "Provisioned", Duration::from_secs(60))
        .await
        .unwrap();
    // `systemctl restart` returns once the stand-in's process is forked: its start line may be
    // written a moment after the agent reports Provisioned (CI's warm run of 464e33f read 0).
    let starts = wait_for(
        "the stand-in kubelet to record its start",
        Duration::from_secs(30),
        || async { Ok(Some(kubelet_starts(&host).await).filter(|n| *n > 0)) },
    )
    .await
    .unwrap();
    assert_eq!(starts, 1, "kubeadm join starts the kubelet");
    assert_eq!(kubelet_active(&host).await, "active");
    Some((client, ns, host, hosts))
}

/// Reboots `host` the way its own systemd does (`systemctl reboot` inside; an nspawn host then
/// ends) and starts it again, as the machine's firmware would.
async fn reboot(host: &Host) {
    let nspawn = host.nspawn_pid().unwrap();
    // Its exit status may be the kill of the going-down host's processes: not asserted.
    host.exec(&["systemctl", "reboot"]).await.unwrap();
    wait_until_down(nspawn).await;
    host.power_off().await.unwrap();
    host.power_on().await.unwrap();
}

/// Waits until the host whose nspawn is PID `nspawn` has gone down by itself.
async fn wait_until_down(nspawn: u32) {
    wait_for("the host going down", Duration::from_secs(60), || async {
        Ok((!std::path::Path::new(&format!("/proc/{nspawn}")).exists()).then_some(()))
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_released_while_off_does_not_start_its_kubelet_when_it_comes_back() {
    let Some((client, ns, host, hosts)) =
        provisioned("power-cycle-released", "m1", "uid-pc-0001").await
    else {
        return;
    };
    let name = host.name().to_string();

    host.power_off().await.unwrap();
    // The controller releases a host whose Lease expired: the claim goes, the host's own record
    // of it is what the agent cleans up after.
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    host.power_on().await.unwrap();

    wait_for(
        "the host cleaned up and offered again",
        Duration::from_secs(120),
        || async {
            Ok(hosts.get_opt(&name).await?.filter(|h| {
                h.status.as_ref().is_some_and(|s| {
                    s.cleaned_machine_uid.as_deref() == Some("uid-pc-0001")
                        && s.phase.as_deref() == Some("Available")
                })
            }))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        kubelet_starts(&host).await,
        1,
        "the kubelet of a released node started when the host came back (a real one registers its Node again)"
    );
    assert_eq!(kubelet_active(&host).await, "inactive");
    let journal = host.journal_messages("kubelet").await.unwrap().join("\n");
    assert!(
        journal.contains("skipped because of an unmet condition check")
            || journal.contains("being skipped"),
        "systemd's journal says why the kubelet did not start at boot:\n{journal}"
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_claim_holds_starts_its_kubelet_once_the_agent_confirms_it() {
    let Some((client, ns, host, hosts)) =
        provisioned("power-cycle-kept", "m2", "uid-pc-0002").await
    else {
        return;
    };
    let name = host.name().to_string();

    host.power_off().await.unwrap();
    host.power_on().await.unwrap();
    wait_for(
        "the kubelet started again",
        Duration::from_secs(90),
        || async { Ok((kubelet_starts(&host).await == 2).then_some(())) },
    )
    .await
    .unwrap();
    assert_eq!(kubelet_active(&host).await, "active");
    let journal = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(
        journal.contains(
            "starting kubelet.service (the ByoHost confirms this host's claim since it booted)"
        ),
        "{journal}"
    );
    let h = hosts.get(&name).await.unwrap();
    assert_eq!(
        h.status.and_then(|s| s.phase).as_deref(),
        Some("Provisioned"),
        "the node is still the claim's"
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// Asks the host for a remedy as the controller does for a ByoRemediation's step
/// (`spec.claim.remediation`) and waits for the agent's report of it (`status.remediation`).
async fn remedy(
    client: &kube::Client,
    hosts: &Api<ByoHost>,
    ns: &str,
    name: &str,
    id: &str,
    action: &str,
) -> String {
    agent::patch_claim(
        client,
        ns,
        name,
        serde_json::json!({"remediation": {"id": id, "action": action}}),
    )
    .await
    .unwrap();
    wait_for(
        &format!("the agent's report of remedy {id}"),
        Duration::from_secs(60),
        || async {
            Ok(hosts
                .get(name)
                .await?
                .status
                .and_then(|s| s.remediation)
                .filter(|r| r.id == id)
                .map(|r| r.result))
        },
    )
    .await
    .unwrap()
}

/// Issue 37, external remediation on the host: `RestartServices` restarts the kubelet (its
/// stand-in starts a second time); `Reboot` makes the host go down by itself (its systemd
/// reboots: nspawn exits), and once it is started again — the firmware's part, played by the
/// test — it is the claim's node again (the kubelet starts once the agent confirmed the claim)
/// and does not reboot a second time for the same request (recorded before it ran).
#[tokio::test(flavor = "multi_thread")]
async fn remedies_restart_the_kubelet_and_reboot_the_host_once_each() {
    let Some((client, ns, host, hosts)) =
        provisioned("power-cycle-remedy", "m3", "uid-pc-0003").await
    else {
        return;
    };
    let name = host.name().to_string();

    let result = remedy(
        &client,
        &hosts,
        ns.name(),
        &name,
        "r-pc/0",
        "RestartServices",
    )
    .await;
    assert_eq!(result, "Done");
    wait_for(
        "the kubelet restarted by the remedy",
        Duration::from_secs(30),
        || async { Ok((kubelet_starts(&host).await == 2).then_some(())) },
    )
    .await
    .unwrap();

    let nspawn = host.nspawn_pid().unwrap();
    let result = remedy(&client, &hosts, ns.name(), &name, "r-pc/1", "Reboot").await;
    assert_eq!(result, "Done");
    wait_until_down(nspawn).await;
    // The machine starts again.
    host.power_off().await.unwrap();
    host.power_on().await.unwrap();
    wait_for(
        "the kubelet started after the reboot",
        Duration::from_secs(90),
        || async { Ok((kubelet_starts(&host).await == 3).then_some(())) },
    )
    .await
    .unwrap();
    let state: serde_json::Value = serde_json::from_str(
        &host
            .read_to_string("/var/lib/byoh/state.json")
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        state["claim"]["lastRemediation"], "r-pc/1",
        "the reboot is recorded as carried out: {state}"
    );
    let journal = host
        .run(&[
            "journalctl",
            "-b",
            "-u",
            "byoh-agent",
            "-o",
            "cat",
            "--no-pager",
        ])
        .await
        .unwrap();
    assert!(
        !journal.contains("remediation of this host's Machine"),
        "the agent carried a remedy out again after the reboot:\n{journal}"
    );
    assert_eq!(
        hosts
            .get(&name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Provisioned")
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// A stand-in kubeadm whose `join` starts the kubelet (as kubeadm's `kubelet-start` phase does)
/// and then hangs, as a join waiting for its TLS bootstrap does.
const HANGING_KUBEADM: &str = "#!/bin/sh\nif [ \"$1\" = join ]; then systemctl restart kubelet.service; exec sleep 3600; fi\nexit 0\n";

/// Issue 37: a host rebooted in the middle of `kubeadm join` (a power blip, a watchdog). The
/// join already started the kubelet; at boot the kubelet does not start (the agent's gate), the
/// agent does not run the join a second time — it reports the bootstrap failed, naming the
/// interrupted step, so a MachineHealthCheck or the operator replaces the Machine — and the
/// release cleans the host. No Node can come of the half-done join.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_rebooted_during_kubeadm_join_fails_its_bootstrap_and_starts_no_kubelet() {
    let Some((client, ns, host, hosts)) =
        claimed("power-cycle-join", HANGING_KUBEADM, "m4", "uid-pc-0004").await
    else {
        return;
    };
    let name = host.name().to_string();
    wait_for(
        "the join under way, the kubelet started by it",
        Duration::from_secs(60),
        || async { Ok((kubelet_starts(&host).await == 1).then_some(())) },
    )
    .await
    .unwrap();
    agent::wait_phase(&hosts, &name, "Bootstrapping", Duration::from_secs(30))
        .await
        .unwrap();

    reboot(&host).await;
    let failed = agent::wait_phase(&hosts, &name, "Failed", Duration::from_secs(90))
        .await
        .unwrap();
    let message = failed
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "BootstrapSucceeded")
        .map(|c| c.message)
        .unwrap_or_default();
    assert!(
        message.contains("runcmd[") && message.contains("must not run twice"),
        "{message}"
    );
    assert_eq!(
        kubelet_starts(&host).await,
        1,
        "the half-joined host started its kubelet at boot"
    );
    assert_eq!(kubelet_active(&host).await, "inactive");

    byoh_tests::packages_claim::release(&client, ns.name(), &hosts, &name, "uid-pc-0004").await;
    assert_eq!(kubelet_starts(&host).await, 1);

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
