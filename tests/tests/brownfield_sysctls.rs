//! Hosts as they really are, kernel settings (issue 38 item 2): the kernel settings a claim's
//! node writes at run time — kube-proxy's `net.ipv4.conf.all.route_localnet=1` (its iptables
//! mode), the CNI plugins' `net.ipv4.ip_forward=1` — are recorded when the claim begins and
//! written back on release, on a booted Debian 12 host whose operator keeps forwarding off.
//!
//! It shows, through the controller (in-process) on a host with a network of its own (its
//! `/proc/sys/net` is its own and writable, as a machine's): the bootstrap changes both values
//! as the node's programs would; after the release both are as the operator had them, the
//! journal names each value written back, and every file is as it was.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::hosts::Host;
use byoh_tests::objects::{
    Running, delete_machine, finish, ready_cluster, settings, wait_released,
};
use byoh_tests::{agent, brownfield};

/// What the node's programs write, as a bootstrap's runcmd stands in for them.
const BOOTSTRAP: &str = "#cloud-config
runcmd:
- echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet
- echo 1 > /proc/sys/net/ipv4/ip_forward
- mkdir -p /run/cluster-api
- touch /run/cluster-api/bootstrap-success.complete
";

/// The two values (`route_localnet`, `ip_forward`).
async fn values(host: &Host) -> (String, String) {
    let read = |k: &'static str| async move {
        host.read_to_string(&format!("/proc/sys/net/ipv4/{k}"))
            .await
            .unwrap()
            .trim()
            .to_string()
    };
    (
        read("conf/all/route_localnet").await,
        read("ip_forward").await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kernel_settings_the_node_changed_are_written_back_on_release() {
    let Some((client, ns, host)) = brownfield::boot_networked("brownfield-sysctls").await else {
        return;
    };
    let n = ns.name().to_string();
    let name = host.name().to_string();
    // The operator's own setting: this host does not forward.
    host.run(&["sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"])
        .await
        .unwrap();
    assert_eq!(values(&host).await, ("0".into(), "0".into()));
    let snapshot = agent::snapshot(&host).await.unwrap();

    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    let bm = brownfield::claim_with(&client, &n, "c1", "m1", BOOTSTRAP).await;
    assert_eq!(values(&host).await, ("1".into(), "1".into()), "the node's");

    let uid = kube::ResourceExt::uid(&bm).unwrap();
    delete_machine(&client, &n, &name, "m1").await;
    wait_released(&client, &n, &name, &uid).await;
    assert_eq!(values(&host).await, ("0".into(), "0".into()), "as before");
    let log = host
        .run(&["journalctl", "-u", "byoh-agent", "-o", "cat", "--no-pager"])
        .await
        .unwrap();
    for want in [
        "sysctls: wrote back net.ipv4.conf.all.route_localnet: 1 -> 0, as before the claim",
        "sysctls: wrote back net.ipv4.ip_forward: 1 -> 0, as before the claim",
    ] {
        assert!(log.contains(want), "{want}:\n{log}");
    }
    brownfield::assert_as_before(&host, &snapshot).await;
    host.stop().await.unwrap();
    finish(&client, ns, vec![ctl]).await;
}
