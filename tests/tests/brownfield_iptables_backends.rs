//! Hosts as they really are, packet filtering (issue 38 item 3): a booted Debian 12 host whose
//! `iptables` alternative is the legacy backend (`update-alternatives --set iptables
//! /usr/sbin/iptables-legacy`, as older fleets keep it) while the claim's Kubernetes writes
//! through nf_tables (kube-proxy's image picks its backend by the rules it finds), with chains
//! of its own in both backends before the claim.
//!
//! It shows, through the controller (in-process) on a host with a network of its own: the
//! release removes the KUBE-/CNI- chains the claim created in either backend (the rules jumping
//! into them first), and only those — a chain named like Kubernetes' that was there before, and
//! the operator's own chains, stay — with no manual step: the host is offered again (not
//! quarantined), both backends list what they listed before the claim, and the alternative is
//! still legacy.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::hosts::Host;
use byoh_tests::objects::{
    Running, delete_machine, finish, ready_cluster, settings, wait_released,
};
use byoh_tests::{agent, brownfield};

/// What the claim's node writes: kube-proxy through nf_tables (its service chains, a jump from
/// PREROUTING, the IPv6 twin), the kubelet through the host's `iptables` (legacy here).
const BOOTSTRAP: &str = "#cloud-config
runcmd:
- iptables-nft -t nat -N KUBE-SERVICES
- iptables-nft -t nat -A PREROUTING -m comment --comment kubernetes-service-portals -j KUBE-SERVICES
- iptables-nft -t nat -N KUBE-POSTROUTING
- ip6tables-nft -t nat -N KUBE-SERVICES
- iptables -t filter -N KUBE-FIREWALL
- iptables -t filter -A INPUT -j KUBE-FIREWALL
- mkdir -p /run/cluster-api
- touch /run/cluster-api/bootstrap-success.complete
";

/// Both backends' rules, IPv4 and IPv6, without the save's comments and counters, and without
/// tables that hold nothing but built-in chains accepting everything: the nf_tables backend
/// makes such a table the first time a tool names it, and no iptables command deletes a table
/// (`nft delete table ip6 nat` does; the test host has no `nft`), so one the claim's
/// `ip6tables-nft` made stays, empty, which changes nothing for any packet.
async fn rules(host: &Host) -> String {
    let mut out = String::new();
    for tool in [
        "iptables-legacy-save",
        "ip6tables-legacy-save",
        "iptables-nft-save",
        "ip6tables-nft-save",
    ] {
        let text = host.run(&[tool]).await.unwrap();
        out.push_str(&format!("== {tool}\n"));
        let mut table: Vec<String> = Vec::new();
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            // `:CHAIN POLICY [packets:bytes]`: the counters change with traffic.
            table.push(l.split(" [").next().unwrap_or(l).to_string());
            if l == "COMMIT" {
                let empty = table[1..table.len() - 1]
                    .iter()
                    .all(|l| l.starts_with(':') && l.ends_with(" ACCEPT"));
                if !empty {
                    out.push_str(&table.join("\n"));
                    out.push('\n');
                }
                table.clear();
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_release_removes_the_claims_chains_from_both_iptables_backends_and_only_those() {
    let Some((client, ns, host)) = brownfield::boot_networked("brownfield-iptables").await else {
        return;
    };
    let n = ns.name().to_string();
    let name = host.name().to_string();
    // The operator's host: iptables is legacy; its own chains in both backends, one of them
    // named like Kubernetes' (an earlier experiment's, not the claim's).
    for argv in [
        &[
            "update-alternatives",
            "--set",
            "iptables",
            "/usr/sbin/iptables-legacy",
        ][..],
        &[
            "update-alternatives",
            "--set",
            "ip6tables",
            "/usr/sbin/ip6tables-legacy",
        ],
        &["iptables", "-t", "filter", "-N", "SITE-FW"],
        &["iptables", "-t", "filter", "-A", "INPUT", "-j", "SITE-FW"],
        &["iptables-nft", "-t", "nat", "-N", "KUBE-BEFORE"],
    ] {
        host.run(argv).await.unwrap();
    }
    assert!(
        host.run(&["iptables", "-V"])
            .await
            .unwrap()
            .contains("legacy"),
        "the alternative is legacy"
    );
    let before = rules(&host).await;
    let snapshot = agent::snapshot(&host).await.unwrap();

    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    let bm = brownfield::claim_with(&client, &n, "c1", "m1", BOOTSTRAP).await;
    let during = rules(&host).await;
    for chain in [":KUBE-SERVICES", ":KUBE-POSTROUTING", ":KUBE-FIREWALL"] {
        assert!(during.contains(chain), "{chain}:\n{during}");
    }

    // Released: offered again without help (a quarantine would keep it CleaningUp).
    let uid = kube::ResourceExt::uid(&bm).unwrap();
    delete_machine(&client, &n, &name, "m1").await;
    wait_released(&client, &n, &name, &uid).await;
    assert_eq!(
        rules(&host).await,
        before,
        "both backends as before the claim"
    );
    assert!(
        host.run(&["iptables", "-V"])
            .await
            .unwrap()
            .contains("legacy")
    );
    let log = host
        .run(&["journalctl", "-u", "byoh-agent", "-o", "cat", "--no-pager"])
        .await
        .unwrap();
    for want in [
        "verify: removed the iptables chains the claim created: KUBE-FIREWALL",
        "verify: removed the iptables-nft chains the claim created: KUBE-POSTROUTING, KUBE-SERVICES",
        "verify: removed the ip6tables-nft chains the claim created: KUBE-SERVICES",
    ] {
        assert!(log.contains(want), "{want}:\n{log}");
    }
    brownfield::assert_as_before(&host, &snapshot).await;
    host.stop().await.unwrap();
    finish(&client, ns, vec![ctl]).await;
}
