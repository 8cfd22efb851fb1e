//! Cluster API itself drives BYOH (issue 15): `clusterctl generate cluster` output applied as
//! generated, reconciled by Cluster API's own managers (core, kubeadm bootstrap CABPK, kubeadm
//! control plane KCP, built from the Go module proxy and run by `tests/capi/up`), on hosts that
//! run the packaged agent. KCP's first control-plane Machine takes a BYOH host, whose agent runs
//! CABPK's `kubeadm init` cloud-config; the workload API server answers at the cluster's
//! `CONTROL_PLANE_ENDPOINT_IP:6443`; the MachineDeployment's worker joins with CABPK's join data.
//! Every step is asserted on what Cluster API reports. docs/getting_started.md's Cluster API
//! steps (its `sh test-capi*` blocks: `kubectl apply` of the generated cluster and the waits for
//! it, the move to another management cluster and the hosts' following) are run as written at
//! the points of the scenario they describe ([`Page`]: the page's section 8 by the first test,
//! section 10 by the second; a third checks that no such block lies elsewhere); the clusters are
//! the page's `demo` and `demo2` in `byoh-pool`; a block left unrun fails the test.
//!
//! The site (docs/e2e.md): a management control plane of the test's own; three hosts on the
//! test network (`tests/hosts/boot --network --containers`: an address and ports of their own,
//! runc for static pods), prepared as a site prepares its machines ([`byoh_tests::machine::prepare`]: the
//! site's CA trusted, IPv4 forwarding, containerd's sandbox image from the site's registry, a
//! bridge CNI configuration); the control-plane images built from the pinned sources and served by a real
//! registry (`tests/images/serve`, the cluster's `IMAGE_REPOSITORY`); Kubernetes packages built
//! from the same binaries in a signed apt repository (the cluster's `BYOH_APT_REPOSITORY`,
//! `BYOH_APT_KEY_URL`). Declared stand-in: kube-vip's image is not available here, so the test
//! adds `CONTROL_PLANE_ENDPOINT_IP` to the first control-plane host's interface when that host
//! is claimed, as kube-vip would; the rendered kube-vip manifest is checked to parse as a Pod.
//! Declared test-bed adaptations for this machine (cgroup v1, no `CAP_SYS_RESOURCE`): kubeadm's
//! `SystemVerification` preflight check is added to the generated `ignorePreflightErrors`
//! ([`byoh_tests::capi_cluster::skip_system_verification`]), and `tests/hosts/prepare-kubelet` gives the kubelet
//! `--fail-cgroupv1=false` and wraps runc to drop negative `oom_score_adj` values.
//!
//! Asserted, in order: KCP's control-plane Machine gets a ByoHost; the workload API server
//! answers at the endpoint with the cluster's version (kubeconfig Secret written by KCP); the
//! Nodes Ready, each Machine's nodeRef naming a Node whose providerID is its ByoMachine's; the
//! Cluster's `Available`, `ControlPlaneAvailable` and `WorkersAvailable` True; two ByoHosts
//! `Provisioned`. Then `cluster.spec.paused`: Machines and ByoMachines report `Paused`, the
//! MachineDeployment scaled to 2 makes no Machine and no claim for 20 s; unpaused, the third host
//! is claimed and its Node Ready (MachineDeployment `replicas`/`upToDate`/`available`/`ready` 2).
//! Scale 2 -> 1: a worker Machine and its Node go, its host is released (`kubeadm reset`),
//! `Available`, its file tree and unit list equal to its snapshot before any claim. The API
//! server and every kubelet report v1.36.3. Then the upgrade to the next minor, v1.37.2 (issue
//! 36), by docs/upgrades.md's blocks as written (`kubectl patch` of the versions, `kubectl wait`
//! for them; the bed also serves v1.37.2's images and a v1.37 package repository, the template's
//! `aptRepository` holding `@minor@`): KCP's new control-plane Machine at v1.37.2 takes the free
//! host (one a v1.36 Machine left), whose agent installs v1.37.2 and runs CABPK's control-plane
//! join; the old control-plane host is released clean (its endpoint address removed by the
//! agent), the stand-in moves the endpoint; the API server answers v1.37.2. Then the
//! MachineDeployment rolls: its new Machine takes the old control-plane host and installs
//! v1.37.2 there, the old worker's host is released and clean, no Node of it left; every Node's
//! kubelet reports v1.37.2, the Cluster Available. Delete the Cluster: every Machine gone, every host
//! `Available` and clean, no ByoMachine or ByoCluster left, no host's Role granting a Secret or
//! K8sInstallerConfig, the cluster's Secrets garbage-collected; the control-plane host's
//! `cni0` and endpoint address removed by the agent's clean-up, without help.
//!
//! The second test, on a bed of its own and at the same time as the first (issue 35: the two
//! halves of what was one 15-minute scenario): the ClusterClass flavor (`--flavor topology`,
//! the ClusterClass added by `clusterctl generate`): created, Available with the same checks.
//! Upgraded to v1.37.2 by docs/upgrades.md's ClusterClass blocks (`spec.topology.version`, then
//! a `kubectl wait` for the workers), with the same checks as the first test's upgrade (the
//! topology controller orders control plane, then workers); the second management cluster
//! starts once the control plane is upgraded (one heavy phase at a time: [`HEAVY`]). Then `clusterctl move` of that
//! running cluster to a second management cluster ([`TargetManagement`]): nothing of the
//! namespace left on the source, every ByoHost on the target with the same claims; the hosts
//! follow by the page's procedure (each ByoHost allowed one enrolment, the target's bootstrap
//! kubeconfig on every host, the agent restarted); the Cluster Available there on the same Nodes
//! (names and UIDs), each claim re-keyed to the ByoMachine the move created; the source keeps no
//! Lease or BootstrapKubeconfig of the pool after the page's clean-up; scaled 1 -> 2 workers
//! there (the free host joins, at v1.37.2 as every Node); deleted there the same way.
//!
//! A failing step prints the managers' and the controller's logs, the agents' and kubelets'
//! journals and the objects' states. Each phase's duration is printed at the end.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use anyhow::{Context as _, ensure};
use byoh_tests::agent::wait_for;
use byoh_tests::capi_bed::{
    CapiBed, KUBERNETES_VERSION, UPGRADE_VERSION, as_hosts_reach_it, inventory,
};
use byoh_tests::capi_cluster::{CapiCluster, condition_true, node_ready, skip_system_verification};
use byoh_tests::capi_move::TargetManagement;
use byoh_tests::capi_page::{PAGE, Page, UPGRADE_PAGE};
use byoh_tests::doc_blocks;
use byoh_tests::hosts;
use byoh_tests::manifests::apply_yaml;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::rbac::v1::Role;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use std::time::Duration;

/// The control-plane endpoint of the cluster named `cluster`: the first address of this
/// process's slot for [`CLUSTER`], the second for [`TOPOLOGY_CLUSTER`] (the two tests of this
/// file run at once; [`endpoint_ip`](byoh_tests::capi_cluster::endpoint_ip)).
fn endpoint_ip(cluster: &str) -> String {
    byoh_tests::capi_cluster::endpoint_ip(u32::from(cluster == TOPOLOGY_CLUSTER))
}
/// The sections of docs/getting_started.md whose Cluster API blocks the two tests run: creating
/// the cluster, and moving to another management cluster.
const CREATE_SECTION: &str = "## 8.";
const MOVE_SECTION: &str = "## 10.";
/// The section of [`UPGRADE_PAGE`] whose blocks the first test runs (the first heading that
/// starts so; the ClusterClass one comes after it).
const UPGRADE_SECTION: &str = "## The upgrade";
/// The section of [`UPGRADE_PAGE`] whose blocks the second test runs.
const TOPOLOGY_UPGRADE_SECTION: &str = "## The upgrade with ClusterClass";
/// The namespace of the pool and the clusters, as in docs/getting_started.md.
const POOL: &str = "byoh-pool";
/// The name of the cluster, as in docs/getting_started.md.
const CLUSTER: &str = "demo";
/// The name of the cluster made from the ClusterClass (`--flavor topology`) after the first
/// one is deleted, as in docs/getting_started.md.
const TOPOLOGY_CLUSTER: &str = "demo2";
/// How long a paused cluster is watched for a claim or a release that must not happen.
const PAUSE_WINDOW: Duration = Duration::from_secs(20);

/// Held for the heaviest, most fragile phases of the two tests, one at a time in this process:
/// a control-plane upgrade (from the version's change until the old host is released: the
/// workload's etcd has two members then, and either one starved of CPU for a second or two
/// costs both their quorum) and the second management cluster's start. The two tests run side
/// by side, beside capi_remediation's bed, on a 2-core machine: in the CI run of ea6937f both
/// tests upgraded at once, one beside that start, and neither workload API server recovered
/// (etcd without a quorum, each kube-apiserver restarted by its liveness probe, TLS handshakes
/// to it timing out).
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Applies the cluster generated with `flavor` (the default one when `None`) and follows it
/// until Cluster API reports it Available. With `page`, the cluster is `<name>.yaml` in its
/// work folder, created and watched by the page's blocks.
async fn create(
    c: &CapiCluster<'_>,
    flavor: Option<&str>,
    mut page: Option<&mut Page>,
) -> anyhow::Result<()> {
    let bed = c.bed;
    let yaml = c.generate(flavor, &endpoint_ip(c.name))?;
    ensure!(!yaml.contains("${"), "unsubstituted variable in:\n{yaml}");
    let yaml = skip_system_verification(&yaml)?;
    // KCP creates the first control-plane Machine; our controller gives it a host, on which
    // the test stands in for kube-vip meanwhile.
    let endpoint = endpoint_ip(c.name);
    let claimed = c.control_plane_host(&endpoint, Duration::from_secs(180));
    let (cp_machine, cp_host_name) = match page.as_deref_mut() {
        Some(page) => {
            // The page's `kubectl apply`, waiting for the control plane to be initialized.
            let file = format!("{}.yaml", c.name);
            std::fs::write(page.ws.dir.join(&file), &yaml)?;
            let block = page
                .script
                .next(doc_blocks::TEST_CAPI, &format!("kubectl apply -f {file}"))?;
            eprintln!("--- {}:{}\n{}", block.page, block.line, block.text);
            let ws = page.ws.clone();
            let applied = tokio::task::spawn_blocking(move || ws.run(&block));
            let (claimed, applied) = tokio::join!(claimed, applied);
            eprintln!("{}", applied??);
            let (m, h) = claimed?;
            bed.phases.done(&format!(
                "{}: applied by getting_started.md; control-plane Machine {} claimed {h}; \
                 ControlPlaneInitialized; kubeconfig fetched",
                c.name,
                m.name_any()
            ));
            (m, h)
        }
        None => {
            apply_yaml(&bed.admin, &yaml, false).await?;
            bed.phases.done(&format!(
                "{}: generated ({} flavor) and applied as generated",
                c.name,
                flavor.unwrap_or("default")
            ));
            let (m, h) = claimed.await?;
            bed.phases.done(&format!(
                "control-plane Machine {} claimed {h}",
                m.name_any()
            ));
            (m, h)
        }
    };
    let cp_host = bed.host(&cp_host_name)?;

    // CABPK's init data runs on the host: the workload API server answers at the endpoint.
    let (workload, server, version) = wait_for(
        "the workload API server at the control-plane endpoint",
        Duration::from_secs(600),
        || async {
            let Ok((client, server)) = c.workload().await else {
                return Ok(None);
            };
            Ok(client
                .apiserver_version()
                .await
                .ok()
                .map(|v| (client, server, v)))
        },
    )
    .await?;
    let want = format!("https://{}:6443", endpoint_ip(c.name));
    ensure!(
        server.trim_end_matches('/') == want,
        "the workload kubeconfig's server is {server}, not the endpoint {want}"
    );
    ensure!(
        version.git_version == KUBERNETES_VERSION,
        "the workload API server is {}, not {KUBERNETES_VERSION}",
        version.git_version
    );
    bed.phases
        .done("kubeadm init on the host: workload API server answers");
    let manifest = cp_host
        .read_to_string("/etc/kubernetes/manifests/kube-vip.yaml")
        .await?;
    let pod: Pod = serde_yaml_ng::from_str(&manifest).context("kube-vip manifest as a Pod")?;
    ensure!(
        pod.name_any() == "kube-vip",
        "kube-vip manifest: {manifest}"
    );

    // The control-plane Machine's Node, Ready, with the ByoMachine's providerID.
    let nodes: Api<Node> = Api::all(workload.clone());
    let node_name = wait_for(
        "the control-plane Machine's status.nodeRef, its Node Ready",
        Duration::from_secs(300),
        || async {
            let m = bed.capi("Machine").get(&cp_machine.name_any()).await?;
            let Some(name) = m.data["status"]["nodeRef"]["name"].as_str() else {
                return Ok(None);
            };
            Ok(nodes
                .get_opt(name)
                .await?
                .filter(node_ready)
                .map(|n| n.name_any()))
        },
    )
    .await?;
    let infra = cp_machine.data["spec"]["infrastructureRef"]["name"]
        .as_str()
        .context("no infrastructureRef")?;
    let bm = c.byomachines().get(infra).await?;
    let node_pid = nodes
        .get(&node_name)
        .await?
        .spec
        .and_then(|s| s.provider_id);
    ensure!(
        node_pid.is_some() && node_pid == bm.spec.provider_id,
        "Node {node_name} providerID {node_pid:?} != ByoMachine {infra}'s {:?}",
        bm.spec.provider_id
    );
    bed.phases.done("control-plane Node Ready");

    // CABPK's join data joins the worker.
    c.wait_workers(1, Duration::from_secs(600)).await?;
    bed.phases.done("worker joined: its Node Ready");
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases
        .done("Cluster Available (Cluster API's conditions)");
    match page {
        // The page's wait for Available, `clusterctl describe cluster`, and the pool.
        Some(page) => {
            page.run("--for=condition=Available")?;
        }
        None => eprintln!("{}", bed.describe(c.name)?),
    }
    let claimed = c.claimed_hosts().await?;
    ensure!(claimed.len() == 2, "claimed ByoHosts {claimed:?}, want 2");
    for h in &claimed {
        let phase = c.host_phase(h).await?;
        ensure!(
            phase.as_deref() == Some("Provisioned"),
            "ByoHost {h} is {phase:?}, want Provisioned"
        );
    }
    Ok(())
}

/// `cluster.spec.paused` honoured: the MachineDeployment scaled to 2 while the Cluster is
/// paused makes no Machine and no claim for [`PAUSE_WINDOW`], Cluster API and our ByoMachines
/// report `Paused`; once unpaused, the third host is claimed and joins. Returns the workers'
/// hosts.
async fn scale_up_while_paused(c: &CapiCluster<'_>) -> anyhow::Result<Vec<String>> {
    let bed = c.bed;
    let claimed = c.claimed_hosts().await?;
    let workers = c.machines(false).await?.len();
    c.set_paused(true).await?;
    let byomachines = bed.api("infrastructure.cluster.x-k8s.io", "v1beta2", "ByoMachine");
    wait_for(
        "every Machine and ByoMachine to report Paused",
        Duration::from_secs(60),
        || async {
            let machines = bed
                .capi("Machine")
                .list(&ListParams::default())
                .await?
                .items;
            let bms = byomachines.list(&ListParams::default()).await?.items;
            Ok((machines
                .iter()
                .chain(&bms)
                .all(|o| condition_true(o, "Paused")))
            .then_some(()))
        },
    )
    .await?;
    c.scale_workers(2).await?;
    let until = tokio::time::Instant::now() + PAUSE_WINDOW;
    while tokio::time::Instant::now() < until {
        let now = c.claimed_hosts().await?;
        ensure!(
            now == claimed,
            "claimed hosts {now:?} while the Cluster is paused, before {claimed:?}"
        );
        let n = c.machines(false).await?.len();
        ensure!(
            n == workers,
            "{n} worker Machines while paused, before {workers}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    bed.phases.done(&format!(
        "paused: scaled to 2, no Machine and no claim for {} s",
        PAUSE_WINDOW.as_secs()
    ));
    c.set_paused(false).await?;
    let hosts = c.wait_workers(2, Duration::from_secs(600)).await?;
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases
        .done("unpaused: scale 1 -> 2, the third host's Node Ready");
    Ok(hosts)
}

/// Scale 2 → 1: one worker Machine deleted, its Node gone, its host released, reset, clean
/// and `Available` in the pool again. Returns the remaining worker's host.
async fn scale_down(c: &CapiCluster<'_>, workers: &[String]) -> anyhow::Result<String> {
    c.scale_workers(1).await?;
    let left = c.wait_workers(1, Duration::from_secs(600)).await?;
    let released = workers
        .iter()
        .find(|h| !left.contains(h))
        .with_context(|| format!("workers before {workers:?}, after {left:?}"))?;
    c.wait_released_clean(released, Duration::from_secs(300))
        .await?;
    c.wait_available(Duration::from_secs(300)).await?;
    c.bed.phases.done(&format!(
        "scale 2 -> 1: {released} released, reset, clean, Available"
    ));
    Ok(left.into_iter().next().unwrap_or_default())
}

/// The workload cluster's API server version and the kubelet version of every Node (or of the
/// Node `only`) are `version`.
///
/// Errors naming what reports another version.
async fn reports_version(
    c: &CapiCluster<'_>,
    version: &str,
    only: Option<&str>,
) -> anyhow::Result<()> {
    let (workload, _) = c.workload().await?;
    let served = workload.apiserver_version().await?.git_version;
    ensure!(
        served == version,
        "the workload API server is {served}, want {version}"
    );
    let kubelets = c.kubelet_versions().await?;
    let checked: Vec<_> = kubelets
        .iter()
        .filter(|(n, _)| only.is_none_or(|o| o == n))
        .collect();
    ensure!(
        !checked.is_empty() && checked.iter().all(|(_, v)| v == version),
        "the Nodes' kubelets are {kubelets:?}, want {} at {version}",
        only.unwrap_or("every one")
    );
    Ok(())
}

/// Takes `page`'s next [`doc_blocks::TEST_CAPI`] block (containing `marker`) and runs it on the
/// workstation in the background (a `kubectl wait` while the test follows what it waits for);
/// the task's result is its stdout.
///
/// Errors when the page's next block is not that one.
fn run_beside(
    page: &mut Page,
    marker: &str,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<String>>> {
    let block = page.script.next(doc_blocks::TEST_CAPI, marker)?;
    eprintln!("--- {}:{}\n{}", block.page, block.line, block.text);
    let ws = page.ws.clone();
    Ok(tokio::task::spawn_blocking(move || ws.run(&block)))
}

/// Follows an upgrade of the control plane to [`UPGRADE_VERSION`] (issue 36) once its version
/// was changed: KCP's new Machine takes the free host `free` (which a v1.36 Machine left: the
/// agent installs v1.37 there from the v1.37 repository, `@minor@` in the template's
/// `aptRepository`) and runs CABPK's control-plane join at the new version (a second etcd member,
/// the cluster's certificates from the join data); KCP removes the old etcd member and deletes
/// the old Machine, whose host is released (the agent's clean-up removes the endpoint address
/// the claim added), clean and `Available`. The kube-vip stand-in then moves the endpoint to the
/// new host, as kube-vip's leader election would. At the end the workload API server answers
/// with the new version and the control-plane Node's kubelet reports it. Returns the old
/// control-plane host (free again).
async fn follow_control_plane_upgrade(c: &CapiCluster<'_>, free: &str) -> anyhow::Result<String> {
    let bed = c.bed;
    let old = wait_for(
        "the control-plane Machine of the old version",
        Duration::from_secs(300),
        || async {
            for m in c.machines(true).await? {
                if m.data["spec"]["version"] != UPGRADE_VERSION {
                    return c.host_of(&m).await;
                }
            }
            Ok(None)
        },
    )
    .await?;
    wait_for(
        "KCP's new control-plane Machine to claim the free host",
        Duration::from_secs(300),
        || async {
            for m in c.machines(true).await? {
                if c.host_of(&m).await?.as_deref() == Some(free) {
                    return Ok(Some(()));
                }
            }
            Ok(None)
        },
    )
    .await?;
    bed.phases.done(&format!(
        "control-plane upgrade: new Machine ({UPGRADE_VERSION}) claimed {free}"
    ));
    let vip = format!("{}/32", endpoint_ip(c.name));
    let old_host = bed.host(&old)?;
    wait_for(
        "the old control-plane host's clean-up to remove the endpoint address",
        Duration::from_secs(900),
        || async {
            let addresses = old_host.run(&["ip", "-br", "addr"]).await?;
            Ok((!addresses.contains(&vip)).then_some(()))
        },
    )
    .await?;
    bed.host(free)?
        .run(&["ip", "addr", "add", &vip, "dev", "host0"])
        .await?;
    bed.phases.done(&format!(
        "control-plane upgrade: {free} joined, {old} reset (endpoint address removed by the agent)"
    ));
    c.wait_released_clean(&old, Duration::from_secs(300))
        .await?;
    let kcps = bed.api(
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
    );
    // `<cluster>-control-plane` as the default template names it; the topology controller
    // names it as it likes: the Cluster's controlPlaneRef says.
    let cluster = bed.capi("Cluster").get(c.name).await?;
    let kcp = cluster.data["spec"]["controlPlaneRef"]["name"]
        .as_str()
        .context("the Cluster has no controlPlaneRef")?
        .to_string();
    let (machines, kcp_status) = wait_for(
        "KCP to report one up-to-date, ready control-plane Machine",
        Duration::from_secs(600),
        || async {
            let k = kcps.get(&kcp).await?;
            let s = &k.data["status"];
            let one = serde_json::json!(1);
            let done = s["observedGeneration"].as_i64() == k.metadata.generation
                && [
                    "replicas",
                    "upToDateReplicas",
                    "readyReplicas",
                    "availableReplicas",
                ]
                .iter()
                .all(|f| s[f] == one);
            let machines = c.machines(true).await?;
            Ok((done && machines.len() == 1).then(|| (machines, s.clone())))
        },
    )
    .await?;
    let host = c.host_of(&machines[0]).await?;
    ensure!(
        host.as_deref() == Some(free),
        "the control-plane Machine is on {host:?}, want {free}; KCP status {kcp_status}"
    );
    ensure!(
        machines[0].data["spec"]["version"] == UPGRADE_VERSION,
        "the control-plane Machine's version is {}, want {UPGRADE_VERSION}",
        machines[0].data["spec"]["version"]
    );
    let nodes = c.node_names(true).await?;
    ensure!(
        nodes.iter().any(|n| n == free) && !nodes.iter().any(|n| n == &old),
        "workload Nodes after the control-plane upgrade: {nodes:?} (want {free}, not {old})"
    );
    // The workers are still at the old version.
    reports_version(c, UPGRADE_VERSION, Some(free)).await?;
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "control-plane upgrade: {old} released, clean, Available; API server {UPGRADE_VERSION}; Cluster Available"
    ));
    Ok(old)
}

/// Follows the workers' upgrade to [`UPGRADE_VERSION`] once the MachineDeployment's version
/// was changed: Cluster API rolls it (new MachineSet, surge one, then the old Machine deleted).
/// The new Machine takes the free host `free` (the old control-plane host, reset after its v1.36
/// claim) and installs v1.37 there; the old worker's host `old` is released, clean and
/// `Available`; the workload cluster keeps no Node of it, every Node and the API server report
/// the new version, the Cluster is `Available`.
async fn follow_worker_upgrade(c: &CapiCluster<'_>, old: &str, free: &str) -> anyhow::Result<()> {
    let bed = c.bed;
    wait_for(
        "the upgrade's new worker Machine to claim the free host and the old one to go",
        Duration::from_secs(600),
        || async {
            let claimed = c.claimed_hosts().await?;
            Ok(
                (claimed.iter().any(|h| h == free) && !claimed.iter().any(|h| h == old))
                    .then_some(()),
            )
        },
    )
    .await?;
    let hosts = c.wait_workers(1, Duration::from_secs(600)).await?;
    ensure!(
        hosts == [free],
        "after the upgrade the worker is on {hosts:?}, want the free host {free}"
    );
    c.wait_released_clean(old, Duration::from_secs(300)).await?;
    let nodes = c.node_names(false).await?;
    ensure!(
        !nodes.iter().any(|n| n == old),
        "the old worker's Node {old} is left in the workload cluster: {nodes:?}"
    );
    reports_version(c, UPGRADE_VERSION, None).await?;
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "workers upgraded: new Machine on {free}, {old} released, clean, Available; every Node {UPGRADE_VERSION}"
    ));
    Ok(())
}

/// Deletes the Cluster: every Machine gone, every host `Available` and clean, nothing of ours
/// left (ByoMachines, ByoCluster, bootstrap Secret access in the per-host Roles).
async fn delete(c: &CapiCluster<'_>) -> anyhow::Result<()> {
    let bed = c.bed;
    let cp_machine = c.machines(true).await?;
    let cp_host = match cp_machine.first() {
        Some(m) => c.host_of(m).await?,
        None => None,
    }
    .context("no control-plane host")?;
    // What the claim left on the control-plane host's network goes with the clean-up, without
    // anyone's help: the bridge CNI's `cni0` (CoreDNS's pods ran there; neither the bridge
    // plugin nor `kubeadm reset` removes it) and the endpoint address (the kube-vip stand-in's,
    // as a kube-vip killed before it could drop it would leave it): the agent removes the
    // interface the claim created and the Cluster's endpoint address the claim added.
    c.delete_and_wait_clean().await?;
    let vip = format!("{}/32", endpoint_ip(c.name));
    let host = bed.host(&cp_host)?;
    let links = host.run(&["ip", "-br", "link"]).await?;
    let addresses = host.run(&["ip", "-br", "addr"]).await?;
    ensure!(
        !links.contains("cni0") && !addresses.contains(&vip),
        "the control-plane host keeps the claim's network: {links}{addresses}"
    );
    let bms = c.byomachines().list(&ListParams::default()).await?.items;
    ensure!(bms.is_empty(), "ByoMachines left: {bms:?}");
    let bcs = c
        .api("infrastructure.cluster.x-k8s.io", "v1beta2", "ByoCluster")
        .list(&ListParams::default())
        .await?
        .items;
    ensure!(bcs.is_empty(), "ByoClusters left: {bcs:?}");
    let secrets: Api<Secret> = Api::namespaced(c.admin.clone(), bed.ns.as_str());
    let roles: Api<Role> = Api::namespaced(c.admin.clone(), bed.ns.as_str());
    for host in &bed.hosts {
        let role = roles
            .get(&format!("byoh-host-{}", host.name()))
            .await
            .context("the pool host's Role")?;
        let extra: Vec<_> = role
            .rules
            .unwrap_or_default()
            .into_iter()
            .filter(|r| {
                r.resources.as_ref().is_some_and(|rs| {
                    rs.iter()
                        .any(|x| x == "secrets" || x == "k8sinstallerconfigs")
                })
            })
            .collect();
        ensure!(
            extra.is_empty(),
            "host {} keeps access to a released claim's objects: {extra:?}",
            host.name()
        );
    }
    // The cluster's Secrets (CABPK's bootstrap data, KCP's certificates and kubeconfig) go
    // with their owners (garbage collection).
    wait_for(
        "the cluster's Secrets garbage-collected",
        Duration::from_secs(120),
        || async {
            let left = secrets.list(&ListParams::default()).await?.items;
            Ok((!left.iter().any(|s| s.name_any().starts_with(c.name))).then_some(()))
        },
    )
    .await?;
    bed.phases.done(&format!(
        "{}: deleted, Machines gone, every host Available and clean",
        c.name
    ));
    Ok(())
}

/// `clusterctl move` of the running cluster `c` (its namespace: the cluster, its objects and
/// the pool's ByoHosts) to a second management cluster, the move and the hosts following by the
/// page's blocks; then the cluster is Available there on the same Nodes, the source keeps
/// nothing of the pool, and the cluster scales 1 -> 2 workers. Returns the cluster as the target
/// holds it.
async fn move_cluster<'a>(
    c: &CapiCluster<'a>,
    target: &TargetManagement,
    page: &mut Page,
) -> anyhow::Result<CapiCluster<'a>> {
    let bed = c.bed;
    let (workload, _) = c.workload().await?;
    let node_uids = |nodes: Vec<Node>| -> Vec<(String, Option<String>)> {
        let mut v: Vec<_> = nodes.iter().map(|n| (n.name_any(), n.uid())).collect();
        v.sort();
        v
    };
    let nodes_before = node_uids(
        Api::<Node>::all(workload.clone())
            .list(&ListParams::default())
            .await?
            .items,
    );
    let claims = |hosts: Vec<byoh_api::ByoHost>| -> Vec<(String, Option<String>)> {
        let mut v: Vec<_> = hosts
            .into_iter()
            .map(|h| {
                let id = h.spec.claim.as_ref().map(|c| c.provider_id.clone());
                (h.name_any(), id)
            })
            .collect();
        v.sort();
        v
    };
    let claims_before = claims(c.byohosts().list(&ListParams::default()).await?.items);

    page.run("create namespace byoh-pool")?;
    let out = page.run("clusterctl move --namespace byoh-pool")?;
    bed.phases.done(&format!(
        "{}: clusterctl move to a second management cluster",
        c.name
    ));
    ensure!(
        c.capi("Cluster").get_opt(c.name).await?.is_none()
            && c.byohosts()
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
            && c.byomachines()
                .list(&ListParams::default())
                .await?
                .items
                .is_empty(),
        "the source still holds the cluster or the pool after clusterctl move:
{out}"
    );
    let moved = c.moved_to(target.admin.clone());
    let claims_moved = claims(moved.byohosts().list(&ListParams::default()).await?.items);
    ensure!(
        claims_moved == claims_before,
        "the ByoHosts and their claims on the target {claims_moved:?}, on the source {claims_before:?}"
    );

    // The hosts follow: a bootstrap kubeconfig of the target on each, the agent restarted.
    // They reach the target's API server through their network's gateway, not at the
    // workstation's address: the test sets API_SERVER, as the page says to.
    let block = page
        .script
        .next(doc_blocks::STAND_IN_CAPI, "export API_SERVER=")?;
    let (server, _) = as_hosts_reach_it(target.cp.kubeconfig())?;
    page.ws.run(&doc_blocks::Block {
        text: format!("export API_SERVER='{server}'\n"),
        ..block
    })?;
    page.run("allow-re-enrolment")?;
    page.script
        .next(doc_blocks::STAND_IN_CAPI, "scp bootstrap-kubeconfig")?;
    for host in &bed.hosts {
        let file = page.ws.dir.join("bootstrap-kubeconfig");
        host.copy_in(&file, "/root/bootstrap-kubeconfig", 0o600)
            .await?;
    }
    page.run_on_hosts(bed, "systemctl restart byoh-agent")
        .await?;
    page.run("wait machines --all --for=condition=Ready")?;
    moved.wait_available(Duration::from_secs(600)).await?;
    let workers = moved.wait_workers(1, Duration::from_secs(300)).await?;
    // The hosts kept their nodes: the same Nodes (names and UIDs: none joined again), the same
    // claims, each re-keyed to the ByoMachine the move created and reported by its agent.
    let (workload, _) = moved.workload().await?;
    let nodes_after = node_uids(
        Api::<Node>::all(workload)
            .list(&ListParams::default())
            .await?
            .items,
    );
    ensure!(
        nodes_after == nodes_before,
        "the workload Nodes changed with the move: {nodes_before:?} -> {nodes_after:?}"
    );
    for bm in moved
        .byomachines()
        .list(&ListParams::default())
        .await?
        .items
    {
        let host = bm
            .status
            .as_ref()
            .and_then(|s| s.host_ref.as_ref())
            .map(|r| r.name.clone())
            .with_context(|| format!("ByoMachine {} has no host on the target", bm.name_any()))?;
        let h = moved.byohosts().get(&host).await?;
        let claim = h.spec.claim.as_ref().context("the host lost its claim")?;
        ensure!(
            Some(claim.machine_ref.uid.as_str()) == bm.uid().as_deref()
                && h.status
                    .as_ref()
                    .and_then(|s| s.observed_machine_uid.as_deref())
                    == bm.uid().as_deref()
                && bm.spec.provider_id.as_deref() == Some(claim.provider_id.as_str()),
            "ByoHost {host}'s claim {claim:?} / status {:?} is not ByoMachine {} ({:?}, {:?})",
            h.status.as_ref().map(|s| &s.observed_machine_uid),
            bm.name_any(),
            bm.uid(),
            bm.spec.provider_id
        );
    }
    bed.phases.done(&format!(
        "{}: hosts enrolled with the new management cluster; Cluster Available there on the same Nodes (worker {})",
        c.name,
        workers.join(", ")
    ));

    // The source keeps nothing of the pool once the page's clean-up ran: no Lease of its hosts,
    // no BootstrapKubeconfig (whose token goes with it).
    page.run("delete bootstrapkubeconfig pool")?;
    let leases: Api<Lease> = Api::namespaced(bed.admin.clone(), "byoh-system");
    let left: Vec<String> = leases
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|l| l.name_any())
        .filter(|n| n.starts_with(&format!("{POOL}.")))
        .collect();
    let bks: Api<byoh_api::BootstrapKubeconfig> = Api::namespaced(bed.admin.clone(), POOL);
    let bks = bks.list(&ListParams::default()).await?.items;
    ensure!(
        left.is_empty() && bks.is_empty(),
        "the source keeps the pool's Leases {left:?} and {} BootstrapKubeconfig(s)",
        bks.len()
    );

    // Cluster API on the target drives the hosts: the topology's workers 1 -> 2 take the
    // free host.
    moved
        .capi("Cluster")
        .patch(
            c.name,
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(serde_json::json!([{
                "op": "replace",
                "path": "/spec/topology/workers/machineDeployments/0/replicas",
                "value": 2
            }]))?),
        )
        .await?;
    let workers = moved.wait_workers(2, Duration::from_secs(600)).await?;
    moved.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "{}: scaled 1 -> 2 workers on the new management cluster ({})",
        c.name,
        workers.join(", ")
    ));
    Ok(moved)
}

/// The first cluster's life, from docs/getting_started.md's section 8: created by the page's
/// blocks, paused and scaled, scaled down, upgraded to the next minor by docs/upgrades.md's
/// blocks (the control plane, then the workers) and deleted, on one bed.
async fn lifecycle(bed: &CapiBed) -> anyhow::Result<()> {
    let mut page = Page::new(bed, CREATE_SECTION)?;
    let c = CapiCluster::new(bed, CLUSTER);
    create(&c, None, Some(&mut page)).await?;
    let workers = scale_up_while_paused(&c).await?;
    let worker = scale_down(&c, &workers).await?;
    reports_version(&c, KUBERNETES_VERSION, None).await?;
    let free = c.free_host().await?;
    // docs/upgrades.md's blocks: the control plane first, on the free host (the page's wait runs
    // while the test follows the rollout and stands in for kube-vip); the old control-plane
    // host, reset, then takes the upgraded worker.
    let mut upgrade = Page::of(bed, UPGRADE_PAGE, UPGRADE_SECTION)?;
    let heavy = HEAVY.lock().await;
    upgrade.run("patch kubeadmcontrolplane")?;
    let waited = run_beside(&mut upgrade, "get kubeadmcontrolplane")?;
    let old_cp = follow_control_plane_upgrade(&c, &free).await?;
    drop(heavy);
    eprintln!("{}", waited.await??);
    let waited = run_beside(&mut upgrade, "patch machinedeployment")?;
    follow_worker_upgrade(&c, &worker, &old_cp).await?;
    eprintln!("{}", waited.await??);
    upgrade.script.finish()?;
    delete(&c).await?;
    page.script.finish()
}

/// A cluster from the ClusterClass, moved: from docs/getting_started.md's section 10.
async fn clusterclass_and_move(
    bed: &CapiBed,
    target: &mut Option<TargetManagement>,
) -> anyhow::Result<()> {
    let mut page = Page::new(bed, MOVE_SECTION)?;
    // The ClusterClass flavor: Cluster API's topology controller makes the
    // KubeadmControlPlane, MachineDeployment and templates from the ClusterClass `clusterctl
    // generate` adds; the cluster works as the first one does.
    let topology = CapiCluster::new(bed, TOPOLOGY_CLUSTER);
    create(&topology, Some("topology"), None).await?;
    let free = topology.free_host().await?;
    let [worker] =
        <[String; 1]>::try_from(topology.wait_workers(1, Duration::from_secs(60)).await?)
            .map_err(|w| anyhow::anyhow!("workers on {w:?}, want one"))?;
    // Upgraded by docs/upgrades.md's ClusterClass blocks (one field; the page's wait runs while
    // the test follows the control plane, standing in for kube-vip, then the workers); the
    // second management cluster starts once the control plane is upgraded, beside the workers'
    // upgrade ([`HEAVY`]: not beside a control-plane upgrade).
    let mut upgrade = Page::of(bed, UPGRADE_PAGE, TOPOLOGY_UPGRADE_SECTION)?;
    let heavy = HEAVY.lock().await;
    let upgraded = async {
        upgrade.run("\"topology\"")?;
        let waited = run_beside(&mut upgrade, "get machinedeployment")?;
        let old_cp = follow_control_plane_upgrade(&topology, &free).await;
        drop(heavy);
        follow_worker_upgrade(&topology, &worker, &old_cp?).await?;
        eprintln!("{}", waited.await??);
        upgrade.script.finish()
    };
    // Moved to a second management cluster, it is deleted there. BYOH goes on it by the page's
    // `clusterctl init`, which finds Cluster API there and cert-manager's API answering.
    let started = async {
        let _heavy = HEAVY.lock().await;
        TargetManagement::start(bed, |kubeconfig| {
            std::fs::copy(kubeconfig, page.ws.dir.join("target.kubeconfig"))?;
            page.run("clusterctl init --kubeconfig target.kubeconfig")?;
            Ok(())
        })
        .await
    };
    let (upgraded, started) = tokio::join!(upgraded, started);
    let t = target.insert(started?);
    upgraded?;
    // What clusterctl recorded: BYOH beside Cluster API's providers (`tests/capi/up` recorded
    // those), and it did not install cert-manager (its API answered).
    let recorded = inventory(&t.admin).await?;
    let byoh = format!(
        "byoh-system/infrastructure-byoh byoh InfrastructureProvider v{}",
        env!("CARGO_PKG_VERSION")
    );
    ensure!(
        recorded.len() == 4 && recorded.contains(&byoh),
        "clusterctl's inventory on the target: {recorded:?}"
    );
    ensure!(
        Api::<Namespace>::all(t.admin.clone())
            .get_opt("cert-manager")
            .await?
            .is_none(),
        "clusterctl init installed cert-manager"
    );
    bed.phases.done(
        "second management cluster up (control plane, Cluster API managers; BYOH by clusterctl init)",
    );
    let moved = move_cluster(&topology, t, &mut page).await?;
    // The worker the target's Cluster API added joined at the upgraded version.
    reports_version(&moved, UPGRADE_VERSION, None).await?;
    delete(&moved).await?;
    page.script.finish()
}

/// Every Cluster API block of docs/getting_started.md and docs/upgrades.md lies in a section
/// one of the two tests runs (each test checks it ran all of its section's).
#[test]
fn the_two_tests_run_every_cluster_api_block_of_the_pages() {
    for (page, headings, at_least) in [
        (PAGE, &[CREATE_SECTION, MOVE_SECTION][..], 10),
        (
            UPGRADE_PAGE,
            &[UPGRADE_SECTION, TOPOLOGY_UPGRADE_SECTION][..],
            5,
        ),
    ] {
        let md = std::fs::read_to_string(byoh_tests::agent::repo_root().join(page)).unwrap();
        let sections: Vec<(usize, usize)> = headings
            .iter()
            .map(|h| doc_blocks::section_lines(&md, h).unwrap())
            .collect();
        let blocks = doc_blocks::page_blocks(page, &doc_blocks::CAPI).unwrap();
        assert!(blocks.len() >= at_least, "{page}: {blocks:?}");
        for b in &blocks {
            assert!(
                sections.iter().any(|(f, l)| (*f..=*l).contains(&b.line)),
                "{page}:{}: a `{}` block outside the sections {headings:?} that capi_e2e runs",
                b.line,
                b.info
            );
        }
    }
    assert_eq!(byoh_tests::capi_page::PAGES, [PAGE, UPGRADE_PAGE]);
}

/// Starts a bed of three hosts and runs `scenario` on it (`target`: the second management
/// cluster it may start); on failure prints the diagnostics of `cluster` and of the target; the
/// phase table at the end.
async fn on_a_bed<F>(cluster: &str, scenario: F)
where
    F: AsyncFnOnce(&CapiBed, &mut Option<TargetManagement>) -> anyhow::Result<()>,
{
    if !hosts::available() {
        return;
    }
    let bed = CapiBed::start(3, POOL).await.unwrap();
    let mut target = None;
    if let Err(e) = scenario(&bed, &mut target).await {
        if let Some(t) = &target {
            eprintln!(
                "{}",
                t.diagnostics(&bed.clusterctl, bed.ns.as_str(), cluster)
            );
        }
        eprintln!("{}", bed.diagnostics(cluster).await);
        panic!("{e:#}");
    }
    eprintln!("{}", bed.phases.table());
    let CapiBed { hosts, .. } = bed;
    for h in hosts {
        let _ = h.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_api_makes_scales_upgrades_and_deletes_a_cluster_on_byoh_hosts() {
    on_a_bed(CLUSTER, async |bed, _| lifecycle(bed).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clusterclass_cluster_is_moved_to_another_management_cluster_and_deleted_there() {
    on_a_bed(TOPOLOGY_CLUSTER, clusterclass_and_move).await;
}
