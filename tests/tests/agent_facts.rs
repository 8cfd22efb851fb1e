//! System tests of issue 17 (host facts): the agent on a booted Debian 12 host reports the
//! host's real facts on its ByoHost — compared with what the test reads from the host itself —
//! with the labels derived from them; a change on the host (containerd gone and back, a kubelet
//! installed by hand and removed) appears in the status, while a refresh that finds nothing new
//! writes nothing.

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

/// Waits (up to 60 s) until ByoHost `name`'s `status.hostInfo` has the field `what` that `pick`
/// takes out of it, and returns it.
async fn reported_fact(
    hosts_api: &Api<ByoHost>,
    name: &str,
    what: &str,
    pick: fn(byoh_api::byohost::HostInfo) -> Option<String>,
) -> String {
    wait_for(
        &format!("{what} in the status"),
        Duration::from_secs(60),
        || async {
            Ok(hosts_api
                .get(name)
                .await?
                .status
                .and_then(|s| pick(s.host_info?)))
        },
    )
    .await
    .unwrap()
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
    // The hierarchy this machine gives its hosts, as a fact and a label.
    assert!(info.cgroup_version.is_some(), "{info:?}");
    assert_eq!(label(labels::HOST_CGROUP), info.cgroup_version);

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
    let back = reported_fact(&hosts_api, &name, "containerRuntimeVersion", |i| {
        i.container_runtime_version
    })
    .await;
    assert_eq!(back, format!("containerd://{version}"));

    // Kubernetes an operator installs by hand (the test bed's kubelet, a real build of the
    // pinned version, where pkgs.k8s.io's package puts it): its version is reported as
    // `kubelet --version` prints it, with the label derived from it (selection hands such a
    // host only to Machines of that version: installer_versions.rs); removed, both go.
    assert_eq!(info.kubelet_version, None, "the image has no kubelet");
    let artifacts = byoh_tests::kubeadm::stage_artifacts().unwrap();
    host.copy_in(&artifacts.join("kubelet"), "/usr/bin/kubelet", 0o755)
        .await
        .unwrap();
    let printed = sh(&host, "kubelet --version").await;
    let want = printed
        .strip_prefix("Kubernetes ")
        .unwrap_or_else(|| panic!("kubelet --version printed {printed:?}"))
        .to_string();
    let kubelet = reported_fact(&hosts_api, &name, "kubeletVersion", |i| i.kubelet_version).await;
    assert_eq!(kubelet, want);
    let version_label = |h: ByoHost| {
        h.metadata
            .labels
            .and_then(|l| l.get(labels::HOST_K8S_VERSION).cloned())
    };
    assert_eq!(
        version_label(hosts_api.get(&name).await.unwrap()),
        Some(want.clone())
    );
    host.run(&["rm", "/usr/bin/kubelet"]).await.unwrap();
    wait_for(
        "kubeletVersion and its label gone",
        Duration::from_secs(60),
        || async {
            let h = hosts_api.get(&name).await?;
            let in_status = h
                .status
                .as_ref()
                .and_then(|s| s.host_info.as_ref()?.kubelet_version.clone());
            Ok((in_status.is_none() && version_label(h).is_none()).then_some(()))
        },
    )
    .await
    .unwrap();

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// `(column, cell)` pairs of ByoHost `name`'s row in the server-side Table of the namespace's
/// ByoHosts: what `kubectl get byohosts -o wide` prints (its columns are the CRD's
/// printer columns).
async fn table_row(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    use kube::Resource as _;
    let request = http::Request::get(ByoHost::url_path(&(), Some(ns)))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let table: serde_json::Value = client.request(request).await.unwrap();
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    let row = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cells"][0] == name)
        .unwrap_or_else(|| panic!("no row for {name}: {table}"));
    columns
        .into_iter()
        .zip(row["cells"].as_array().unwrap())
        .map(|(c, v)| (c, v.as_str().map_or_else(|| v.to_string(), str::to_string)))
        .collect()
}

/// `LeaseCurrent` of ByoHost `name`: `(status, reason, message)`.
async fn lease_current(hosts: &Api<ByoHost>, name: &str) -> Option<(String, String, String)> {
    let host = hosts.get(name).await.ok()?;
    let c = host
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "LeaseCurrent")?;
    Some((c.status, c.reason, c.message))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_whose_agent_stops_shows_offline_within_its_lease_and_back_when_it_starts() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "agent-liveness")
        .await
        .unwrap();
    let host = Host::boot("liveness").await.unwrap();
    let name = host.name().to_string();
    let kubeconfig = control_plane::kubeconfig_path().unwrap();
    // A 15 s Lease (agent::register's configuration), renewed every 5 s.
    agent::register(&client, &kubeconfig, ns.name(), &host, "")
        .await
        .unwrap();
    let ctl =
        byoh_tests::objects::Running::start(&client, ns.name(), byoh_tests::objects::settings());
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let online = |status: &'static str| {
        let hosts_api = hosts_api.clone();
        let name = name.clone();
        move || {
            let hosts_api = hosts_api.clone();
            let name = name.clone();
            async move {
                Ok::<_, anyhow::Error>(
                    lease_current(&hosts_api, &name)
                        .await
                        .filter(|(s, _, _)| s == status),
                )
            }
        }
    };
    wait_for("LeaseCurrent=True", Duration::from_secs(30), online("True"))
        .await
        .unwrap();
    let row = table_row(&client, ns.name(), &name).await;
    let cell = |row: &[(String, String)], column: &str| {
        row.iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no column {column} in {row:?}"))
    };
    assert_eq!(cell(&row, "Online"), "True");
    let reported = hosts_api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(
        cell(&row, "Agent"),
        reported.agent_version.unwrap_or_default()
    );
    assert!(!cell(&row, "Agent").is_empty());

    // The agent stops (a crash, a stopped unit, a host gone dark): within the Lease's 15 s
    // plus a margin for the watch, the ByoHost says so, with the last renewal.
    host.run(&["systemctl", "stop", "byoh-agent"])
        .await
        .unwrap();
    let stopped = std::time::Instant::now();
    let (_, reason, message) = wait_for(
        "LeaseCurrent=False after the agent stopped",
        Duration::from_secs(15 + 10),
        online("False"),
    )
    .await
    .unwrap();
    let took = stopped.elapsed();
    assert_eq!(reason, "LeaseExpired");
    assert!(
        message.contains("last renewed its Lease at")
            && message.contains("journalctl -u byoh-agent"),
        "{message}"
    );
    assert_eq!(
        cell(&table_row(&client, ns.name(), &name).await, "Online"),
        "False"
    );
    eprintln!("offline shown {} s after the agent stopped", took.as_secs());

    // Started again: back at its first renewal.
    host.run(&["systemctl", "start", "byoh-agent"])
        .await
        .unwrap();
    wait_for(
        "LeaseCurrent=True after the agent started",
        Duration::from_secs(30),
        online("True"),
    )
    .await
    .unwrap();

    host.stop().await.unwrap();
    byoh_tests::objects::finish(&client, ns, vec![ctl]).await;
}
