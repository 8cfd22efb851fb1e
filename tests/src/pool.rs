//! A pool of booted hosts registered the way an operator registers them: a
//! `BootstrapKubeconfig` (the controller issues its token and approves the hosts' CSRs), its
//! kubeconfig on each host, the agent installed from the `.deb` in `dist/` with
//! `apt-get install`, `systemctl start byoh-agent` — until every ByoHost is Available. Used by
//! the end-to-end tests, which run the controller ([`crate::controller::ControllerProcess`]).

use crate::agent::wait_for;
use crate::hosts::Host;
use anyhow::{Context as _, ensure};
use byoh_api::ByoHost;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Duration;

/// Where hosts find the agent package (the workspace's dist/ is mounted at /byoh/dist).
pub fn deb_in_host() -> String {
    format!(
        "/byoh/dist/byoh-agent_{}-1_amd64.deb",
        env!("CARGO_PKG_VERSION")
    )
}

/// The agent package on this machine (`dist/`, built by `packaging/build-packages --arch
/// amd64`), or `None` after reporting it missing ([`crate::missing_part`]).
pub fn deb_on_machine() -> Option<std::path::PathBuf> {
    let deb = crate::agent::repo_root()
        .join("dist")
        .join(deb_in_host().rsplit('/').next().unwrap_or_default());
    if deb.exists() {
        return Some(deb);
    }
    crate::missing_part(&format!(
        "{} is missing; run packaging/build-packages --arch amd64",
        deb.display()
    ));
    None
}

/// Installs the agent package [`deb_in_host`] on `host` with apt-get, as an operator does (the
/// unit enabled, not started).
///
/// Errors when apt-get fails (its output in the message).
pub async fn install_deb(host: &Host) -> anyhow::Result<()> {
    let out = host
        .exec(&[
            "sh",
            "-c",
            &format!(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {} 2>&1",
                deb_in_host()
            ),
        ])
        .await?;
    ensure!(
        out.success(),
        "apt-get install of the agent on {}: {}",
        host.name(),
        out.stdout
    );
    Ok(())
}

/// Configures the packaged agent on `host` as Ansible would: `config` as the drop-in
/// `/etc/byoh/agent.toml.d/50-cluster.toml` and `bootstrap` as `/etc/byoh/bootstrap-kubeconfig`
/// (both 0600).
///
/// Errors when a write fails.
pub async fn configure(host: &Host, config: &str, bootstrap: &str) -> anyhow::Result<()> {
    host.write_file(
        "/etc/byoh/agent.toml.d/50-cluster.toml",
        config.as_bytes(),
        0o600,
    )
    .await?;
    host.write_file(
        "/etc/byoh/bootstrap-kubeconfig",
        bootstrap.as_bytes(),
        0o600,
    )
    .await
}

/// Registers `hosts` (each with the host label `e2e-host=<label>`) into pool `namespace`: a
/// BootstrapKubeconfig `pool` for the API server at `api_server` (as the hosts reach it) with
/// CA `ca_data` (base64 PEM, as in a kubeconfig), the agent from [`deb_in_host`] configured
/// with a 15 s Lease and started; waits (90 s) until every ByoHost is Available.
///
/// Errors when a step fails or a host does not become Available.
pub async fn register(
    admin: &Client,
    namespace: &str,
    api_server: &str,
    ca_data: &str,
    hosts: &[(&Host, &str)],
) -> anyhow::Result<()> {
    let bootstrap = bootstrap_kubeconfig(admin, namespace, api_server, ca_data).await?;
    for (host, label) in hosts {
        install_deb(host).await?;
        let config = format!(
            "[cluster]\nnamespace = \"{namespace}\"\nbootstrap_kubeconfig = \"/etc/byoh/bootstrap-kubeconfig\"\n[host]\nlabels = {{ e2e-host = \"{label}\" }}\n[agent]\nlease_duration = \"15s\"\n"
        );
        configure(host, &config, &bootstrap).await?;
        host.prepare_kubelet().await?;
        host.run(&["systemctl", "start", "--no-block", "byoh-agent"])
            .await?;
    }
    let api: Api<ByoHost> = Api::namespaced(admin.clone(), namespace);
    for (host, _) in hosts {
        let name = host.name().to_string();
        wait_for(
            "the ByoHost to be Available",
            Duration::from_secs(90),
            || async {
                Ok(api.get_opt(&name).await?.filter(|h| {
                    h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
                }))
            },
        )
        .await
        .with_context(|| format!("host {name}"))?;
    }
    Ok(())
}

/// Creates the BootstrapKubeconfig `pool` in `namespace` for the API server at `api_server` (as
/// the hosts reach it) with CA `ca_data` (base64 PEM), and returns the kubeconfig the
/// controller writes for it (Secret `pool-bootstrap-kubeconfig`, 60 s).
///
/// Errors when the create fails or the Secret does not come.
pub async fn bootstrap_kubeconfig(
    admin: &Client,
    namespace: &str,
    api_server: &str,
    ca_data: &str,
) -> anyhow::Result<String> {
    let bks: Api<byoh_api::BootstrapKubeconfig> = Api::namespaced(admin.clone(), namespace);
    let bk: byoh_api::BootstrapKubeconfig = serde_json::from_value(json!({
        "apiVersion": format!("{}/{}", byoh_api::GROUP, byoh_api::VERSION),
        "kind": "BootstrapKubeconfig",
        "metadata": {"name": "pool"},
        "spec": {
            "apiServer": api_server,
            "certificateAuthorityData": ca_data,
            "ttlSeconds": 3600,
        }
    }))?;
    bks.create(&PostParams::default(), &bk).await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    let bootstrap = wait_for(
        "the BootstrapKubeconfig's kubeconfig Secret",
        Duration::from_secs(60),
        || async {
            let Some(s) = secrets.get_opt("pool-bootstrap-kubeconfig").await? else {
                return Ok(None);
            };
            Ok(s.data
                .and_then(|d| d.get("kubeconfig").map(|b| b.0.clone()))
                .map(|b| String::from_utf8_lossy(&b).into_owned()))
        },
    )
    .await?;
    Ok(bootstrap)
}

/// The last 150 lines of the journals of the agent, the kubelet and containerd on each host, for
/// failure reports.
pub async fn journals(hosts: &[Host]) -> String {
    let mut out = String::new();
    for host in hosts {
        for unit in ["byoh-agent", "kubelet", "containerd"] {
            let j = host
                .exec(&[
                    "journalctl",
                    "--no-pager",
                    "-o",
                    "short-precise",
                    "-n",
                    "150",
                    "-u",
                    unit,
                ])
                .await
                .map(|o| o.stdout)
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!(
                "\n===== journal of {unit} on {} =====\n{j}",
                host.name()
            ));
        }
    }
    out
}
