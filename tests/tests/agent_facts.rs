//! System tests of issue 17 (host facts): the agent on a booted Debian 12 host reports the
//! host's real facts on its ByoHost — compared with what the test reads from the host itself —
//! with the labels derived from them; a change on the host appears in the status, while a
//! refresh that finds nothing new writes nothing.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::{ByoHost, labels};
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use kube::Api;
use std::time::Duration;

/// `factsCheckedAt` of the agent's local status file: when the agent last gathered facts.
async fn facts_checked_at(host: &Host) -> Option<String> {
    let text = host
        .read_to_string("/var/lib/byoh/agent-status.json")
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["factsCheckedAt"].as_str().map(str::to_string)
}

/// Waits until the agent has gathered facts twice after this call: at least one whole refresh
/// ran after whatever the caller read before.
async fn two_refreshes(host: &Host) {
    for round in 0..2 {
        let before = facts_checked_at(host).await;
        wait_for(
            &format!("facts refresh {round}"),
            Duration::from_secs(60),
            || async {
                Ok(facts_checked_at(host)
                    .await
                    .filter(|t| Some(t) != before.as_ref()))
            },
        )
        .await
        .unwrap();
    }
}

/// Runs `script` with `sh -c` in the C locale (so `sort` and globs order as Rust does).
async fn sh(host: &Host, script: &str) -> String {
    host.run(&["sh", "-c", &format!("export LC_ALL=C; {script}")])
        .await
        .unwrap()
        .trim()
        .to_string()
}

/// The host's interfaces but the loopback, as `ip` lists them, sorted. Hosts share the test
/// machine's network namespace, so this is the machine's list.
async fn links(host: &Host) -> Vec<String> {
    sh(
        host,
        "ip -o link show | awk -F': ' '$2 != \"lo\" {split($2, n, \"@\"); print n[1]}' | sort",
    )
    .await
    .lines()
    .map(str::to_string)
    .collect()
}

/// How many times the agent logged that it reported changed facts.
async fn facts_reports(host: &Host) -> usize {
    host.journal_messages("byoh-agent")
        .await
        .unwrap()
        .iter()
        .filter(|m| m.contains("host facts changed"))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn byohost_reports_the_hosts_real_facts_and_labels_and_writes_only_changes() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "agent-facts").await.unwrap();
    let host = Host::boot("facts").await.unwrap();
    let name = host.name().to_string();
    let kubeconfig = control_plane::kubeconfig_path().unwrap();
    agent::register(
        &client,
        &kubeconfig,
        ns.name(),
        &host,
        "facts_interval = \"5s\"\n",
    )
    .await
    .unwrap();
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let registered = hosts_api.get(&name).await.unwrap();
    let info = registered.status.unwrap().host_info.unwrap();

    // What the host says about itself, read by other means than the agent's.
    let nproc: i32 = sh(&host, "nproc").await.parse().unwrap();
    assert_eq!(info.cpus, nproc);
    let mem_kib: i64 = sh(&host, "awk '/^MemTotal:/ {print $2}' /proc/meminfo")
        .await
        .parse()
        .unwrap();
    assert_eq!(info.memory_bytes, mem_kib * 1024);
    let model = sh(
        &host,
        "grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | tr -s ' ' | sed 's/^ //'",
    )
    .await;
    if !model.is_empty() {
        assert_eq!(info.cpu_model.as_deref(), Some(model.as_str()));
    }
    let cores: i32 = sh(
        &host,
        "for t in /sys/devices/system/cpu/cpu[0-9]*/topology; do \
         echo \"$(cat $t/physical_package_id) $(cat $t/core_id)\"; done | sort -u | wc -l",
    )
    .await
    .parse()
    .unwrap();
    assert_eq!(info.cpu_cores, Some(cores));
    let fs = sh(&host, "stat -fc %T /sys/fs/cgroup").await;
    let cgroup = if fs == "cgroup2fs" { "v2" } else { "v1" };
    assert_eq!(info.cgroup_version.as_deref(), Some(cgroup), "{fs}");
    assert_eq!(info.kernel_version, sh(&host, "uname -r").await);
    assert_eq!(
        (info.os_name.as_str(), info.os_version.as_str()),
        ("debian", "12")
    );
    let containerd = sh(&host, "containerd --version").await;
    let version = containerd.split_whitespace().nth(2).unwrap();
    assert_eq!(
        info.container_runtime_version.as_deref(),
        Some(format!("containerd://{version}").as_str())
    );
    // Whole disks as lsblk lists them (empty ones too; no loop, ram or zram devices; no
    // partitions).
    let disks = sh(
        &host,
        "lsblk -a -d -b -n -e 1,7 -o NAME,SIZE,ROTA | grep -v '^zram' | sort",
    )
    .await;
    let reported: Vec<String> = info
        .disks
        .iter()
        .map(|d| format!("{} {} {}", d.name, d.size_bytes, u8::from(d.rotational)))
        .collect();
    let listed: Vec<String> = disks
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(reported, listed);
    // Interfaces as `ip` lists them (the machine's: they may change meanwhile, so until the
    // two agree), with their MACs.
    let network = wait_for(
        "the reported interfaces to be the host's",
        Duration::from_secs(60),
        || async {
            let network = hosts_api.get(&name).await?.status.and_then(|s| s.network);
            let listed = links(&host).await;
            Ok(network.filter(|n| {
                let mut names: Vec<String> = n.interfaces.iter().map(|i| i.name.clone()).collect();
                names.sort_unstable();
                names == listed
            }))
        },
    )
    .await
    .unwrap();
    for i in &network.interfaces {
        let mac = sh(
            &host,
            &format!("cat /sys/class/net/{}/address 2>/dev/null || true", i.name),
        )
        .await;
        if !mac.is_empty() && mac != "00:00:00:00:00:00" {
            assert_eq!(i.mac_address.as_deref(), Some(mac.as_str()), "{}", i.name);
        }
    }
    // Accelerators: display (0x03) and processing-accelerator (0x12) classes of NVIDIA, AMD,
    // Intel on the PCI bus.
    let gpus = sh(
        &host,
        "for d in /sys/bus/pci/devices/*; do v=$(cat $d/vendor); c=$(cat $d/class); \
         case $v in 0x10de|0x1002|0x8086) case $c in 0x03*|0x12*) basename $d;; esac;; esac; done",
    )
    .await;
    let addresses: Vec<&str> = info
        .accelerators
        .iter()
        .map(|a| a.pci_address.as_str())
        .collect();
    assert_eq!(addresses, gpus.lines().collect::<Vec<_>>());

    // The labels derived from the facts, and `-o wide`'s columns come from them.
    let host_labels = hosts_api.get(&name).await.unwrap().metadata.labels.unwrap();
    let label = |k: &str| host_labels.get(k).cloned();
    assert_eq!(label(labels::HOST_CPU_CORES), Some(cores.to_string()));
    let gib = (mem_kib * 1024 + (1 << 29)) >> 30;
    assert_eq!(label(labels::HOST_MEMORY_GIB), Some(gib.to_string()));
    assert_eq!(
        label(labels::HOST_ACCELERATOR_VENDOR).is_some(),
        !info.accelerators.is_empty()
    );
    assert_eq!(label(labels::HOST_ARCH).as_deref(), Some("amd64"));

    // `byoh-agent facts --output json` prints what the ByoHost holds.
    let printed: serde_json::Value = serde_json::from_str(
        &host
            .run(&["byoh-agent", "facts", "--output", "json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(printed["hostInfo"]["cpus"], info.cpus);
    assert_eq!(printed["hostInfo"]["memoryBytes"], info.memory_bytes);
    assert_eq!(
        printed["hostInfo"]["containerRuntimeVersion"],
        serde_json::json!(info.container_runtime_version)
    );

    // An idle refresh writes nothing: over two whole refreshes the agent reports nothing and
    // the ByoHost keeps its resourceVersion. (Other hosts of the machine may add or remove
    // interfaces meanwhile, a real change: then the window is tried again.)
    let mut idle_windows = 0;
    loop {
        two_refreshes(&host).await;
        let before_links = links(&host).await;
        let rv = hosts_api
            .get(&name)
            .await
            .unwrap()
            .metadata
            .resource_version;
        let reports = facts_reports(&host).await;
        two_refreshes(&host).await;
        if links(&host).await != before_links && idle_windows < 3 {
            idle_windows += 1;
            continue;
        }
        assert_eq!(
            hosts_api
                .get(&name)
                .await
                .unwrap()
                .metadata
                .resource_version,
            rv,
            "an unchanged refresh must not write the ByoHost"
        );
        assert_eq!(facts_reports(&host).await, reports, "no facts reported");
        break;
    }
    // A change on the host appears: containerd's binary goes away, then comes back. (The
    // hosts share the test machine's network namespace, so a hot-plugged interface would
    // reach every other host on the machine; a change inside this host's own tree does not.)
    host.run(&["mv", "/usr/bin/containerd", "/usr/bin/containerd.away"])
        .await
        .unwrap();
    wait_for(
        "containerRuntimeVersion gone from the status",
        Duration::from_secs(60),
        || async {
            Ok(hosts_api.get(&name).await?.status.and_then(|s| {
                s.host_info
                    .filter(|i| i.container_runtime_version.is_none())
                    .map(|_| ())
            }))
        },
    )
    .await
    .unwrap();
    host.run(&["mv", "/usr/bin/containerd.away", "/usr/bin/containerd"])
        .await
        .unwrap();
    let back = wait_for(
        "containerRuntimeVersion back in the status",
        Duration::from_secs(60),
        || async {
            Ok(hosts_api
                .get(&name)
                .await?
                .status
                .and_then(|s| s.host_info?.container_runtime_version))
        },
    )
    .await
    .unwrap();
    assert_eq!(back, format!("containerd://{version}"));

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
