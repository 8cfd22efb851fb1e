//! Issue 6 part A: claims stay race-free when two controller instances reconcile at once
//! (leader election off, so both really race) while a third writer keeps changing the hosts;
//! and leader election hands over the Lease.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::{ByoHost, ByoMachine};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_machines_race_for_twenty_hosts_across_two_controllers() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-race").await.unwrap();
    let n = ns.name().to_string();
    ready_cluster(&client, &n, "c1").await;
    let names: Vec<String> = (0..20).map(|i| format!("host-{i:02}")).collect();
    let host_opts = HostOpts::default();
    futures::future::join_all(
        names
            .iter()
            .map(|h| create_host(&client, &n, h, &host_opts)),
    )
    .await;

    let a = Running::start(&client, &n, settings());
    let b = Running::start(&client, &n, settings());

    // The third writer: keeps patching a label on random hosts (each write bumps the
    // resourceVersion under the claimers' feet).
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (client, n, names, stop, writes) = (
            client.clone(),
            n.clone(),
            names.clone(),
            stop.clone(),
            writes.clone(),
        );
        tokio::spawn(async move {
            let api = Api::<ByoHost>::namespaced(client, &n);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let h = &names[rand::random_range(0..names.len())];
                i += 1;
                let patch = json!({"metadata": {"labels": {"touched": i.to_string()}}});
                if api
                    .patch(h, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    writes.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    futures::future::join_all((0..30).map(|i| {
        let (client, n) = (client.clone(), n.clone());
        async move {
            create_machine(
                &client,
                &n,
                "c1",
                &format!("m-{i:02}"),
                &MachineOpts::ready(),
            )
            .await
        }
    }))
    .await;

    // Exactly 20 claims, stable, every ByoMachine with at most one host.
    let bms = Api::<ByoMachine>::namespaced(client.clone(), &n);
    eventually(
        "20 claims and 10 NoHostAvailable",
        Duration::from_secs(60),
        || async {
            let hs = hosts(&client, &n).await;
            let claimed = hs.iter().filter(|h| h.spec.claim.is_some()).count();
            let machines = bms.list(&Default::default()).await.unwrap().items;
            let waiting = machines
                .iter()
                .filter(|bm| {
                    bm_condition(bm, "HostClaimed")
                        == Some(("False".into(), "NoHostAvailable".into()))
                })
                .count();
            (claimed == 20 && waiting == 10).then_some(())
        },
    )
    .await;
    // Keep racing a while longer: nothing may change hands.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(
        writes.load(Ordering::Relaxed) > 20,
        "the third writer must really write"
    );

    let hs = hosts(&client, &n).await;
    let machines = bms.list(&Default::default()).await.unwrap().items;
    let uid_of: HashMap<String, String> = machines
        .iter()
        .map(|bm| (bm.uid().unwrap(), bm.name_any()))
        .collect();
    let mut per_machine: HashMap<String, Vec<String>> = HashMap::new();
    for h in &hs {
        let claim = h.spec.claim.as_ref().expect("every host claimed");
        assert_eq!(
            uid_of.get(&claim.machine_ref.uid),
            Some(&claim.machine_ref.name)
        );
        per_machine
            .entry(claim.machine_ref.uid.clone())
            .or_default()
            .push(h.name_any());
    }
    assert_eq!(hs.len(), 20);
    assert_eq!(
        per_machine.len(),
        20,
        "20 hosts held by 20 distinct ByoMachines: {per_machine:?}"
    );
    // Each claimed ByoMachine's status names the host that carries its claim.
    let mut named = HashSet::new();
    for bm in &machines {
        let uid = bm.uid().unwrap();
        if let Some(hosts) = per_machine.get(&uid) {
            assert_eq!(hosts.len(), 1);
            let hr = eventually("hostRef", Duration::from_secs(10), || async {
                let bm = get_bm(&client, &n, &bm.name_any()).await?;
                bm.status?.host_ref.filter(|r| r.name == hosts[0])
            })
            .await;
            assert!(named.insert(hr.name));
        }
    }
    assert_eq!(named.len(), 20);
    finish(&client, ns, vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_election_hands_the_lease_over_on_shutdown() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-leader").await.unwrap();
    let n = ns.name().to_string();
    let elect = |id: &str| byoh_controller::run::Settings {
        leader_elect: true,
        leader_election_namespace: Some(n.clone()),
        identity: Some(id.into()),
        ..settings()
    };
    let leases = Api::<Lease>::namespaced(client.clone(), &n);
    let holder = || async {
        leases
            .get_opt(byoh_controller::run::LEADER_LEASE)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
    };
    let a = Running::start(&client, &n, elect("first"));
    eventually("first leads", Duration::from_secs(20), || async {
        (holder().await.as_deref() == Some("first")).then_some(())
    })
    .await;
    let b = Running::start(&client, &n, elect("second"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(holder().await.as_deref(), Some("first"));

    // The standby does not reconcile: a ready cluster's ByoMachine stays untouched... until the
    // leader goes and the standby takes over.
    a.stop().await;
    // Released as the leader stops, not left to expire (duration 15 s, grace 5 s): a release
    // that failed or never ran leaves "first" there until then.
    let after_stop = holder().await;
    assert_ne!(
        after_stop.as_deref(),
        Some("first"),
        "the stopped leader still holds the Lease"
    );
    // The standby, which sleeps until the expiry it last saw, takes over within one Lease
    // duration (15 s) plus its random back-off (at most 1 s) and a request.
    eventually("second leads", Duration::from_secs(18), || async {
        (holder().await.as_deref() == Some("second")).then_some(())
    })
    .await;
    ready_cluster(&client, &n, "c1").await;
    create_host(&client, &n, "h1", &HostOpts::default()).await;
    create_machine(&client, &n, "c1", "m1", &MachineOpts::ready()).await;
    eventually("the new leader claims", Duration::from_secs(20), || async {
        get_host(&client, &n, "h1").await.spec.claim
    })
    .await;
    finish(&client, ns, vec![b]).await;
}
