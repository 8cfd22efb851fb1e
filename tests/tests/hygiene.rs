//! System tests of issue 16 part A (host hygiene) on booted hosts, through real claims and
//! releases (the claim is written by the test as the controller would):
//!
//! - volumes still mounted below `/var/lib/kubelet` (a bind mount of a data directory and a
//!   bind of a tmpfs, one under a path with a space) are unmounted by the release, the data
//!   behind them is intact, and the host is as before the claim;
//! - `kubeadm reset` (the real kubeadm of the pinned version) runs with the kubelet's CRI socket,
//!   so a host with two CRI sockets (containerd's and a CRI-O listener) releases; a reset that
//!   fails keeps the host `CleaningUp` with `KubeadmResetFailed` (exit status and stderr), is
//!   retried, and finishes once the reset passes;
//! - a host left unclean after every clean-up step (a process of the host on etcd's peer port)
//!   is quarantined (`Quarantined`, naming the port and the process, phase `CleaningUp`) until
//!   it is fixed, then offered again without any other action;
//! - on a host with a network of its own, what a claim's networking leaves: the agent removes
//!   the CNI bridge the claim created, the Cluster's control-plane endpoint address the claim
//!   added to the NIC (kube-vip's) and a KUBE-* iptables chain the claim created (with the jump
//!   into it); it leaves alone a chain older than the claim and another program's interface;
//!   what it may not remove (a veth peer, another address, a container in containerd's `k8s.io`
//!   namespace) quarantines the host with each leftover and its fix, and the host is offered
//!   again once they are removed from outside.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, BootOptions, Host};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use std::time::Duration;

/// A kubeadm stand-in that succeeds and does nothing (so only the agent's own clean-up meets
/// the mounts, as when kubeadm left them).
const NOOP_KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nexit 0\n";
/// A kubeadm wrapper whose reset really fails.
const FAILING_KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nif [ \"$1\" = reset ]; then echo 'reset exploded: removing etcd member failed' >&2; exit 1; fi\nexit 0\n";
/// Bootstrap data that only reports success.
const DATA: &str = "#cloud-config\nruncmd:\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

async fn status_of(hosts: &Api<ByoHost>, name: &str) -> byoh_api::ByoHostStatus {
    hosts
        .get_status(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn condition(hosts: &Api<ByoHost>, name: &str, type_: &str) -> Option<Condition> {
    status_of(hosts, name)
        .await
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
}

async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) {
    if let Err(e) = wait_for(
        &format!("phase {phase}"),
        Duration::from_secs(secs),
        || async {
            Ok((status_of(hosts, name).await.phase.as_deref() == Some(phase)).then_some(()))
        },
    )
    .await
    {
        panic!("{e}; status: {:?}", status_of(hosts, name).await);
    }
}

async fn wait_cleaned(hosts: &Api<ByoHost>, name: &str, uid: &str, secs: u64) {
    wait_for("cleanedMachineUID", Duration::from_secs(secs), || async {
        Ok(
            (status_of(hosts, name).await.cleaned_machine_uid.as_deref() == Some(uid))
                .then_some(()),
        )
    })
    .await
    .unwrap();
}

/// Claims `host` for `machine`/`uid` with [`DATA`] and waits until it is provisioned.
async fn claim(client: &kube::Client, ns: &str, hosts: &Api<ByoHost>, name: &str, uid: &str) {
    claim_with(client, ns, hosts, name, uid, DATA).await
}

/// [`claim`] with bootstrap data `data`.
async fn claim_with(
    client: &kube::Client,
    ns: &str,
    hosts: &Api<ByoHost>,
    name: &str,
    uid: &str,
    data: &str,
) {
    claim_for_cluster(client, ns, hosts, name, uid, data, serde_json::json!({})).await
}

/// [`claim_with`], with the fields of `extra` in the claim (as the controller copies them from
/// the Cluster).
async fn claim_for_cluster(
    client: &kube::Client,
    ns: &str,
    hosts: &Api<ByoHost>,
    name: &str,
    uid: &str,
    data: &str,
    extra: serde_json::Value,
) {
    let secret = format!("{uid}-bootstrap");
    agent::create_bootstrap_secret(client, ns, &secret, data)
        .await
        .unwrap();
    agent::claim_host_with(client, ns, name, &format!("m-{uid}"), uid, &secret, extra)
        .await
        .unwrap();
    wait_phase(hosts, name, "Provisioned", 60).await;
}

/// Mount points below `dir` in the host's mount table (escaped as mountinfo writes them).
async fn mounts_below(host: &Host, dir: &str) -> Vec<String> {
    host.read_to_string("/proc/self/mountinfo")
        .await
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(dir))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn release_unmounts_volumes_below_the_kubelet_dir_and_never_deletes_the_data_behind_them() {
    let Some((client, ns, host, hosts)) =
        agent::boot_registered("hyg-mounts", NOOP_KUBEADM.as_bytes()).await
    else {
        return;
    };
    let name = host.name().to_string();
    // Data outside /var/lib/kubelet: a directory, and a tmpfs (its file lives only in memory).
    host.run(&[
        "sh",
        "-c",
        "mkdir -p /srv/data /srv/cache && echo precious > /srv/data/file && mount -t tmpfs -o size=1m byoh-test-cache /srv/cache && echo precious-tmpfs > /srv/cache/file",
    ])
    .await
    .unwrap();
    let before = agent::snapshot(&host).await.unwrap();

    claim(&client, ns.name(), &hosts, &name, "uid-mnt-0001").await;
    // What a kubelet leaves when it dies with pods running: a CSI-like bind mount of the data
    // directory, the tmpfs bound under a path with a space, a tmpfs of its own, and a symlink
    // to the data (never followed).
    let vols = "/var/lib/kubelet/pods/0b5e6c1a-uid/volumes";
    let script = format!(
        "set -e; mkdir -p '{vols}/kubernetes.io~csi/pv-data/mount' '{vols}/kubernetes.io~empty-dir/my cache' '{vols}/kubernetes.io~empty-dir/scratch'
         mount --bind /srv/data '{vols}/kubernetes.io~csi/pv-data/mount'
         mount --bind /srv/cache '{vols}/kubernetes.io~empty-dir/my cache'
         mount -t tmpfs -o size=1m byoh-test-scratch '{vols}/kubernetes.io~empty-dir/scratch'
         echo scratch > '{vols}/kubernetes.io~empty-dir/scratch/file'
         ln -s /srv/data /var/lib/kubelet/data-link"
    );
    host.run(&["sh", "-c", &script]).await.unwrap();
    assert_eq!(mounts_below(&host, "/var/lib/kubelet").await.len(), 3);
    assert!(
        mounts_below(&host, "/var/lib/kubelet")
            .await
            .iter()
            .any(|m| m.contains("my\\040cache")),
        "mountinfo escapes the space"
    );

    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-mnt-0001", 60).await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;
    assert!(
        byoh_api::conditions::is_true(
            &status_of(&hosts, &name).await.conditions,
            "CleanupSucceeded"
        ),
        "CleanupSucceeded"
    );

    assert_eq!(
        host.read_to_string("/srv/data/file").await.unwrap(),
        "precious\n"
    );
    assert_eq!(
        host.read_to_string("/srv/cache/file").await.unwrap(),
        "precious-tmpfs\n"
    );
    assert!(mounts_below(&host, "/var/lib/kubelet").await.is_empty());
    assert!(
        !host
            .exec(&["test", "-e", "/var/lib/kubelet"])
            .await
            .unwrap()
            .success(),
        "/var/lib/kubelet must be gone"
    );
    let log = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(log.contains("unmounted before removing"), "{log}");
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "the release must return the host to its pre-claim state; diff:\n{}",
        diff.join("\n")
    );

    // A mount the agent cannot unmount (its unit without CAP_SYS_ADMIN: umount2 gives EPERM):
    // the clean-up stops with UnmountFailed naming the mount point and errno, deletes nothing
    // behind it, and keeps the host out of the pool until it can.
    let dropin = "/etc/systemd/system/byoh-agent.service.d/no-sys-admin.conf";
    host.run(&["mkdir", "-p", "/etc/systemd/system/byoh-agent.service.d"])
        .await
        .unwrap();
    host.write_file(
        dropin,
        b"[Service]\nCapabilityBoundingSet=~CAP_SYS_ADMIN\n",
        0o644,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "daemon-reload"]).await.unwrap();
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    claim(&client, ns.name(), &hosts, &name, "uid-mnt-0002").await;
    let csi = format!("{vols}/kubernetes.io~csi/pv-data/mount");
    host.run(&[
        "sh",
        "-c",
        &format!("mkdir -p '{csi}' && mount --bind /srv/data '{csi}'"),
    ])
    .await
    .unwrap();
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    let cond = wait_for(
        "CleanupSucceeded=False UnmountFailed",
        Duration::from_secs(60),
        || async {
            Ok(condition(&hosts, &name, "CleanupSucceeded")
                .await
                .filter(|c| c.reason == "UnmountFailed"))
        },
    )
    .await
    .unwrap();
    eprintln!("UnmountFailed: {}", cond.message);
    assert!(
        cond.message.contains(&csi) && cond.message.contains("EPERM"),
        "{}",
        cond.message
    );
    assert_eq!(
        status_of(&hosts, &name).await.phase.as_deref(),
        Some("CleaningUp")
    );
    assert_eq!(
        host.read_to_string(&format!("{csi}/file")).await.unwrap(),
        "precious\n",
        "nothing behind the mount was deleted"
    );
    // The agent may unmount again: the clean-up finishes.
    host.run(&["rm", "-f", dropin]).await.unwrap();
    host.run(&["systemctl", "daemon-reload"]).await.unwrap();
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-mnt-0002", 90).await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;
    assert_eq!(
        host.read_to_string("/srv/data/file").await.unwrap(),
        "precious\n"
    );
    assert!(mounts_below(&host, "/var/lib/kubelet").await.is_empty());

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn kubeadm_reset_uses_the_kubelets_cri_socket_and_a_failed_reset_keeps_the_host_out_of_the_pool()
 {
    if control_plane::client().await.is_none() || !hosts::available() {
        return;
    }
    let artifacts = byoh_tests::kubeadm::stage_artifacts().unwrap();
    let real_kubeadm = std::fs::read(artifacts.join("kubeadm")).unwrap();
    let Some((client, ns, host, hosts)) = agent::boot_registered("hyg-reset", &real_kubeadm).await
    else {
        return;
    };
    let name = host.name().to_string();
    // A second CRI endpoint: a listener on CRI-O's socket next to containerd's.
    host.run(&[
        "systemd-run",
        "--unit=byoh-test-crio",
        "python3",
        "-c",
        "import os,socket,time\nos.makedirs('/var/run/crio',exist_ok=True)\ns=socket.socket(socket.AF_UNIX)\ns.bind('/var/run/crio/crio.sock')\ns.listen()\ntime.sleep(86400)",
    ])
    .await
    .unwrap();
    wait_for("the CRI-O socket", Duration::from_secs(20), || async {
        Ok(host
            .exec(&["test", "-S", "/var/run/crio/crio.sock"])
            .await?
            .success()
            .then_some(()))
    })
    .await
    .unwrap();
    // Without the socket, kubeadm refuses to choose (what the agent ran before issue 16).
    let bare = host.exec(&["kubeadm", "reset", "--force"]).await.unwrap();
    assert!(!bare.status.success());
    assert!(
        bare.stderr.contains("multiple CRI endpoints"),
        "{}",
        bare.stderr
    );

    claim(&client, ns.name(), &hosts, &name, "uid-reset-0001").await;
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-reset-0001", 90).await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;
    let log = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(
        log.contains("reset --force --cri-socket unix:///run/containerd/containerd.sock"),
        "{log}"
    );

    // A reset that fails: reported with its status and stderr, retried, never offered.
    host.write_file("/usr/local/bin/kubeadm", FAILING_KUBEADM.as_bytes(), 0o755)
        .await
        .unwrap();
    claim(&client, ns.name(), &hosts, &name, "uid-reset-0002").await;
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    let cond = wait_for(
        "CleanupSucceeded=False KubeadmResetFailed",
        Duration::from_secs(60),
        || async {
            Ok(condition(&hosts, &name, "CleanupSucceeded")
                .await
                .filter(|c| c.reason == "KubeadmResetFailed"))
        },
    )
    .await
    .unwrap();
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("exited with status 1")
            && cond
                .message
                .contains("reset exploded: removing etcd member failed")
            && cond.message.contains("--cri-socket"),
        "{}",
        cond.message
    );
    let ready = condition(&hosts, &name, "Ready").await.unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "KubeadmResetFailed")
    );
    // Retried with backoff, and the host stays out of the pool meanwhile.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let status = status_of(&hosts, &name).await;
    assert_eq!(status.phase.as_deref(), Some("CleaningUp"));
    assert_ne!(
        status.cleaned_machine_uid.as_deref(),
        Some("uid-reset-0002")
    );
    let tries = host
        .read_to_string("/run/byoh-test-kubeadm.log")
        .await
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("reset"))
        .count();
    assert!(tries >= 2, "the reset is retried: {tries} tries");

    // Once the reset passes, the clean-up finishes.
    host.write_file("/usr/local/bin/kubeadm", &real_kubeadm, 0o755)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-reset-0002", 90).await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;
    assert!(byoh_api::conditions::is_true(
        &status_of(&hosts, &name).await.conditions,
        "CleanupSucceeded"
    ));

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_left_unclean_after_the_clean_up_is_quarantined_until_it_is_clean() {
    let Some((client, ns, host, hosts)) =
        agent::boot_registered("hyg-verify", NOOP_KUBEADM.as_bytes()).await
    else {
        return;
    };
    let name = host.name().to_string();
    claim(&client, ns.name(), &hosts, &name, "uid-verify-0001").await;
    // Something of the claim the clean-up does not know: a process on etcd's peer port.
    host.run(&[
        "systemd-run",
        "--unit=byoh-test-etcd-peer",
        "python3",
        "-c",
        "import socket,time\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',2380))\ns.listen()\ntime.sleep(86400)",
    ])
    .await
    .unwrap();
    wait_for("the listener on 2380", Duration::from_secs(20), || async {
        Ok(host
            .run(&["sh", "-c", "grep -c ':094C ' /proc/net/tcp || true"])
            .await?
            .trim()
            .ne("0")
            .then_some(()))
    })
    .await
    .unwrap();

    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    let cond = wait_for(
        "CleanupSucceeded=False Quarantined",
        Duration::from_secs(60),
        || async {
            Ok(condition(&hosts, &name, "CleanupSucceeded")
                .await
                .filter(|c| c.reason == "Quarantined"))
        },
    )
    .await
    .unwrap();
    assert_eq!(cond.status, "False");
    assert!(
        cond.message.contains("port 2380 is held by python3"),
        "{}",
        cond.message
    );
    let status = status_of(&hosts, &name).await;
    assert_eq!(status.phase.as_deref(), Some("CleaningUp"));
    assert_ne!(
        status.cleaned_machine_uid.as_deref(),
        Some("uid-verify-0001")
    );

    // `byoh-agent status` on the host says the same (between re-checks: while one runs, the
    // step shows as started).
    let said = wait_for("byoh-agent status", Duration::from_secs(30), || async {
        let local = host.run(&["byoh-agent", "status"]).await?;
        Ok(
            (local.contains("verify") && local.contains("port 2380 is held by python3"))
                .then_some(()),
        )
    })
    .await;
    assert!(
        said.is_ok(),
        "{}",
        host.run(&["byoh-agent", "status"]).await.unwrap()
    );

    // Fixed by hand: the agent checks again and offers the host.
    host.run(&["systemctl", "stop", "byoh-test-etcd-peer"])
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-verify-0001", 60).await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// Bootstrap data that leaves what a claim's networking leaves: kube-vip's control-plane
/// endpoint on the NIC and a CNI bridge (as the bridge plugin's and flannel's cni0), both
/// removed by the agent; a KUBE-* chain of kube-proxy with a jump to it and a container in
/// containerd's `k8s.io` namespace (without an image: a rootfs), as `kubeadm reset` leaves them
/// (removed by the agent); a pod's veth peer whose namespace is gone and another address, which
/// the agent names and leaves; and an interface of another program (`virbr7`), which the agent
/// leaves alone.
const NETWORK_DATA: &str = "#cloud-config
runcmd:
- ip addr add 198.18.0.250/32 dev host0
- ip addr add 198.18.0.251/32 dev host0
- ip link add cni0 type bridge
- ip link add vethbyoh0 type veth peer name vethbyoh1
- ip link add virbr7 type bridge
- iptables -t nat -N KUBE-TEST && iptables -t nat -A PREROUTING -j KUBE-TEST
- mkdir -p /srv/rootfs && ctr -n k8s.io containers create --rootfs /srv/rootfs byoh-test-left
- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"
";

#[tokio::test(flavor = "multi_thread")]
async fn what_the_claims_networking_left_quarantines_the_host_until_it_is_removed() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "hyg-net").await.unwrap();
    let host = Host::boot_with(
        "hyg-net",
        &BootOptions {
            network: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    host.write_file("/usr/local/bin/kubeadm", NOOP_KUBEADM.as_bytes(), 0o755)
        .await
        .unwrap();
    agent::register_on_test_network(&client, ns.name(), &host)
        .await
        .unwrap();
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let name = host.name().to_string();
    let address = host.address().unwrap();
    // iptables works in the host (the image has it; the kernel may lack nf_tables).
    let iptables = host
        .exec(&["iptables", "-t", "nat", "-S"])
        .await
        .unwrap()
        .success();
    let data = if iptables {
        NETWORK_DATA.to_string()
    } else {
        NETWORK_DATA.replace(
            "- iptables -t nat -N KUBE-TEST && iptables -t nat -A PREROUTING -j KUBE-TEST\n",
            "",
        )
    };

    if iptables {
        // A chain that was there before the claim is not the claim's: neither removed nor named.
        host.run(&["iptables", "-t", "nat", "-N", "KUBE-BEFORE"])
            .await
            .unwrap();
    }
    // The same for a container that was there before the claim.
    host.run(&[
        "sh",
        "-c",
        "mkdir -p /srv/before && ctr -n k8s.io containers create --rootfs /srv/before byoh-test-before",
    ])
    .await
    .unwrap();
    // The Cluster's endpoint is 198.18.0.250 (the claim carries it, as the controller copies
    // it from the Cluster): the agent removes that address, not the other one.
    claim_for_cluster(
        &client,
        ns.name(),
        &hosts,
        &name,
        "uid-net-0001",
        &data,
        serde_json::json!({ "controlPlaneEndpoint": { "host": "198.18.0.250", "port": 6443 } }),
    )
    .await;
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    let cond = wait_for(
        "CleanupSucceeded=False Quarantined",
        Duration::from_secs(60),
        || async {
            Ok(condition(&hosts, &name, "CleanupSucceeded")
                .await
                .filter(|c| c.reason == "Quarantined"))
        },
    )
    .await
    .unwrap();
    eprintln!("Quarantined: {}", cond.message);
    let m = &cond.message;
    // Removed by the agent, as the real `ip` on the host shows: the CNI bridge and the
    // endpoint address; left and named: the veth peer and the other address; left alone and
    // not named: the other program's interface.
    assert!(!m.contains("cni0") && !m.contains("198.18.0.250/"), "{m}");
    let links = host.run(&["ip", "-br", "link"]).await.unwrap();
    let addresses = host.run(&["ip", "-br", "addr"]).await.unwrap();
    assert!(
        !links.contains("cni0") && links.contains("virbr7") && links.contains("vethbyoh0"),
        "{links}"
    );
    assert!(
        !addresses.contains("198.18.0.250/") && addresses.contains("198.18.0.251/32"),
        "{addresses}"
    );
    let log = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(
        log.contains("removed interface cni0, which the claim created")
            && log.contains("removed address 198.18.0.250/32 on host0, which the claim created"),
        "{log}"
    );
    assert!(
        m.contains("interface vethbyoh0 was created during the claim")
            && m.contains("ip link delete vethbyoh0"),
        "{m}"
    );
    assert!(
        m.contains("address 198.18.0.251/32 on host0 was added during the claim")
            && m.contains("ip addr del 198.18.0.251/32 dev host0"),
        "{m}"
    );
    assert!(!m.contains("virbr7"), "{m}");
    assert!(
        !m.contains(&format!("{address}/")),
        "the host's own address is not the claim's: {m}"
    );
    if iptables {
        // The chain the claim created (as the kubelet's and kube-proxy's, which kubeadm reset
        // leaves) is removed by the agent with the jump into it; the older one stays.
        assert!(
            !m.contains("KUBE-TEST") && !m.contains("KUBE-BEFORE"),
            "{m}"
        );
        let rules = host.run(&["iptables", "-t", "nat", "-S"]).await.unwrap();
        assert!(
            !rules.contains("KUBE-TEST") && rules.contains("-N KUBE-BEFORE"),
            "{rules}"
        );
        assert!(
            log.contains("removed the iptables chains the claim created: KUBE-TEST"),
            "{log}"
        );
    }
    // The container the claim created is removed by the agent, as containerd lists; the older
    // one stays, not named.
    assert!(!m.contains("containers are left"), "{m}\n{log}");
    let containers = host
        .run(&["ctr", "-n", "k8s.io", "containers", "ls", "-q"])
        .await
        .unwrap();
    assert_eq!(containers.trim(), "byoh-test-before", "{containers}");
    assert!(
        log.contains(
            "removed container byoh-test-left of containerd's k8s.io namespace, which the claim created"
        ),
        "{log}"
    );
    let status = status_of(&hosts, &name).await;
    assert_eq!(status.phase.as_deref(), Some("CleaningUp"));
    assert_ne!(status.cleaned_machine_uid.as_deref(), Some("uid-net-0001"));

    // Removed from outside, as the message says: the agent checks again and offers the host.
    host.run(&["ip", "addr", "del", "198.18.0.251/32", "dev", "host0"])
        .await
        .unwrap();
    host.run(&["ip", "link", "delete", "vethbyoh0"])
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-net-0001", 90).await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;
    assert!(byoh_api::conditions::is_true(
        &status_of(&hosts, &name).await.conditions,
        "CleanupSucceeded"
    ));

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
