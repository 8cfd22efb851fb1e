//! Issue 17 items 2 and 3 on the real API server, the controller in-process: a ByoMachine's
//! requirements on host facts (`minCPU`, `minMemory`, `acceleratorVendor`) choose among hosts
//! and the NoHostAvailable reason counts the hosts each one turned away; the API server refuses
//! malformed requirements. A ByoMachineTemplate reports what its Nodes would have for
//! autoscaling from zero (`status.capacity`, `status.nodeInfo`), from the hosts that fit it.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::byomachine::{ByoMachineTemplateResource, ByoMachineTemplateSpec};
use byoh_api::{ByoMachine, ByoMachineSpec, ByoMachineTemplate};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// Writes the facts an agent reports: CPUs, memory bytes, accelerator vendors.
async fn report_facts(
    client: &kube::Client,
    ns: &str,
    host: &str,
    cpus: i32,
    gib: i64,
    gpus: &[&str],
) {
    let accelerators: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(n, v)| {
            json!({"vendor": v, "vendorID": "0x10de", "deviceID": "0x20b0", "class": "0x030200",
                "pciAddress": format!("0000:3b:00.{n}")})
        })
        .collect();
    agent_status(
        client,
        ns,
        host,
        json!({"hostInfo": {"hostname": host, "architecture": "amd64", "osName": "debian",
            "cpus": cpus, "memoryBytes": gib << 30, "accelerators": accelerators}}),
    )
    .await;
}

fn requiring(cpu: Option<i32>, memory: Option<&str>, vendor: Option<&str>) -> ByoMachineSpec {
    ByoMachineSpec {
        min_cpu: cpu,
        min_memory: memory.map(|m| Quantity(m.into())),
        accelerator_vendor: vendor.map(Into::into),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn facts_requirements_choose_hosts_and_the_reason_counts_each_rejection() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-facts").await.unwrap();
    let n = ns.name().to_string();

    // Malformed requirements never reach the controller.
    let bms: Api<ByoMachine> = Api::namespaced(client.clone(), &n);
    for (what, spec) in [
        ("minMemory", requiring(None, Some("lots"), None)),
        ("minCPU", requiring(Some(0), None, None)),
        ("acceleratorVendor", requiring(None, None, Some("matrox"))),
    ] {
        let bm = ByoMachine::new("bad", spec);
        let err = bms.create(&PostParams::default(), &bm).await.unwrap_err();
        assert!(err.to_string().contains(what), "{what}: {err}");
    }

    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    for (host, cpus, gib, gpus) in [
        ("few-cpus", 2, 128, &["nvidia"][..]),
        ("little-memory", 32, 8, &["nvidia"][..]),
        ("no-gpu", 32, 128, &[][..]),
        ("other-gpu", 32, 128, &["amd"][..]),
    ] {
        create_host(&client, &n, host, &HostOpts::default()).await;
        report_facts(&client, &n, host, cpus, gib, gpus).await;
    }
    create_host(&client, &n, "no-facts", &HostOpts::default()).await;
    let opts = MachineOpts {
        spec: requiring(Some(8), Some("60Gi"), Some("nvidia")),
        ..MachineOpts::ready()
    };
    create_machine(&client, &n, "c1", "m1", &opts).await;
    let bm = eventually("NoHostAvailable", T, || async {
        let bm = get_bm(&client, &n, "m1").await?;
        (bm_condition(&bm, "HostClaimed") == Some(("False".into(), "NoHostAvailable".into())))
            .then_some(bm)
    })
    .await;
    let msg = condition(&bm.status.unwrap().conditions, "HostClaimed")
        .unwrap()
        .message
        .clone();
    for part in ["2 MinCPU", "1 MinMemory", "2 AcceleratorVendor"] {
        assert!(msg.contains(part), "{part} missing in {msg:?}");
    }

    // A host that fits arrives (its facts reported after registration): it is claimed.
    create_host(&client, &n, "fits", &HostOpts::default()).await;
    report_facts(&client, &n, "fits", 8, 64, &["intel", "nvidia"]).await;
    let claim = eventually("the fitting host claimed", T, || async {
        get_host(&client, &n, "fits").await.spec.claim
    })
    .await;
    assert_eq!(claim.machine_ref.name, "m1");
    assert_free(
        &client,
        &n,
        &[
            "few-cpus",
            "little-memory",
            "no-gpu",
            "other-gpu",
            "no-facts",
        ],
    )
    .await;
    finish(&client, ns, vec![ctl]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn template_capacity_for_autoscaling_from_zero_is_the_minimum_over_fitting_hosts() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let ns = TestNamespace::create(&client, "ctl-template")
        .await
        .unwrap();
    let n = ns.name().to_string();
    let ctl = Running::start(&client, &n, settings());
    for (host, cpus, gib, gpus) in [
        ("gpu-big", 64, 256, &["nvidia", "nvidia"][..]),
        ("gpu-small", 16, 64, &["nvidia"][..]),
        ("cpu-only", 8, 32, &[][..]),
    ] {
        create_host(&client, &n, host, &HostOpts::default()).await;
        report_facts(&client, &n, host, cpus, gib, gpus).await;
    }
    let templates: Api<ByoMachineTemplate> = Api::namespaced(client.clone(), &n);
    let template = ByoMachineTemplate::new(
        "gpu",
        ByoMachineTemplateSpec {
            template: ByoMachineTemplateResource {
                metadata: None,
                spec: requiring(None, None, Some("nvidia")),
            },
        },
    );
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let capacity = |t: &ByoMachineTemplate| -> Vec<(String, String)> {
        t.status
            .iter()
            .flat_map(|s| s.capacity.iter())
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect()
    };
    let want = |cpu: &str, memory: &str, gpus: &str| {
        vec![
            ("cpu".to_string(), cpu.to_string()),
            ("memory".to_string(), memory.to_string()),
            ("nvidia.com/gpu".to_string(), gpus.to_string()),
        ]
    };
    let first = eventually("the template's capacity", T, || async {
        let t = templates.get("gpu").await.ok()?;
        (capacity(&t) == want("16", "67108864Ki", "1")).then_some(t)
    })
    .await;
    let node_info = first.status.unwrap().node_info.unwrap();
    assert_eq!(node_info.architecture.as_deref(), Some("amd64"));
    assert_eq!(node_info.operating_system.as_deref(), Some("linux"));

    // The smallest fitting host goes (its facts no longer fit): the minimum rises, on the
    // host's event alone.
    report_facts(&client, &n, "gpu-small", 16, 64, &[]).await;
    eventually("the capacity without the small host", T, || async {
        let t = templates.get("gpu").await.ok()?;
        (capacity(&t) == want("64", "268435456Ki", "2")).then_some(())
    })
    .await;
    finish(&client, ns, vec![ctl]).await;
}
