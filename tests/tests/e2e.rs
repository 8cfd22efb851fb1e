//! End to end (issue 9): a booted host running the packaged agent becomes a real Kubernetes node
//! of a real control plane because a Cluster API Machine asked for it — real `kubeadm join`,
//! real kubelet — and goes back to the pool, as it was, when the Machine goes away.
//!
//! Parts: a control plane of the test's own (tests/control-plane/up) prepared for joins by
//! kubeadm's init phases (tests/control-plane/kubeadm-init); the installer artifacts (kubeadm,
//! kubelet, kubectl of the pinned version, Debian's containerd/runc and CNI plugins) served on
//! 127.0.0.1; `byoh-controller` run as a process with a token of the ServiceAccount of
//! `infrastructure-components.yaml` (so only its RBAC applies); two booted hosts with the agent
//! installed from `dist/*.deb`, registered through a BootstrapKubeconfig. No Cluster API
//! controllers run: the test writes the Cluster, Machine and ByoMachine as CAPI's controllers
//! leave them, and the bootstrap Secret as CABPK writes it (real token and CA hash).
//!
//! Hosts share the machine's network namespace, so at most one kubelet runs at a time (port
//! 10250): the tests of this file run one after the other (a lock), and only one host of each
//! test is joined at a time. See docs/e2e.md.
//!
//! A failing step prints the agent's and the kubelet's journals, the controller's log and the
//! object states. Each phase's duration is printed at the end.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::access;

use anyhow::{Context as _, ensure};
use byoh_api::{ByoHost, ByoMachine};
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{PrivateControlPlane, TestNamespace};
use byoh_tests::controller::ControllerProcess;
use byoh_tests::failpoint::{kill_at, set_failpoint};
use byoh_tests::hosts::{self, Host};
use byoh_tests::kubeadm::{self, ArtifactServer, JoinInfo};
use byoh_tests::phases::Phases;
use byoh_tests::pool;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::io::Write as _;
use std::time::Duration;

/// One joined kubelet at a time on this machine (they would all bind port 10250).
static ONE_KUBELET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Everything one end-to-end test runs on.
struct Bed {
    cp: std::sync::Arc<PrivateControlPlane>,
    admin: Client,
    join: JoinInfo,
    artifacts: ArtifactServer,
    controller: ControllerProcess,
    ns: TestNamespace,
    hosts: Vec<Host>,
    phases: Phases,
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(group, version, kind),
        plural,
    )
}

impl Bed {
    /// Starts every part and registers `labels.len()` hosts (host label `e2e-host=<label>`).
    async fn start(test: &str, labels: &[&str]) -> anyhow::Result<Self> {
        let phases = Phases::default();
        phases.begin();
        let cp = std::sync::Arc::new(PrivateControlPlane::start()?);
        let admin = cp.client().await?;
        phases.done("control plane up");
        let join = kubeadm::prepare_joins(cp.kubeconfig())?;
        phases.done("kubeadm init phases (upload-config, bootstrap-token)");
        let dir = kubeadm::stage_artifacts()?;
        let artifacts = ArtifactServer::start(&dir).await?;
        phases.done("installer artifacts staged and served");
        access::apply_yaml(&admin, &access::components_text()?, false).await?;
        let ns = TestNamespace::create(&admin, test).await?;
        let controller = ControllerProcess::start(&admin, cp.kubeconfig(), ns.name()).await?;
        phases.done("infrastructure components + controller started");
        let hosts = Host::boot_many(labels).await?;
        phases.done("hosts booted");
        let mut bed = Self {
            cp,
            admin,
            join,
            artifacts,
            controller,
            ns,
            hosts,
            phases,
        };
        bed.register(labels).await?;
        bed.phases
            .done("agent installed from the .deb and hosts registered");
        Ok(bed)
    }

    /// Registers every host through a BootstrapKubeconfig (the agent from the .deb), with the
    /// host label `e2e-host=<label>`.
    async fn register(&mut self, labels: &[&str]) -> anyhow::Result<()> {
        let kc = kube::config::Kubeconfig::read_from(self.cp.kubeconfig())?;
        let cluster = kc.clusters[0].cluster.clone().context("no cluster")?;
        let hosts: Vec<(&Host, &str)> = self.hosts.iter().zip(labels.iter().copied()).collect();
        pool::register(
            &self.admin,
            self.ns.name(),
            cluster.server.as_deref().context("no server")?,
            cluster
                .certificate_authority_data
                .as_deref()
                .context("no CA")?,
            &hosts,
        )
        .await
    }

    fn dyn_api(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.admin.clone(),
            self.ns.name(),
            &ar("cluster.x-k8s.io", "v1beta2", kind, plural),
        )
    }

    /// Cluster + ByoCluster (endpoint: the test API server) as CAPI leaves them once the control
    /// plane is initialized, and the installer template pointing at the served artifacts.
    async fn create_cluster(&self, name: &str) -> anyhow::Result<()> {
        let ns = self.ns.name();
        let (host, port) = self
            .join
            .endpoint
            .rsplit_once(':')
            .context("endpoint without port")?;
        let cluster: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "controlPlaneEndpoint": {"host": host, "port": port.parse::<u16>()?},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "ByoCluster", "name": name}
            }
        }))?;
        let cluster = self
            .dyn_api("Cluster", "clusters")
            .create(&PostParams::default(), &cluster)
            .await?;
        let bc: byoh_api::ByoCluster = serde_json::from_value(json!({
            "apiVersion": format!("{}/{}", byoh_api::GROUP, byoh_api::VERSION),
            "kind": "ByoCluster",
            "metadata": {
                "name": name, "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": name},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                    "name": name, "uid": cluster.uid(), "blockOwnerDeletion": true}]
            },
            "spec": {"controlPlaneEndpoint": {"host": host, "port": port.parse::<u16>()?}}
        }))?;
        Api::<byoh_api::ByoCluster>::namespaced(self.admin.clone(), ns)
            .create(&PostParams::default(), &bc)
            .await?;
        self.dyn_api("Cluster", "clusters")
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"initialization": {
                    "infrastructureProvisioned": true, "controlPlaneInitialized": true}}})),
            )
            .await?;
        let template: byoh_api::K8sInstallerConfigTemplate = serde_json::from_value(json!({
            "apiVersion": format!("{}/{}", byoh_api::GROUP, byoh_api::VERSION),
            "kind": "K8sInstallerConfigTemplate",
            "metadata": {"name": "tarball", "namespace": ns},
            "spec": {"template": {"spec": self.artifacts.tarball_spec()?}}
        }))?;
        Api::<byoh_api::K8sInstallerConfigTemplate>::namespaced(self.admin.clone(), ns)
            .create(&PostParams::default(), &template)
            .await?;
        Ok(())
    }

    /// A worker Machine `name` of `cluster` with CABPK's bootstrap Secret, and its ByoMachine
    /// (selecting hosts labelled `e2e-host=<host_label>`, installer: the tarball template).
    async fn create_machine(
        &self,
        cluster: &str,
        name: &str,
        host_label: &str,
    ) -> anyhow::Result<()> {
        let ns = self.ns.name();
        let secret = format!("{name}-bootstrap");
        agent::create_machine_bootstrap_data(
            &self.admin,
            ns,
            name,
            &secret,
            &kubeadm::cabpk_worker_join(&self.join, "pool=byoh-e2e"),
        )
        .await?;
        let machine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {
                "clusterName": cluster,
                "version": self.join.kubernetes_version,
                "bootstrap": {
                    "configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": name},
                    "dataSecretName": secret
                },
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "ByoMachine", "name": name},
            }
        }))?;
        let machine = self
            .dyn_api("Machine", "machines")
            .create(&PostParams::default(), &machine)
            .await?;
        let bm: ByoMachine = serde_json::from_value(json!({
            "apiVersion": format!("{}/{}", byoh_api::GROUP, byoh_api::VERSION),
            "kind": "ByoMachine",
            "metadata": {
                "name": name, "namespace": ns,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "name": name, "uid": machine.uid(), "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": {
                "selector": {"matchLabels": {"e2e-host": host_label}},
                "installerRef": {"apiGroup": byoh_api::GROUP, "kind": "K8sInstallerConfigTemplate", "name": "tarball"}
            }
        }))?;
        Api::<ByoMachine>::namespaced(self.admin.clone(), ns)
            .create(&PostParams::default(), &bm)
            .await?;
        Ok(())
    }

    /// Deletes Machine `name` (background: the garbage collector deletes its ByoMachine, whose
    /// finalizer holds until the host is released).
    async fn delete_machine(&self, name: &str) -> anyhow::Result<()> {
        self.dyn_api("Machine", "machines")
            .delete(name, &DeleteParams::background())
            .await?;
        Ok(())
    }

    fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    fn byohosts(&self) -> Api<ByoHost> {
        Api::namespaced(self.admin.clone(), self.ns.name())
    }

    fn byomachines(&self) -> Api<ByoMachine> {
        Api::namespaced(self.admin.clone(), self.ns.name())
    }

    async fn wait_host_phase(&self, host: &str, phase: &str, secs: u64) -> anyhow::Result<ByoHost> {
        let api = self.byohosts();
        wait_for(
            &format!("ByoHost {host} phase {phase}"),
            Duration::from_secs(secs),
            || async {
                Ok(api
                    .get_opt(host)
                    .await?
                    .filter(|h| h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)))
            },
        )
        .await
    }

    /// What a failure report needs: journals, controller log, object states.
    async fn diagnostics(&self) -> String {
        let mut out = pool::journals(&self.hosts).await;
        let log = self.controller.log();
        let tail: Vec<&str> = log.lines().rev().take(200).collect();
        out.push_str("\n===== byoh-controller log (last 200 lines) =====\n");
        for l in tail.iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("\n===== object states =====\n");
        out.push_str(&object_states(&self.admin, self.ns.name()).await);
        out
    }

    async fn stop(self) {
        for h in self.hosts {
            let _ = h.stop().await;
        }
        drop(self.controller);
        let _ = self.ns.cleanup(&self.admin).await;
    }
}

/// ByoHosts, ByoMachines, Machines and Nodes as a table (kubectl-like), for reports.
async fn object_states(admin: &Client, ns: &str) -> String {
    let mut s = String::new();
    let cond = |c: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]| {
        c.iter()
            .map(|c| {
                if c.status == "True" || c.message.is_empty() {
                    format!("{}={}({})", c.type_, c.status, c.reason)
                } else {
                    let m: String = c.message.chars().take(240).collect();
                    format!("{}={}({}: {m})", c.type_, c.status, c.reason)
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    if let Ok(list) = Api::<ByoHost>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
    {
        for h in list.items {
            let st = h.status.clone().unwrap_or_default();
            let claim = h
                .spec
                .claim
                .as_ref()
                .map(|c| c.machine_ref.name.clone())
                .unwrap_or_else(|| "-".into());
            s.push_str(&format!(
                "ByoHost    {:<40} phase={:<13} claim={claim:<12} {}\n",
                h.name_any(),
                st.phase.unwrap_or_default(),
                cond(&st.conditions)
            ));
        }
    }
    if let Ok(list) = Api::<ByoMachine>::namespaced(admin.clone(), ns)
        .list(&Default::default())
        .await
    {
        for m in list.items {
            let st = m.status.clone().unwrap_or_default();
            s.push_str(&format!(
                "ByoMachine {:<40} host={:<30} providerID={} provisioned={} {}\n",
                m.name_any(),
                st.host_ref.map(|h| h.name).unwrap_or_else(|| "-".into()),
                m.spec.provider_id.clone().unwrap_or_else(|| "-".into()),
                st.initialization
                    .and_then(|i| i.provisioned)
                    .unwrap_or(false),
                cond(&st.conditions)
            ));
        }
    }
    if let Ok(list) = Api::<Node>::all(admin.clone())
        .list(&Default::default())
        .await
    {
        for n in list.items {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .map(|c| format!("{} ({})", c.status, c.reason.clone().unwrap_or_default()))
                .unwrap_or_default();
            s.push_str(&format!(
                "Node       {:<40} providerID={} Ready={ready}\n",
                n.name_any(),
                n.spec
                    .as_ref()
                    .and_then(|s| s.provider_id.clone())
                    .unwrap_or_else(|| "-".into())
            ));
        }
    }
    s
}

/// Waits until Machine `machine` is joined on `host`: claimed, kubelet installed and active,
/// ByoHost Provisioned, a Node with the ByoMachine's providerID, ByoMachine provisioned and
/// Ready. Records the phases.
async fn wait_joined(bed: &mut Bed, machine: &str, host_idx: usize) -> anyhow::Result<Node> {
    let host_name = bed.host(host_idx).name().to_string();
    let bms = bed.byomachines();
    let claimed = wait_for(
        "the ByoMachine to claim a host",
        Duration::from_secs(60),
        || async {
            Ok(bms
                .get_opt(machine)
                .await?
                .and_then(|m| m.status.and_then(|s| s.host_ref)))
        },
    )
    .await?;
    ensure!(
        claimed.name == host_name,
        "claimed {} instead of {host_name}",
        claimed.name
    );
    bed.phases.done(&format!("{machine}: host claimed"));

    let host = bed.host(host_idx);
    wait_for(
        "kubelet.service active (installed and started over D-Bus)",
        Duration::from_secs(180),
        || async {
            Ok(host
                .exec(&["systemctl", "is-active", "kubelet"])
                .await?
                .success()
                .then_some(()))
        },
    )
    .await?;
    ensure!(
        host.run(&["/usr/local/bin/kubelet", "--version"])
            .await?
            .contains(&bed.join.kubernetes_version),
        "the installed kubelet is not {}",
        bed.join.kubernetes_version
    );
    bed.phases
        .done(&format!("{machine}: artifacts installed, kubelet started"));

    bed.wait_host_phase(&host_name, "Provisioned", 300).await?;
    let sentinel = host
        .read_to_string("/run/cluster-api/bootstrap-success.complete")
        .await?;
    ensure!(sentinel == "success\n", "sentinel: {sentinel:?}");
    bed.phases
        .done(&format!("{machine}: kubeadm join succeeded"));

    let nodes: Api<Node> = Api::all(bed.admin.clone());
    let node = wait_for("the Node to register", Duration::from_secs(120), || async {
        Ok(nodes.get_opt(&host_name).await?)
    })
    .await?;
    let bm = wait_for(
        "the ByoMachine provisioned and Ready",
        Duration::from_secs(60),
        || async {
            Ok(bms.get_opt(machine).await?.filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.initialization
                        .as_ref()
                        .and_then(|i| i.provisioned)
                        .unwrap_or(false)
                        && byoh_api::conditions::is_true(&s.conditions, "Ready")
                })
            }))
        },
    )
    .await?;
    let provider_id = bm.spec.provider_id.clone().context("no providerID")?;
    let node_pid = node.spec.as_ref().and_then(|s| s.provider_id.clone());
    ensure!(
        node_pid.as_deref() == Some(provider_id.as_str()),
        "Node providerID {node_pid:?} != ByoMachine's {provider_id}"
    );
    let labels = node.metadata.labels.clone().unwrap_or_default();
    ensure!(
        labels.get("pool").map(String::as_str) == Some("byoh-e2e"),
        "node-labels from the join config missing: {labels:?}"
    );
    bed.phases
        .done(&format!("{machine}: Node registered, ByoMachine Ready"));
    Ok(node)
}

/// Deletes Machine `machine` as CAPI's Machine controller does: the ByoMachine goes (the
/// agent resets and uninstalls the host, the controller drops the claim), then the Node is
/// deleted. Returns once the ByoMachine is gone.
async fn delete_machine_and_node(bed: &Bed, machine: &str, host_idx: usize) -> anyhow::Result<()> {
    let host_name = bed.host(host_idx).name().to_string();
    bed.delete_machine(machine).await?;
    let bms = bed.byomachines();
    wait_for(
        "the ByoMachine to be gone",
        Duration::from_secs(180),
        || async { Ok(bms.get_opt(machine).await?.is_none().then_some(())) },
    )
    .await?;
    match Api::<Node>::all(bed.admin.clone())
        .delete(&host_name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes Machine `machine` ([`delete_machine_and_node`]) and waits until its host is back in
/// the pool: no claim, kubelet stopped, kubeadm uninstalled.
async fn release(bed: &mut Bed, machine: &str, host_idx: usize) -> anyhow::Result<()> {
    let host_name = bed.host(host_idx).name().to_string();
    delete_machine_and_node(bed, machine, host_idx).await?;
    let free = bed.wait_host_phase(&host_name, "Available", 60).await?;
    ensure!(
        free.spec.claim.is_none(),
        "claim left on the host: {:?}",
        free.spec.claim
    );
    let host = bed.host(host_idx);
    ensure!(
        !host
            .exec(&["systemctl", "is-active", "kubelet"])
            .await?
            .success(),
        "kubelet still active after the release"
    );
    ensure!(
        !host
            .exec(&["test", "-e", "/usr/local/bin/kubeadm"])
            .await?
            .success(),
        "kubeadm still installed after the release"
    );
    bed.phases.done(&format!(
        "{machine}: deleted, host reset, uninstalled, Available"
    ));
    Ok(())
}

async fn lifecycle(bed: &mut Bed) -> anyhow::Result<()> {
    bed.create_cluster("e2e").await?;
    let before = agent::snapshot(bed.host(0)).await?;
    bed.phases
        .done("cluster objects created, host snapshot taken");

    bed.create_machine("e2e", "worker-1", "a").await?;
    wait_joined(bed, "worker-1", 0).await?;
    // The other host stays in the pool.
    let other = bed
        .byohosts()
        .get(bed.host(1).name())
        .await?
        .status
        .and_then(|s| s.phase);
    ensure!(
        other.as_deref() == Some("Available"),
        "the other host is {other:?}"
    );

    release(bed, "worker-1", 0).await?;
    let after = agent::snapshot(bed.host(0)).await?;
    let diff = agent::snapshot_diff(&before, &after);
    ensure!(
        diff.is_empty(),
        "the release must leave the host as before the claim; diff:\n{}",
        diff.join("\n")
    );

    // The same host again, for a second Machine.
    bed.create_machine("e2e", "worker-2", "a").await?;
    wait_joined(bed, "worker-2", 0).await?;
    release(bed, "worker-2", 0).await?;
    let after = agent::snapshot(bed.host(0)).await?;
    let diff = agent::snapshot_diff(&before, &after);
    ensure!(
        diff.is_empty(),
        "the second release must leave the host as before; diff:\n{}",
        diff.join("\n")
    );
    Ok(())
}

/// Runs `scenario` on a fresh bed; on failure prints the diagnostics and panics.
async fn run<F>(test: &str, labels: &[&str], scenario: F)
where
    F: for<'a> FnOnce(
        &'a mut Bed,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send + 'a>,
    >,
{
    if byoh_tests::control_plane::client().await.is_none() || !hosts::available() {
        return;
    }
    let _one = ONE_KUBELET.lock().await;
    let mut bed = Bed::start(test, labels).await.unwrap();
    let result = scenario(&mut bed).await;
    let _ = writeln!(
        std::io::stderr(),
        "e2e {test}: phase durations\n{}",
        bed.phases.table()
    );
    if let Err(e) = result {
        let diag = bed.diagnostics().await;
        let _ = writeln!(std::io::stderr(), "{diag}");
        bed.stop().await;
        panic!("e2e {test} failed: {e:#}");
    }
    let states = object_states(&bed.admin, bed.ns.name()).await;
    let _ = writeln!(
        std::io::stderr(),
        "e2e {test}: final object states\n{states}"
    );
    bed.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_joins_a_real_node_and_its_deletion_returns_the_host_as_it_was() {
    run("e2e-lifecycle", &["a", "b"], |bed| Box::pin(lifecycle(bed))).await;
}

/// Kills the agent's main process with SIGKILL (systemd restarts it: `Restart=` of the unit).
async fn kill_agent(host: &Host) -> anyhow::Result<()> {
    host.run(&[
        "systemctl",
        "kill",
        "--kill-whom=main",
        "-s",
        "KILL",
        "byoh-agent",
    ])
    .await?;
    Ok(())
}

/// Waits until a process whose command line contains `pattern` runs in `host`.
async fn wait_process(host: &Host, pattern: &str, secs: u64) -> anyhow::Result<()> {
    wait_for(
        &format!("a process matching {pattern:?}"),
        Duration::from_secs(secs),
        || async {
            Ok(host
                .exec(&["pgrep", "-f", pattern])
                .await?
                .success()
                .then_some(()))
        },
    )
    .await
}

/// Where the kill-install fault kills the agent: before the installer's step 3 (0-based).
const KILL_INSTALL_AT: &str = "install/3";

async fn faults(bed: &mut Bed) -> anyhow::Result<()> {
    bed.create_cluster("e2e").await?;
    let before = agent::snapshot(bed.host(0)).await?;
    bed.phases
        .done("cluster objects created, host snapshot taken");

    // 1. SIGKILL during the install: the agent pauses before the installer's fourth step (its
    //    failpoint `install/3`: three changes made and recorded, the install not complete) and
    //    is killed there; the restarted agent resumes the install (its manifest) and the join
    //    goes on.
    set_failpoint(bed.host(0), Some(KILL_INSTALL_AT)).await;
    bed.host(0)
        .run(&["systemctl", "restart", "byoh-agent"])
        .await?;
    bed.create_machine("e2e", "kill-install", "a").await?;
    let name = bed.host(0).name().to_string();
    kill_at(bed.host(0), KILL_INSTALL_AT).await;
    // The drop-in directory the failpoint needed (the host had none).
    bed.host(0)
        .run(&["rmdir", "/etc/systemd/system/byoh-agent.service.d"])
        .await?;
    bed.phases
        .done("kill-install: agent killed in the middle of the install");
    wait_joined(bed, "kill-install", 0).await?;
    release(bed, "kill-install", 0).await?;
    let diff = agent::snapshot_diff(&before, &agent::snapshot(bed.host(0)).await?);
    ensure!(
        diff.is_empty(),
        "diff after kill-install:\n{}",
        diff.join("\n")
    );

    // 2. SIGKILL during `kubeadm join`: a join must not run twice, so the host reports the
    //    interruption (Failed); deleting the Machine (what a MachineHealthCheck does) resets it
    //    and it is back in the pool, as before.
    bed.create_machine("e2e", "kill-join", "a").await?;
    wait_process(bed.host(0), "kubeadm join", 240).await?;
    kill_agent(bed.host(0)).await?;
    let failed = bed.wait_host_phase(&name, "Failed", 120).await?;
    let cond = failed
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "BootstrapSucceeded")
        })
        .context("no BootstrapSucceeded condition")?;
    ensure!(
        cond.reason == "BootstrapFailed" && cond.message.contains("runcmd[0]"),
        "{cond:?}"
    );
    bed.phases
        .done("kill-join: agent killed during kubeadm join, host Failed");
    bed.delete_machine("kill-join").await?;
    bed.wait_host_phase(&name, "Available", 180).await?;
    // The failed bootstrap is on the host's record, which holds it back from new claims; the
    // operator knows why it failed (the agent was killed) and frees it as
    // docs/troubleshooting.md says (`kubectl annotate byohost … bootstrap-failures-`).
    let host = bed.byohosts().get(&name).await?;
    let record = byoh_controller::bootstrap_failures::recorded(&host);
    ensure!(
        record.as_ref().is_some_and(|r| r.count == 1),
        "the failed bootstrap's record: {record:?}"
    );
    bed.byohosts()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {byoh_api::labels::BOOTSTRAP_FAILURES: null}}}),
            ),
        )
        .await?;
    let nodes: Api<Node> = Api::all(bed.admin.clone());
    let _ = nodes.delete(&name, &DeleteParams::default()).await;
    let diff = agent::snapshot_diff(&before, &agent::snapshot(bed.host(0)).await?);
    ensure!(
        diff.is_empty(),
        "diff after kill-join:\n{}",
        diff.join("\n")
    );
    bed.phases
        .done("kill-join: Machine deleted, host reset and Available");

    // 3. The API server goes down while the host installs and stays down for 20 s, so
    //    `kubeadm join` starts during the outage: its discovery retries until the API server is
    //    back, the kubelet's TLS bootstrap follows, and the agent reports once it can. (An
    //    outage in the middle of the join makes kubeadm fail fast; that ends like kill-join:
    //    the host reports BootstrapFailed and deleting the Machine resets it.)
    bed.create_machine("e2e", "api-down", "a").await?;
    bed.wait_host_phase(&name, "Installing", 60).await?;
    let cp = bed.cp.clone();
    tokio::task::spawn_blocking(move || cp.restart_apiserver(20)).await??;
    bed.admin = bed.cp.client().await?;
    bed.phases
        .done("api-down: API server down 20 s from the install on");
    wait_joined(bed, "api-down", 0).await?;
    release(bed, "api-down", 0).await?;

    // 4. Two Machines for one free host: one claims it, the other waits; when the first is
    //    deleted, the second gets the host.
    bed.create_machine("e2e", "twin-1", "a").await?;
    bed.create_machine("e2e", "twin-2", "a").await?;
    let bms = bed.byomachines();
    let winner = wait_for(
        "one twin to claim the host",
        Duration::from_secs(60),
        || async {
            for m in ["twin-1", "twin-2"] {
                if bms
                    .get_opt(m)
                    .await?
                    .and_then(|b| b.status.and_then(|s| s.host_ref))
                    .is_some()
                {
                    return Ok(Some(m));
                }
            }
            Ok(None)
        },
    )
    .await?;
    let loser = if winner == "twin-1" {
        "twin-2"
    } else {
        "twin-1"
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let l = bms.get(loser).await?;
    ensure!(
        l.status
            .as_ref()
            .and_then(|s| s.host_ref.as_ref())
            .is_none(),
        "both twins hold a host"
    );
    bed.phases
        .done("twins: one claimed the host, the other waits");
    wait_joined(bed, winner, 0).await?;
    // Released, the host goes straight to the waiting twin.
    delete_machine_and_node(bed, winner, 0).await?;
    bed.phases.done(&format!("{winner}: deleted, host reset"));
    wait_joined(bed, loser, 0).await?;
    release(bed, loser, 0).await?;
    let diff = agent::snapshot_diff(&before, &agent::snapshot(bed.host(0)).await?);
    ensure!(
        diff.is_empty(),
        "diff after the twins:\n{}",
        diff.join("\n")
    );

    // 5. A joined host is switched off, its Machine deleted (its Lease expires: the controller
    //    releases it at once and marks it needsCleanup), then switched on again: the agent
    //    cleans it up (reset, uninstall) before it is offered again.
    bed.create_machine("e2e", "off-on", "a").await?;
    wait_joined(bed, "off-on", 0).await?;
    bed.host(0).power_off().await?;
    bed.phases.done("off-on: joined host switched off");
    delete_machine_and_node(bed, "off-on", 0).await?;
    let hosts = bed.byohosts();
    let marked = hosts.get(&name).await?;
    ensure!(
        marked.spec.claim.is_none() && marked.spec.needs_cleanup.is_some(),
        "a released host that was off must be marked needsCleanup: {:?}",
        marked.spec
    );
    bed.phases
        .done("off-on: Machine deleted, host released and marked needsCleanup");
    bed.host(0).power_on().await?;
    bed.host(0).prepare_kubelet().await?;
    wait_for(
        "the host cleaned and offered again",
        Duration::from_secs(180),
        || async {
            Ok(hosts.get_opt(&name).await?.filter(|h| {
                h.spec.needs_cleanup.is_none()
                    && h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
            }))
        },
    )
    .await?;
    let diff = agent::snapshot_diff(&before, &agent::snapshot(bed.host(0)).await?);
    ensure!(diff.is_empty(), "diff after off-on:\n{}", diff.join("\n"));
    bed.phases
        .done("off-on: switched on, cleaned itself, Available");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn faults_converge_without_manual_help() {
    run("e2e-faults", &["a"], |bed| Box::pin(faults(bed))).await;
}
