//! Hosts as they really are, leftovers of an earlier life (issue 38 item 6): a booted Debian 12
//! host that once ran kubeadm outside BYOH (its kubelet's kubeconfig, a static Pod manifest,
//! the cluster's CA, etcd's data — made by hand as `kubeadm join`/`init` leave them) is never
//! silently reused: the claim is refused before anything runs and its files stay as they are.
//!
//! It shows, with the controller running (in-process): a claim that reached the host before its
//! periodic check could see the files (the agent was stopped while they appeared, so the
//! controller still saw the host pass) is refused by the agent before the bootstrap — the
//! ByoMachine's `Ready=False` names the files and the fix — and its release runs no `kubeadm
//! reset`: every file of the host is as it was, byte for byte. Then the host is not offered
//! (`NoHostAvailable`, `PreflightFailed`) and `byoh-agent doctor` fails `kubeadm-files`; once
//! the operator removed the files, the next Machine gets the host, and its release leaves the
//! host as it was before the earlier cluster's files appeared.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_controller::bootstrap_failures::BackOff;
use byoh_controller::run::Settings;
use byoh_tests::eventually;
use byoh_tests::hosts::{Debian, Host};
use byoh_tests::objects::{
    BootstrapData, MachineOpts, Running, bm_condition, condition, create_machine, delete_machine,
    finish, get_bm, get_host, host_claimed_false, ready_cluster, settings, wait_released,
};
use byoh_tests::{agent, brownfield};
use std::time::Duration;

/// The earlier cluster's files, as kubeadm leaves them: (path, content).
const LEFTOVERS: &[(&str, &str)] = &[
    (
        "/etc/kubernetes/kubelet.conf",
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://192.0.2.10:6443\n  name: old\n",
    ),
    (
        "/etc/kubernetes/manifests/etcd.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\n",
    ),
    (
        "/etc/kubernetes/pki/ca.crt",
        "-----BEGIN CERTIFICATE-----\nMIIBold\n-----END CERTIFICATE-----\n",
    ),
    ("/var/lib/etcd/member/snap/db", "etcd's data\n"),
];

/// Directories [`LEFTOVERS`] may create, deepest first: those it created are removed again by
/// the operator's fix.
const LEFTOVER_DIRS: &[&str] = &[
    "/var/lib/etcd/member/snap",
    "/var/lib/etcd/member",
    "/var/lib/etcd",
    "/etc/kubernetes/pki",
    "/etc/kubernetes/manifests",
    "/etc/kubernetes",
];

const T: Duration = Duration::from_secs(90);

/// The content digests of the leftover files (`sha256sum`).
async fn digests(host: &Host) -> String {
    let mut argv = vec!["sha256sum"];
    argv.extend(LEFTOVERS.iter().map(|(p, _)| *p));
    host.run(&argv).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_with_an_earlier_clusters_files_is_refused_and_left_as_it_is_until_the_operator_removes_them()
 {
    let Some((client, ns, host)) =
        agent::boot_debian_registered(Debian::Bookworm, "brownfield-leftovers").await
    else {
        return;
    };
    let n = ns.name().to_string();
    let name = host.name().to_string();
    let clean = agent::snapshot(&host).await.unwrap();
    // A short back-off, so that the refused claim holds the host back for less than the test.
    let ctl = Running::start(
        &client,
        &n,
        Settings {
            bootstrap_backoff: BackOff {
                base: Duration::from_secs(5),
                max: Duration::from_secs(5),
            },
            ..settings()
        },
    );
    ready_cluster(&client, &n, "c1").await;

    // The earlier cluster's files appear while the agent is stopped (a restored backup, an
    // operator's experiment): the controller still sees a host that passed its checks.
    host.run(&["systemctl", "stop", "byoh-agent"])
        .await
        .unwrap();
    let mut created_dirs = Vec::new();
    for d in LEFTOVER_DIRS {
        if !host
            .exec(&["test", "-d", d])
            .await
            .unwrap()
            .status
            .success()
        {
            created_dirs.push(*d);
        }
    }
    for (path, content) in LEFTOVERS {
        host.write_file(path, content.as_bytes(), 0o600)
            .await
            .unwrap();
    }
    let with_leftovers = agent::snapshot(&host).await.unwrap();
    let sums = digests(&host).await;

    let m1 = create_machine(&client, &n, "c1", "m1", &MachineOpts::ready()).await;
    let uid1 = kube::ResourceExt::uid(&m1).unwrap();
    eventually("m1 claims the host", T, || async {
        get_host(&client, &n, &name)
            .await
            .spec
            .claim
            .filter(|c| c.machine_ref.name == "m1")
    })
    .await;
    host.run(&["systemctl", "start", "byoh-agent"])
        .await
        .unwrap();

    // The agent refuses the claim before anything runs; the ByoMachine says why.
    let bm = eventually("m1 reports the refusal", T, || async {
        let bm = get_bm(&client, &n, "m1").await?;
        (bm_condition(&bm, "Ready") == Some(("False".into(), "PreflightChecksFailed".into())))
            .then_some(bm)
    })
    .await;
    let ready = condition(&bm.status.as_ref().unwrap().conditions, "Ready").unwrap();
    eprintln!("---- m1 Ready=False ----\n{}", ready.message);
    for want in [
        "claim refused before anything ran",
        "/etc/kubernetes/kubelet.conf, /etc/kubernetes/manifests, /etc/kubernetes/pki, /var/lib/etcd on the host",
        "no kubeadm reset",
        "kubeadm reset --force (or remove them)",
    ] {
        assert!(ready.message.contains(want), "{want}: {}", ready.message);
    }
    let log = host
        .run(&["journalctl", "-u", "byoh-agent", "-o", "cat", "--no-pager"])
        .await
        .unwrap();
    assert!(
        !log.contains("starting the bootstrap"),
        "the bootstrap must not start: {log}"
    );

    // Released (as a MachineHealthCheck's remediation would): the clean-up changes nothing.
    delete_machine(&client, &n, &name, "m1").await;
    wait_released(&client, &n, &name, &uid1).await;
    assert_eq!(digests(&host).await, sums, "the earlier cluster's files");
    let diff = agent::snapshot_diff(&with_leftovers, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "the refused claim's release changed the host:\n{}",
        diff.join("\n")
    );
    let h = get_host(&client, &n, &name).await;
    let cleanup = condition(&h.status.as_ref().unwrap().conditions, "CleanupSucceeded").unwrap();
    assert!(
        cleanup.message.contains("nothing to reset"),
        "{}",
        cleanup.message
    );

    // Not offered while the files are there: doctor and the next Machine say why.
    let out = host.exec(&["byoh-agent", "doctor"]).await.unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", out.stdout);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("kubeadm-files ") && l.contains("FAIL")),
        "{}",
        out.stdout
    );
    // m2's bootstrap succeeds where it runs (CAPI's sentinel, as kubeadm's join would end).
    agent::create_machine_bootstrap_data(
        &client,
        &n,
        "m2",
        "m2-bootstrap",
        "#cloud-config\nruncmd:\n- mkdir -p /run/cluster-api\n- touch /run/cluster-api/bootstrap-success.complete\n",
    )
    .await
    .unwrap();
    let m2 = MachineOpts {
        bootstrap_data: BootstrapData::Named("m2-bootstrap".into()),
        ..MachineOpts::ready()
    };
    create_machine(&client, &n, "c1", "m2", &m2).await;
    let why = host_claimed_false(&client, &n, "m2", "NoHostAvailable").await;
    eprintln!("---- m2 while the files are there ----\n{why}");
    let why = if why.contains("PreflightFailed") {
        why
    } else {
        // Still held back by the refusal's short back-off: the next reason is the check's.
        eventually("m2 names the preflight failure", T, || async {
            let bm = get_bm(&client, &n, "m2").await?;
            let c = condition(&bm.status?.conditions, "HostClaimed")?.clone();
            c.message.contains("1 PreflightFailed").then_some(c.message)
        })
        .await
    };
    assert!(why.contains("1 PreflightFailed"), "{why}");
    assert!(get_host(&client, &n, &name).await.spec.claim.is_none());

    // The operator's fix (what doctor says): the files removed; the next periodic check passes
    // and m2 gets the host; its release leaves the host as it was before the files came.
    let mut rm = vec!["rm", "-f"];
    rm.extend(LEFTOVERS.iter().map(|(p, _)| *p));
    host.run(&rm).await.unwrap();
    for d in created_dirs {
        host.run(&["rmdir", d]).await.unwrap();
    }
    let uid2 = eventually("m2 claims the host", Duration::from_secs(150), || async {
        let c = get_host(&client, &n, &name).await.spec.claim?;
        (c.machine_ref.name == "m2").then_some(c.machine_ref.uid)
    })
    .await;
    eventually("m2's bootstrap succeeds", T, || async {
        let bm = get_bm(&client, &n, "m2").await?;
        (bm_condition(&bm, "Ready").map(|(s, _)| s).as_deref() == Some("True")).then_some(())
    })
    .await;
    delete_machine(&client, &n, &name, "m2").await;
    wait_released(&client, &n, &name, &uid2).await;
    brownfield::assert_as_before(&host, &clean).await;
    host.stop().await.unwrap();
    finish(&client, ns, vec![ctl]).await;
}
