//! A second management cluster for `clusterctl move` (issue 15): the target's own control
//! plane, Cluster API's managers (`tests/capi/up`), BYOH installed by the caller (in
//! `tests/tests/capi_e2e.rs`, the page's own `clusterctl init --kubeconfig target.kubeconfig`)
//! and BYOH's controller. The move itself and the procedure that makes the pool's hosts follow
//! are docs/getting_started.md's blocks ("Moving to another management cluster"), which
//! `tests/tests/capi_e2e.rs` runs as written.

use crate::capi_bed::{CapiBed, CapiManagers, Clusterctl, tail};
use crate::control_plane::PrivateControlPlane;
use crate::controller::ControllerProcess;
use kube::Client;
use std::path::Path;

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
    /// Starts the control plane and Cluster API's managers, has `install_byoh` install BYOH
    /// (given the target's admin kubeconfig), then starts BYOH's controller watching the
    /// namespace of `bed`'s pool (which does not exist here yet: the documented procedure
    /// creates it), as `clusterctl init` leaves a management cluster.
    ///
    /// Errors when a part fails to start or `install_byoh` fails.
    pub async fn start(
        bed: &CapiBed,
        install_byoh: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<TargetManagement> {
        // The control plane and the managers start on a blocking thread: a scenario may run
        // this beside other work of its own task (tokio::join!), which a minute of blocking
        // here would starve (its waits would time out unpolled).
        let (cp, capi) = tokio::task::spawn_blocking(|| -> anyhow::Result<_> {
            let cp = PrivateControlPlane::start()?;
            let capi = CapiManagers::start(cp.kubeconfig())?;
            Ok((cp, capi))
        })
        .await??;
        let admin = cp.client().await?;
        install_byoh(cp.kubeconfig())?;
        let controller = ControllerProcess::start(&admin, cp.kubeconfig(), &bed.ns).await?;
        Ok(TargetManagement {
            controller,
            capi,
            admin,
            cp,
        })
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
