//! Hosts as they really are, networks (issue 38 item 4): a booted Debian 12 host with two
//! network cards — its own network namespace on the test bridge (`host0`, the default route)
//! and a second interface the operator set up (`eth1`, a storage or cluster network) — whose
//! operator chooses the node's network with `[host] node_address`.
//!
//! It shows: without a choice the ByoHost reports the default route's address, as before;
//! with `node_address = "192.0.2.0/24"` (an `agent.toml.d` fragment, as a fleet's Ansible
//! pushes it) the ByoHost and the ByoMachine report eth1's address only, `byoh-agent doctor`
//! names it, and a claim through the controller (in-process) gives it to the bootstrap's Jinja
//! template as Cluster API providers' templates expect (`ds.meta_data.local_ipv4` for kubeadm's
//! `advertiseAddress`, the Go original's `{{ .DefaultNetworkInterfaceName }}` for kube-vip's
//! interface) and to the kubelet (`--node-ip` in the claim's drop-in). The release leaves the
//! operator's interface and every file as they were.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::eventually;
use byoh_tests::objects::{
    Running, delete_machine, finish, get_host, ready_cluster, settings, wait_released,
};
use byoh_tests::{agent, brownfield};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// The bootstrap data: a Jinja template as providers' templates write it.
const TEMPLATE: &str = "## template: jinja
#cloud-config
write_files:
- path: /etc/byoh-test/node.yaml
  content: |
    advertiseAddress: {{ ds.meta_data.local_ipv4 }}
    vip_interface: {{ .DefaultNetworkInterfaceName }}
runcmd:
- mkdir -p /run/cluster-api
- touch /run/cluster-api/bootstrap-success.complete
";

/// The `InternalIP`s the ByoHost reports.
async fn internal_ips(client: &kube::Client, ns: &str, name: &str) -> Vec<String> {
    get_host(client, ns, name)
        .await
        .status
        .map(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_chooses_the_nodes_network_and_the_claim_gives_it_to_kubeadm_kube_vip_and_the_kubelet()
 {
    let Some((client, ns, host)) = brownfield::boot_networked("brownfield-nics").await else {
        return;
    };
    let n = ns.name().to_string();
    let name = host.name().to_string();
    let default_address = host.address().unwrap().to_string();
    // The second card, as the operator configured it (a veth pair inside the host stands in
    // for the card and its cable: the test kernel has no dummy interfaces).
    for argv in [
        &[
            "ip",
            "link",
            "add",
            "eth1",
            "type",
            "veth",
            "peer",
            "name",
            "eth1-cable",
        ][..],
        &["ip", "addr", "add", "192.0.2.10/24", "dev", "eth1"],
        &["ip", "link", "set", "eth1-cable", "up"],
        &["ip", "link", "set", "eth1", "up"],
    ] {
        host.run(argv).await.unwrap();
    }
    let eth1_before = host
        .run(&["ip", "-br", "addr", "show", "eth1"])
        .await
        .unwrap();

    // No choice: the default route's interface, as before.
    assert_eq!(internal_ips(&client, &n, &name).await, [default_address]);

    // The operator's choice, pushed as a fragment; the agent restarted to read it.
    host.write_file(
        "/etc/byoh/agent.toml.d/50-node-address.toml",
        b"[host]\nnode_address = \"192.0.2.0/24\"\n",
        0o644,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    eventually("the ByoHost reports eth1's address", T, || async {
        (internal_ips(&client, &n, &name).await == ["192.0.2.10"]).then_some(())
    })
    .await;
    let doctor = host.exec(&["byoh-agent", "doctor"]).await.unwrap().stdout;
    let line = doctor
        .lines()
        .find(|l| l.starts_with("node-address "))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains("PASS")
            && line.contains("192.0.2.10 on eth1 ([host] node_address: network 192.0.2.0/24)"),
        "{doctor}"
    );
    // `byoh-agent facts` reads the same configuration.
    let printed: serde_json::Value = serde_json::from_str(
        &host
            .run(&["byoh-agent", "facts", "--output", "json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        printed["addresses"][1],
        serde_json::json!({"type": "InternalIP", "address": "192.0.2.10"}),
        "{printed}"
    );
    let snapshot = agent::snapshot(&host).await.unwrap();

    // A claim through the controller: the template and the kubelet get the chosen network.
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    let bm = brownfield::claim_with(&client, &n, "c1", "m1", TEMPLATE).await;
    let uid = kube::ResourceExt::uid(&bm).unwrap();
    let bm_ips: Vec<String> = bm
        .status
        .unwrap()
        .addresses
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert_eq!(bm_ips, ["192.0.2.10"], "the Machine's addresses");
    assert_eq!(
        host.read_to_string("/etc/byoh-test/node.yaml")
            .await
            .unwrap(),
        "advertiseAddress: 192.0.2.10\nvip_interface: eth1\n"
    );
    let dropin = host
        .read_to_string("/etc/systemd/system/kubelet.service.d/20-byoh-provider-id.conf")
        .await
        .unwrap();
    assert!(
        dropin.contains(" --node-ip=192.0.2.10 $KUBELET_KUBECONFIG_ARGS "),
        "{dropin}"
    );

    // Released: the operator's interface and the host's files as they were.
    delete_machine(&client, &n, &name, "m1").await;
    wait_released(&client, &n, &name, &uid).await;
    assert_eq!(
        host.run(&["ip", "-br", "addr", "show", "eth1"])
            .await
            .unwrap(),
        eth1_before
    );
    brownfield::assert_as_before(&host, &snapshot).await;
    host.stop().await.unwrap();
    finish(&client, ns, vec![ctl]).await;
}
