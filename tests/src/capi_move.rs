//! A second management cluster for `clusterctl move` (issue 15), and the procedure of
//! docs/getting_started.md ("Moving to another management cluster") that makes a moved pool's
//! hosts follow: the target's own control plane, Cluster API's managers (`tests/capi/up`),
//! BYOH installed as `clusterctl init` installs it ([`Clusterctl::install_byoh`]) with its
//! controller, and the pool's namespace, labelled a host pool as on the source.

use crate::capi_bed::{CapiBed, CapiManagers, Clusterctl, as_hosts_reach_it, run, tail};
use crate::control_plane::PrivateControlPlane;
use crate::controller::ControllerProcess;
use crate::pool;
use anyhow::Context as _;
use byoh_api::{ByoHost, labels};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};

/// What a pool's hosts are told to re-enrol with: the value of the annotation
/// [`labels::ALLOW_RE_ENROLMENT`] the procedure puts on each moved ByoHost.
pub const RE_ENROLMENT_REASON: &str = "clusterctl move";

/// The target management cluster. Its parts stop when it is dropped (the controller and the
/// managers before the control plane).
pub struct TargetManagement {
    /// BYOH's controller on it.
    pub controller: ControllerProcess,
    /// Cluster API's managers on it.
    pub capi: CapiManagers,
    /// Its admin client.
    pub admin: Client,
    /// Its control plane.
    pub cp: PrivateControlPlane,
}

impl TargetManagement {
    /// Starts everything, with the namespace of `bed`'s pool.
    ///
    /// Errors when a part fails to start.
    pub async fn start(bed: &CapiBed) -> anyhow::Result<TargetManagement> {
        let cp = PrivateControlPlane::start()?;
        let admin = cp.client().await?;
        let capi = CapiManagers::start(cp.kubeconfig())?;
        bed.clusterctl.install_byoh(&admin).await?;
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(bed.ns.name().into()),
                labels: Some([(labels::HOST_POOL.to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .context("the pool's namespace on the target")?;
        let controller = ControllerProcess::start(&admin, cp.kubeconfig(), bed.ns.name()).await?;
        Ok(TargetManagement {
            controller,
            capi,
            admin,
            cp,
        })
    }

    /// `clusterctl move --namespace <pool> --kubeconfig <bed's> --to-kubeconfig <this one's>`;
    /// its output.
    ///
    /// Errors when clusterctl fails.
    pub fn move_from(&self, bed: &CapiBed) -> anyhow::Result<String> {
        let mut cmd = bed
            .clusterctl
            .command(&["move", "--namespace", bed.ns.name()]);
        cmd.arg("--kubeconfig")
            .arg(bed.cp.kubeconfig())
            .arg("--to-kubeconfig")
            .arg(self.cp.kubeconfig());
        run(&mut cmd)
    }

    /// The hosts follow, as docs/getting_started.md says: each moved ByoHost may enrol once
    /// more ([`labels::ALLOW_RE_ENROLMENT`]), a BootstrapKubeconfig of this cluster for the
    /// hosts, written to each host's `/etc/byoh/bootstrap-kubeconfig` as Ansible would, and
    /// `systemctl restart byoh-agent`: the agent sees a bootstrap kubeconfig of another cluster
    /// CA and enrols with it.
    ///
    /// Errors when a step fails.
    pub async fn enrol_hosts(&self, bed: &CapiBed) -> anyhow::Result<()> {
        let ns = bed.ns.name();
        let hosts: Api<ByoHost> = Api::namespaced(self.admin.clone(), ns);
        let patch = serde_json::json!({"metadata": {"annotations": {
            labels::ALLOW_RE_ENROLMENT: RE_ENROLMENT_REASON
        }}});
        for h in hosts.list(&ListParams::default()).await?.items {
            hosts
                .patch(
                    &h.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        let (server, ca) = as_hosts_reach_it(self.cp.kubeconfig())?;
        let bootstrap = pool::bootstrap_kubeconfig(&self.admin, ns, &server, &ca).await?;
        for host in &bed.hosts {
            host.write_file(
                "/etc/byoh/bootstrap-kubeconfig",
                bootstrap.as_bytes(),
                0o600,
            )
            .await?;
            host.run(&["systemctl", "restart", "--no-block", "byoh-agent"])
                .await?;
        }
        Ok(())
    }

    /// What a failure report needs from this side: the managers' and the controller's logs and
    /// `clusterctl describe cluster <cluster>` here.
    pub fn diagnostics(&self, clusterctl: &Clusterctl, ns: &str, cluster: &str) -> String {
        let mut out = String::from("\n########## the target management cluster ##########\n");
        out.push_str(&self.capi.logs());
        out.push_str("\n===== byoh-controller log on the target (last 150 lines) =====\n");
        out.push_str(&tail(&self.controller.log(), 150));
        let describe = clusterctl
            .command(&[
                "describe",
                "cluster",
                cluster,
                "-n",
                ns,
                "--show-conditions",
                "all",
            ])
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig())
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_else(|e| e.to_string());
        out.push_str("\n===== clusterctl describe cluster on the target =====\n");
        out.push_str(&describe);
        out
    }
}
