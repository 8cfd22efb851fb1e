//! `make demo` (run by `tests/demo/up` through `tests/run`): a cluster made by Cluster API on
//! BYOH hosts, narrated. Starts a management control plane with Cluster API's own managers
//! (core, kubeadm bootstrap, kubeadm control plane), BYOH (`clusterctl init`) and its controller, an image
//! registry and a package mirror on the test network, boots two Debian 12 hosts there and
//! registers them with the agent's `.deb`; then `clusterctl generate cluster demo | kubectl
//! apply`: KCP's control-plane Machine takes a host (`kubeadm init` through the agent), the
//! MachineDeployment's worker takes the other (`kubeadm join`), and a table of Machines,
//! ByoHosts and Nodes is printed at every change until Cluster API reports the Cluster
//! `Available` with both Nodes Ready. Then it prints how to explore and keeps everything
//! running until SIGINT (Ctrl-C) or SIGTERM (`make demo-down`), when it stops it all.
//!
//! Environment: as `tests/run` sets it (`BYOH_TEST_HOST_IMAGE`, `BYOH_TEST_HOST_PREFIX`);
//! `BYOH_DEMO_DIR` (default `/var/tmp/byoh-demo`) receives `demo.pid` and the kubeconfigs;
//! `BYOH_DEMO_KUBECTL` is the kubectl the printed commands use (default `kubectl`).

use byoh_tests::capi_bed::CapiBed;
use byoh_tests::capi_cluster::{CapiCluster, condition_true, node_ready, skip_system_verification};
use byoh_tests::manifests::apply_yaml;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cluster's name.
const CLUSTER: &str = "demo";
/// The control-plane endpoint, in the test network's free range (tests/hosts/network).
const ENDPOINT_IP: &str = "198.18.0.250";
/// How long the cluster may take to become Available.
const TIMEOUT: Duration = Duration::from_secs(900);

fn say(step: &str) {
    eprintln!("\n\x1b[1m==> {step}\x1b[0m");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let state = PathBuf::from(
        std::env::var("BYOH_DEMO_DIR").unwrap_or_else(|_| "/var/tmp/byoh-demo".into()),
    );
    std::fs::create_dir_all(&state)?;
    std::fs::write(state.join("demo.pid"), std::process::id().to_string())?;
    let result = run(&state).await;
    let _ = std::fs::remove_file(state.join("demo.pid"));
    result
}

async fn run(state: &Path) -> anyhow::Result<()> {
    let t0 = Instant::now();
    say(
        "1/5 The management cluster: control plane, Cluster API's managers (core, kubeadm \
         bootstrap, kubeadm control plane), BYOH by `clusterctl init --infrastructure byoh` \
         and its controller; two Debian 12 \
         hosts on the test network with the agent .deb, registered in the pool",
    );
    let bed = CapiBed::start(2, "byoh-pool").await?;
    let c = CapiCluster::new(&bed, CLUSTER);
    let ns = bed.ns.as_str();
    print_table(&c).await;

    say(&format!(
        "2/5 clusterctl generate cluster {CLUSTER} --infrastructure byoh \
         --control-plane-machine-count 1 --worker-machine-count 1 --target-namespace {ns} \
         | kubectl apply -f -   (CONTROL_PLANE_ENDPOINT_IP={ENDPOINT_IP})"
    ));
    let yaml = skip_system_verification(&c.generate(None, ENDPOINT_IP)?)?;
    apply_yaml(&bed.admin, &yaml, false).await?;
    for line in yaml.lines().filter(|l| l.starts_with("kind: ")) {
        eprintln!("    applied {}", line.trim_start_matches("kind: "));
    }

    say(
        "3/5 KCP makes the control-plane Machine; BYOH's controller gives it a host; the agent \
         runs CABPK's cloud-config there (kubeadm init)",
    );
    let (machine, host) = c.control_plane_host(ENDPOINT_IP, TIMEOUT).await?;
    eprintln!(
        "    Machine {} -> ByoHost {host}; {ENDPOINT_IP} added to its host0 (stand-in for \
         kube-vip, whose image is not available offline)",
        machine.name_any()
    );

    say(
        "4/5 Watching Machines, ByoHosts and Nodes until Cluster API reports the Cluster Available",
    );
    watch_until_available(&c).await?;

    say("5/5 clusterctl describe cluster");
    eprintln!("{}", bed.describe(CLUSTER)?);
    let mgmt = bed.cp.kubeconfig().to_path_buf();
    let workload = state.join("demo.kubeconfig");
    write_workload_kubeconfig(&c, &workload).await?;
    let hosts: Vec<&str> = bed.hosts.iter().map(|h| h.name()).collect();
    let kubectl = std::env::var("BYOH_DEMO_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    eprintln!(
        "\nDone in {} s. Everything keeps running until Ctrl-C here or `make demo-down`.\n\n\
         \x20   {kubectl} --kubeconfig {m} -n {ns} get clusters,machines,byomachines,byohosts\n\
         \x20   {kubectl} --kubeconfig {w} get nodes -o wide\n\
         \x20   tests/hosts/exec {h} -- journalctl -u byoh-agent -u kubelet --no-pager | less\n\
         \x20   {kubectl} --kubeconfig {m} -n {ns} scale machinedeployment/{CLUSTER}-md-0 --replicas=0\n\
         \x20       (the worker's host is reset, cleaned and back in the pool)\n",
        t0.elapsed().as_secs(),
        m = mgmt.display(),
        w = workload.display(),
        h = hosts.first().copied().unwrap_or("HOST"),
    );
    wait_for_stop().await?;
    say("Stopping: hosts, managers, controller, registry, control plane");
    Ok(())
}

/// Prints [`table`] at every change until the Cluster's `Available` condition is True and the
/// workload cluster has two Ready Nodes.
async fn watch_until_available(c: &CapiCluster<'_>) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let now = table(c).await;
        if now != last {
            eprintln!("\n    [{:>3} s]\n{now}", t0.elapsed().as_secs());
            last = now;
        }
        let cluster = c.bed.capi("Cluster").get(CLUSTER).await?;
        if condition_true(&cluster, "Available") && ready_nodes(c).await == 2 {
            return Ok(());
        }
        anyhow::ensure!(
            t0.elapsed() < TIMEOUT,
            "the Cluster is not Available after {} s:\n{}",
            TIMEOUT.as_secs(),
            c.bed.diagnostics(CLUSTER).await
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn print_table(c: &CapiCluster<'_>) {
    eprintln!("{}", table(c).await);
}

/// One line per Machine (phase, host), ByoHost (phase, claim) and workload Node (Ready).
async fn table(c: &CapiCluster<'_>) -> String {
    let mut rows = vec![("KIND", "NAME".to_string(), "STATE".to_string())];
    if let Ok(ms) = c.bed.capi("Machine").list(&ListParams::default()).await {
        for m in ms {
            let phase = m.data["status"]["phase"]
                .as_str()
                .unwrap_or("-")
                .to_string();
            let host = c.host_of(&m).await.ok().flatten().unwrap_or_default();
            rows.push(("Machine", m.name_any(), format!("{phase} {host}")));
        }
    }
    if let Ok(hs) = c.byohosts().list(&ListParams::default()).await {
        for h in hs {
            let phase = h.status.as_ref().and_then(|s| s.phase.clone());
            let claim = h.spec.claim.as_ref().map(|cl| cl.machine_ref.name.clone());
            rows.push((
                "ByoHost",
                h.name_any(),
                format!(
                    "{} {}",
                    phase.unwrap_or_else(|| "-".into()),
                    claim.map(|m| format!("claim={m}")).unwrap_or_default()
                ),
            ));
        }
    }
    if let Ok((client, _)) = c.workload().await
        && let Ok(nodes) = Api::<Node>::all(client).list(&ListParams::default()).await
    {
        for n in nodes {
            let ready = if node_ready(&n) { "Ready" } else { "NotReady" };
            rows.push(("Node", n.name_any(), ready.to_string()));
        }
    }
    let width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, n, s)| format!("    {k:<10} {n:<width$} {s}"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn ready_nodes(c: &CapiCluster<'_>) -> usize {
    let Ok((client, _)) = c.workload().await else {
        return 0;
    };
    Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .map_or(0, |l| l.items.iter().filter(|n| node_ready(n)).count())
}

/// The workload cluster's admin kubeconfig (`<cluster>-kubeconfig` Secret, as `clusterctl get
/// kubeconfig` prints it), mode 0600.
async fn write_workload_kubeconfig(c: &CapiCluster<'_>, path: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let data = c.workload_kubeconfig().await?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(&data)?;
    Ok(())
}

/// Returns on SIGINT or SIGTERM.
async fn wait_for_stop() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
