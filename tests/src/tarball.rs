//! Stand-in Kubernetes binaries served as a K8sInstallerConfig `tarball` source on loopback: a
//! kubeadm that records each call in `/run/byoh-test-kubeadm.log` (`join` fails when
//! `/etc/byoh-test-kubeadm-fail` exists), a kubelet that records each start in
//! `/run/byoh-test-kubelet.starts` and then runs, a kubectl. Claims through them install,
//! start the kubelet and reset as on a real host, in seconds.

use crate::http::FileServer;
use byoh_api::K8sInstallerConfig;
use kube::Api;
use kube::api::PostParams;

/// The kubeadm stand-in.
pub const KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nif [ \"$1\" = version ]; then echo v1.36.3; fi\nif [ \"$1\" = join ] && [ -e /etc/byoh-test-kubeadm-fail ]; then echo 'join failed' >&2; exit 1; fi\nexit 0\n";
/// The kubelet stand-in.
pub const KUBELET: &str = "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Kubernetes v1.36.3'; exit 0; fi\necho \"$*\" >> /run/byoh-test-kubelet.starts\nexec sleep infinity\n";
/// The kubectl stand-in.
pub const KUBECTL: &str = "#!/bin/sh\necho 'Client Version: v1.36.3'\n";
/// The paths the server serves them at.
pub const PATHS: [&str; 3] = ["/kubeadm", "/kubelet", "/kubectl"];
/// The Kubernetes version they report.
pub const VERSION: &str = "v1.36.3";

/// Serves the stand-ins on loopback.
///
/// # Errors
/// When the server cannot start.
pub async fn server() -> anyhow::Result<FileServer> {
    server_at("127.0.0.1").await
}

/// Serves the stand-ins on loopback address `ip`.
///
/// # Errors
/// When the server cannot start.
pub async fn server_at(ip: &str) -> anyhow::Result<FileServer> {
    FileServer::start_at(ip, files()).await
}

/// Serves the stand-ins over HTTPS on loopback address `ip`, with a certificate of `ca`.
///
/// # Errors
/// When the server cannot start.
pub async fn server_tls_at(ip: &str, ca: &crate::http::TestCa) -> anyhow::Result<FileServer> {
    FileServer::start_tls_at(ip, files(), ca).await
}

fn files() -> Vec<(String, Vec<u8>)> {
    vec![
        ("/kubeadm".into(), KUBEADM.as_bytes().to_vec()),
        ("/kubelet".into(), KUBELET.as_bytes().to_vec()),
        ("/kubectl".into(), KUBECTL.as_bytes().to_vec()),
    ]
}

/// The `spec` of a K8sInstallerConfig with a `tarball` source on `server` (YAML, as `byoh-agent
/// install --config-file` reads it); `kubelet_sha256` overrides the kubelet's (right) sha256.
/// The kubelet's URL carries a `token=s3cr3t` query, which must never reach a status or log.
///
/// # Errors
/// When hashing fails.
pub fn spec_yaml(server: &FileServer, kubelet_sha256: Option<&str>) -> anyhow::Result<String> {
    let base = server.base();
    spec_yaml_from([base, base, base], kubelet_sha256)
}

/// [`spec_yaml`] with each artifact from a server of its own: `bases` are the base URLs of
/// kubeadm, the kubelet and kubectl.
///
/// # Errors
/// When hashing fails.
pub fn spec_yaml_from(bases: [&str; 3], kubelet_sha256: Option<&str>) -> anyhow::Result<String> {
    let sha = |b: &str| crate::http::sha256(b.as_bytes());
    let [kubeadm, kubelet, kubectl] = bases;
    let kubelet_sha = match kubelet_sha256 {
        Some(s) => s.to_string(),
        None => sha(KUBELET)?,
    };
    Ok(format!(
        "tarball:\n  kubeadm:\n    url: {kubeadm}/kubeadm\n    sha256: {}\n  kubelet:\n    url: {kubelet}/kubelet?token=s3cr3t\n    sha256: {kubelet_sha}\n  kubectl:\n    url: {kubectl}/kubectl\n    sha256: {}\n",
        sha(KUBEADM)?,
        sha(KUBECTL)?,
    ))
}

/// Creates K8sInstallerConfig `namespace/name` with the `tarball` source of [`spec_yaml`].
///
/// # Errors
/// When the API server refuses it.
pub async fn create_config(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    server: &FileServer,
    kubelet_sha256: Option<&str>,
) -> anyhow::Result<()> {
    let base = server.base();
    create_config_from(client, namespace, name, [base, base, base], kubelet_sha256).await
}

/// [`create_config`] with the artifacts of [`spec_yaml_from`].
///
/// # Errors
/// When the API server refuses it.
pub async fn create_config_from(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    bases: [&str; 3],
    kubelet_sha256: Option<&str>,
) -> anyhow::Result<()> {
    let spec: serde_json::Value = serde_yaml_ng::from_str(&spec_yaml_from(bases, kubelet_sha256)?)?;
    let config: K8sInstallerConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "K8sInstallerConfig",
        "metadata": { "name": name, "namespace": namespace },
        "spec": spec,
    }))?;
    Api::<K8sInstallerConfig>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &config)
        .await?;
    Ok(())
}
