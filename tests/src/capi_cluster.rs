//! A cluster made by Cluster API on a [`CapiBed`], driven as a user drives it
//! (`clusterctl generate cluster`, patches of the MachineDeployment and the Cluster) and read as
//! Cluster API reports it (Machines, MachineDeployment status, v1beta2 conditions), with our
//! objects (ByoMachines, ByoHosts) and the workload cluster's Nodes.

use crate::agent::wait_for;
use crate::capi_bed::{CapiBed, Clusterctl, KUBERNETES_VERSION};
use anyhow::{Context as _, ensure};
use byoh_api::{ByoHost, ByoMachine};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt as _};
use std::time::Duration;

/// A cluster `name` in the bed's namespace, on the management cluster of `admin` (the bed's,
/// or another after `clusterctl move`).
pub struct CapiCluster<'a> {
    /// The bed it runs on.
    pub bed: &'a CapiBed,
    /// The Cluster's name.
    pub name: &'a str,
    /// The admin client of the management cluster that holds it.
    pub admin: Client,
}

impl<'a> CapiCluster<'a> {
    /// Cluster `name` on the bed's management cluster.
    pub fn new(bed: &'a CapiBed, name: &'a str) -> CapiCluster<'a> {
        CapiCluster {
            bed,
            name,
            admin: bed.admin.clone(),
        }
    }

    /// The same cluster on the management cluster of `admin` (after `clusterctl move`).
    pub fn moved_to(&self, admin: Client) -> CapiCluster<'a> {
        CapiCluster {
            bed: self.bed,
            name: self.name,
            admin,
        }
    }

    /// The namespaced API of `kind` in group `group`/`version` on its management cluster.
    pub fn api(&self, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.admin.clone(),
            self.bed.ns.as_str(),
            &crate::capi_bed::api_resource(group, version, kind),
        )
    }

    /// The namespaced API of Cluster API core kind `kind` (`cluster.x-k8s.io/v1beta2`) on its
    /// management cluster.
    pub fn capi(&self, kind: &str) -> Api<DynamicObject> {
        self.api("cluster.x-k8s.io", "v1beta2", kind)
    }

    /// `clusterctl generate cluster` of BYOH's templates (`flavor`, default when `None`), one
    /// control-plane and one worker Machine, with the site's variables: `endpoint_ip` as
    /// `CONTROL_PLANE_ENDPOINT_IP`, the bed's registry and package mirror.
    ///
    /// Errors when clusterctl fails.
    pub fn generate(&self, flavor: Option<&str>, endpoint_ip: &str) -> anyhow::Result<String> {
        let bed = self.bed;
        let infra = Clusterctl::infrastructure();
        let mut args = vec![
            "generate",
            "cluster",
            self.name,
            "--infrastructure",
            &infra,
            "--kubernetes-version",
            KUBERNETES_VERSION,
            "--control-plane-machine-count",
            "1",
            "--worker-machine-count",
            "1",
            "--target-namespace",
            bed.ns.as_str(),
        ];
        if let Some(f) = flavor {
            args.extend(["--flavor", f]);
        }
        let out = bed
            .clusterctl
            .command(&args)
            .env("CONTROL_PLANE_ENDPOINT_IP", endpoint_ip)
            .env("IMAGE_REPOSITORY", &bed.registry.image_repository)
            .env("BYOH_APT_REPOSITORY", bed.mirror.apt_repository())
            .env("BYOH_APT_KEY_URL", bed.mirror.key_url())
            .output()?;
        ensure!(
            out.status.success(),
            "clusterctl generate cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// The workload cluster's admin client, from the `<cluster>-kubeconfig` Secret KCP wrote,
    /// and the server URL of that kubeconfig.
    ///
    /// Errors when the Secret is not there (yet) or holds no usable kubeconfig.
    pub async fn workload(&self) -> anyhow::Result<(Client, String)> {
        let data = self.workload_kubeconfig().await?;
        let kc = kube::config::Kubeconfig::from_yaml(&String::from_utf8(data)?)?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        let server = config.cluster_url.to_string();
        Ok((Client::try_from(config)?, server))
    }

    /// Waits (up to `timeout`) for KCP's first control-plane Machine to get a host, then puts
    /// the control-plane endpoint `endpoint_ip` on that host's `host0` as a /32: the stand-in for
    /// kube-vip (its image is not available here), as kube-vip's ARP mode puts it there. The
    /// agent's clean-up removes it on release (the claim added it).
    ///
    /// Returns the Machine and the host's name. Errors when no Machine gets a host in time or
    /// the address cannot be added.
    pub async fn control_plane_host(
        &self,
        endpoint_ip: &str,
        timeout: Duration,
    ) -> anyhow::Result<(DynamicObject, String)> {
        let (machine, host) = wait_for(
            "KCP's control-plane Machine to get a host",
            timeout,
            || async {
                for m in self.machines(true).await? {
                    if let Some(host) = self.host_of(&m).await? {
                        return Ok(Some((m, host)));
                    }
                }
                Ok(None)
            },
        )
        .await?;
        self.bed
            .host(&host)?
            .run(&[
                "ip",
                "addr",
                "add",
                &format!("{endpoint_ip}/32"),
                "dev",
                "host0",
            ])
            .await?;
        Ok((machine, host))
    }

    /// The workload cluster's admin kubeconfig, as KCP wrote it to the `<cluster>-kubeconfig`
    /// Secret (what `clusterctl get kubeconfig` prints).
    ///
    /// Errors when the Secret is not there (yet) or holds no kubeconfig.
    pub async fn workload_kubeconfig(&self) -> anyhow::Result<Vec<u8>> {
        let secrets: Api<Secret> = Api::namespaced(self.admin.clone(), self.bed.ns.as_str());
        let s = secrets.get(&format!("{}-kubeconfig", self.name)).await?;
        s.data
            .and_then(|d| d.get("value").map(|b| b.0.clone()))
            .context("no kubeconfig in the Secret")
    }

    /// Our ByoMachines in the namespace.
    pub fn byomachines(&self) -> Api<ByoMachine> {
        Api::namespaced(self.admin.clone(), self.bed.ns.as_str())
    }

    /// Our ByoHosts in the namespace.
    pub fn byohosts(&self) -> Api<ByoHost> {
        Api::namespaced(self.admin.clone(), self.bed.ns.as_str())
    }

    /// The host a Machine's ByoMachine claimed, once it has.
    ///
    /// Errors when the API server does not answer.
    pub async fn host_of(&self, machine: &DynamicObject) -> anyhow::Result<Option<String>> {
        let Some(infra) = machine.data["spec"]["infrastructureRef"]["name"].as_str() else {
            return Ok(None);
        };
        Ok(self
            .byomachines()
            .get_opt(infra)
            .await?
            .and_then(|m| m.status.and_then(|s| s.host_ref))
            .map(|r| r.name))
    }

    /// The cluster's control-plane Machines (`control_plane`) or worker Machines.
    ///
    /// Errors when the API server does not answer.
    pub async fn machines(&self, control_plane: bool) -> anyhow::Result<Vec<DynamicObject>> {
        let lp = ListParams::default().labels(&format!(
            "cluster.x-k8s.io/cluster-name={},{}cluster.x-k8s.io/control-plane",
            self.name,
            if control_plane { "" } else { "!" }
        ));
        Ok(self.capi("Machine").list(&lp).await?.items)
    }

    /// The names of the workload cluster's Nodes, of those that are Ready when `ready_only`.
    ///
    /// Errors when the workload API server cannot be reached.
    pub async fn node_names(&self, ready_only: bool) -> anyhow::Result<Vec<String>> {
        let (workload, _) = self.workload().await?;
        Ok(Api::<Node>::all(workload)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| !ready_only || node_ready(n))
            .map(|n| n.name_any())
            .collect())
    }

    /// The name of a host of the bed that no claim holds (the first by name).
    ///
    /// Errors when every host is claimed or the list fails.
    pub async fn free_host(&self) -> anyhow::Result<String> {
        let claimed = self.claimed_hosts().await?;
        self.bed
            .hosts
            .iter()
            .map(|h| h.name().to_string())
            .find(|h| !claimed.contains(h))
            .context("no free host in the bed")
    }

    /// Each workload Node's name and its kubelet's version (`status.nodeInfo.kubeletVersion`,
    /// e.g. `v1.37.2`), sorted by name.
    ///
    /// Errors when the workload API server cannot be reached.
    pub async fn kubelet_versions(&self) -> anyhow::Result<Vec<(String, String)>> {
        let (workload, _) = self.workload().await?;
        let mut out: Vec<(String, String)> = Api::<Node>::all(workload)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|n| {
                let version = n
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.as_ref())
                    .map(|i| i.kubelet_version.clone())
                    .unwrap_or_default();
                (n.name_any(), version)
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The worker MachineDeployment's name: the cluster's one MachineDeployment (label
    /// `cluster.x-k8s.io/cluster-name`): `<cluster>-md-0` as the default template names it,
    /// `<cluster>-md-0-<random>` as the topology controller does.
    ///
    /// Errors when the cluster has not exactly one.
    pub async fn machine_deployment(&self) -> anyhow::Result<String> {
        let lp =
            ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={}", self.name));
        let mds = self.capi("MachineDeployment").list(&lp).await?.items;
        match mds.as_slice() {
            [md] => Ok(md.name_any()),
            _ => anyhow::bail!(
                "cluster {} has {} MachineDeployments, want 1",
                self.name,
                mds.len()
            ),
        }
    }

    /// Merge-patches the worker MachineDeployment with `patch`.
    ///
    /// Errors when the API server refuses it.
    pub async fn patch_machine_deployment(&self, patch: serde_json::Value) -> anyhow::Result<()> {
        self.capi("MachineDeployment")
            .patch(
                &self.machine_deployment().await?,
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
        Ok(())
    }

    /// Sets the worker MachineDeployment's `spec.replicas`, as `kubectl scale` does.
    ///
    /// Errors when the API server refuses it.
    pub async fn scale_workers(&self, replicas: u32) -> anyhow::Result<()> {
        self.patch_machine_deployment(serde_json::json!({"spec": {"replicas": replicas}}))
            .await
    }

    /// Sets the Cluster's `spec.paused`.
    ///
    /// Errors when the API server refuses it.
    pub async fn set_paused(&self, paused: bool) -> anyhow::Result<()> {
        self.capi("Cluster")
            .patch(
                self.name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"paused": paused}})),
            )
            .await?;
        Ok(())
    }

    /// The names of the ByoHosts claimed (`spec.claim` set).
    ///
    /// Errors when the API server does not answer.
    pub async fn claimed_hosts(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .byohosts()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|h| h.spec.claim.is_some())
            .map(|h| h.name_any())
            .collect())
    }

    /// The phase (`status.phase`) of ByoHost `name`.
    ///
    /// Errors when the API server does not answer.
    pub async fn host_phase(&self, name: &str) -> anyhow::Result<Option<String>> {
        Ok(self
            .byohosts()
            .get_opt(name)
            .await?
            .and_then(|h| h.status.and_then(|s| s.phase)))
    }

    /// Waits until the worker MachineDeployment reports `n` replicas, all up to date and
    /// available, and the cluster has `n` worker Machines `Running`, each with a `nodeRef` to a
    /// Ready Node whose providerID is its ByoMachine's, and `1 + n` Nodes in the workload
    /// cluster. Returns the worker Machines' hosts (sorted).
    ///
    /// Errors when that does not happen within `timeout`.
    pub async fn wait_workers(&self, n: usize, timeout: Duration) -> anyhow::Result<Vec<String>> {
        let (workload, _) = self.workload().await?;
        let nodes: Api<Node> = Api::all(workload);
        let mds = self.capi("MachineDeployment");
        let md = self.machine_deployment().await?;
        wait_for(
            &format!("{n} worker Machines Running with Ready Nodes, MachineDeployment available"),
            timeout,
            || async {
                let d = mds.get(&md).await?;
                let s = &d.data["status"];
                // A status of the current spec only.
                if s["observedGeneration"].as_i64() != d.metadata.generation {
                    return Ok(None);
                }
                let want = serde_json::json!(n);
                if [
                    "replicas",
                    "upToDateReplicas",
                    "availableReplicas",
                    "readyReplicas",
                ]
                .iter()
                .any(|f| s[f] != want)
                {
                    return Ok(None);
                }
                let machines = self.machines(false).await?;
                if machines.len() != n
                    || nodes.list(&ListParams::default()).await?.items.len() != n + 1
                {
                    return Ok(None);
                }
                let mut hosts = Vec::new();
                for m in &machines {
                    if m.data["status"]["phase"] != "Running" {
                        return Ok(None);
                    }
                    let Some(node) = m.data["status"]["nodeRef"]["name"].as_str() else {
                        return Ok(None);
                    };
                    let Some(node) = nodes.get_opt(node).await? else {
                        return Ok(None);
                    };
                    let Some(host) = self.host_of(m).await? else {
                        return Ok(None);
                    };
                    let infra = m.data["spec"]["infrastructureRef"]["name"]
                        .as_str()
                        .unwrap_or_default();
                    let bm = self.byomachines().get(infra).await?;
                    let node_pid = node.spec.as_ref().and_then(|s| s.provider_id.clone());
                    ensure!(
                        node_pid.is_some() && node_pid == bm.spec.provider_id,
                        "Node {} providerID {node_pid:?} != ByoMachine {infra}'s {:?}",
                        node.name_any(),
                        bm.spec.provider_id
                    );
                    if !node_ready(&node) {
                        return Ok(None);
                    }
                    hosts.push(host);
                }
                hosts.sort();
                Ok(Some(hosts))
            },
        )
        .await
    }

    /// Waits until the Cluster reports `Available`, `ControlPlaneAvailable` and
    /// `WorkersAvailable` True (v1beta2 conditions).
    ///
    /// Errors when it does not within `timeout`.
    pub async fn wait_available(&self, timeout: Duration) -> anyhow::Result<()> {
        let clusters = self.capi("Cluster");
        wait_for(
            "Cluster Available, ControlPlaneAvailable, WorkersAvailable",
            timeout,
            || async {
                let c = clusters.get(self.name).await?;
                Ok(["Available", "ControlPlaneAvailable", "WorkersAvailable"]
                    .iter()
                    .all(|t| condition_true(&c, t))
                    .then_some(()))
            },
        )
        .await
    }

    /// Deletes the Cluster and waits until it and every Machine are gone and every host of the
    /// bed is back in the pool as before its claims ([`Self::wait_released_clean`]).
    ///
    /// Errors when that does not happen in time (10 min for the Machines, 5 for each host).
    pub async fn delete_and_wait_clean(&self) -> anyhow::Result<()> {
        self.capi("Cluster")
            .delete(self.name, &kube::api::DeleteParams::default())
            .await?;
        wait_for(
            "the Cluster and every Machine gone",
            Duration::from_secs(600),
            || async {
                let cluster = self.capi("Cluster").get_opt(self.name).await?;
                let machines = self
                    .capi("Machine")
                    .list(&ListParams::default())
                    .await?
                    .items;
                Ok((cluster.is_none() && machines.is_empty()).then_some(()))
            },
        )
        .await?;
        for host in &self.bed.hosts {
            self.wait_released_clean(host.name(), Duration::from_secs(300))
                .await?;
        }
        Ok(())
    }

    /// Waits until ByoHost `name` is `Available` again (released, cleaned) and its file tree
    /// and unit list equal its snapshot before any claim.
    ///
    /// Errors when it does not within `timeout`, or the host differs.
    pub async fn wait_released_clean(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        wait_for(
            &format!("host {name} released, Available in the pool"),
            timeout,
            || async {
                let h = self.byohosts().get(name).await?;
                let available = h.spec.claim.is_none()
                    && h.spec.needs_cleanup.is_none()
                    && h.status.and_then(|s| s.phase).as_deref() == Some("Available");
                Ok(available.then_some(()))
            },
        )
        .await?;
        let diff = self.bed.changes_since_registration(name).await?;
        if diff.is_empty() {
            return Ok(());
        }
        // What systemd says of the slices and scopes left, for the failure message.
        let units = self
            .bed
            .host(name)?
            .run(&[
                "sh",
                "-c",
                "systemctl list-units --all --no-legend --no-pager '*.slice' '*.scope'; \
                 systemctl show kubepods.slice -p LoadState,ActiveState,SubState,RequiredBy,WantedBy,ReferencedBy; \
                 journalctl _PID=1 --no-pager -o short-precise | grep -i kubepods | tail -n 30",
            ])
            .await
            .unwrap_or_else(|e| format!("(systemd's view not read: {e:#})"));
        anyhow::bail!(
            "host {name} released must be as before its claim; diff:\n{}\nsystemd on the host:\n{units}",
            diff.join("\n")
        )
    }
}

/// A control-plane endpoint address for a cluster of this test process, in the test network's
/// range for endpoints `198.18.0.200-238`: three per process (`slot` 0 and 1: capi_e2e's two
/// clusters, 2: capi_remediation's), chosen by the process ID so that runs of other worktrees on
/// the same bridge mostly do not collide, and two test binaries of one run never do (their
/// slots differ). `198.18.0.240-254` are the fixed addresses of other tests and the demo
/// (hygiene.rs adds .250 and .251 on a host of the bridge while these tests may run beside it).
pub fn endpoint_ip(slot: u32) -> String {
    format!(
        "198.18.0.{}",
        200 + (std::process::id() % 13) * 3 + slot % 3
    )
}

/// Whether condition `type_` of a Cluster API object's v1beta2 `status.conditions` is True.
pub fn condition_true(obj: &DynamicObject, type_: &str) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

/// Whether a Node reports Ready=True.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The one change the test bed makes to the generated cluster: kubeadm's `SystemVerification`
/// preflight check is skipped (next to the template's own `Swap`), because this machine's cgroup
/// hierarchy is v1 and kubeadm v1.36 refuses it (the kubelet is told `--fail-cgroupv1=false` by
/// `tests/hosts/prepare-kubelet`). A VM with cgroup v2 needs neither (docs/e2e.md).
///
/// Errors unless there are exactly the three lists of the default flavor (KCP's init and join
/// configurations, the workers' KubeadmConfigTemplate).
pub fn skip_system_verification(yaml: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut n = 0;
    for line in yaml.lines() {
        out.push_str(line);
        out.push('\n');
        if line.trim() == "- Swap" {
            let indent = &line[..line.len() - line.trim_start().len()];
            out.push_str(&format!("{indent}- SystemVerification\n"));
            n += 1;
        }
    }
    ensure!(
        n == 3,
        "{n} ignorePreflightErrors lists with Swap in:\n{yaml}"
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_verification_is_skipped_next_to_swap_in_each_list() {
        let yaml = "a:\n  ignorePreflightErrors:\n  - Swap\n  - X\nb:\n    ignorePreflightErrors:\n    - Swap\nc:\n      - Swap\n";
        let out = skip_system_verification(yaml).unwrap_or_default();
        assert_eq!(
            out,
            "a:\n  ignorePreflightErrors:\n  - Swap\n  - SystemVerification\n  - X\nb:\n    ignorePreflightErrors:\n    - Swap\n    - SystemVerification\nc:\n      - Swap\n      - SystemVerification\n"
        );
        assert!(skip_system_verification("a:\n  - Swap\n").is_err());
    }
}
