//! The kubeadm side of the test bed, for the end-to-end test and the demo: a control plane
//! prepared for worker `kubeadm join`s (`tests/control-plane/kubeadm-init`), the installer
//! artifacts (`tests/control-plane/artifacts`: real kubeadm/kubelet/kubectl of the pinned
//! Kubernetes version, Debian's containerd/runc and CNI plugins) served on 127.0.0.1, and the
//! bootstrap data CABPK writes for a worker Machine.

use anyhow::{Context as _, bail};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a worker needs to join the control plane (`DIR/join.env` of `kubeadm-init`).
#[derive(Debug, Clone)]
pub struct JoinInfo {
    /// `127.0.0.1:<port>` of the kube-apiserver.
    pub endpoint: String,
    /// The bootstrap token `<id>.<secret>` (group `system:bootstrappers:kubeadm:default-node-token`).
    pub token: String,
    /// `sha256:<hex>` of the cluster CA's SubjectPublicKeyInfo (kubeadm's `caCertHashes`).
    pub ca_hash: String,
    /// The pinned Kubernetes version, e.g. `v1.36.3`.
    pub kubernetes_version: String,
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("control-plane")
        .join(name)
}

/// Last stdout line of `script args`, or an error with its stderr.
fn run_script(name: &str, args: &[&Path]) -> anyhow::Result<String> {
    run_script_with(name, args, &[])
}

/// [`run_script`] with `env` (`(NAME, VALUE)` pairs) set for the script.
fn run_script_with(name: &str, args: &[&Path], env: &[(&str, &str)]) -> anyhow::Result<String> {
    let out = std::process::Command::new(script(name))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("running tests/control-plane/{name}"))?;
    if !out.status.success() {
        bail!(
            "tests/control-plane/{name} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// Runs kubeadm's init phases (upload-config, bootstrap-token) against the control plane whose
/// admin kubeconfig is `kubeconfig`, and returns what a join needs.
///
/// Errors when the script fails or `join.env` lacks a key.
pub fn prepare_joins(kubeconfig: &Path) -> anyhow::Result<JoinInfo> {
    let dir = kubeconfig.parent().unwrap_or(Path::new("/"));
    let env = PathBuf::from(run_script("kubeadm-init", &[dir])?);
    let text = std::fs::read_to_string(&env).with_context(|| env.display().to_string())?;
    let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| {
        vars.get(k)
            .map(|v| v.to_string())
            .with_context(|| format!("{}: no {k}", env.display()))
    };
    Ok(JoinInfo {
        endpoint: get("BYOH_JOIN_ENDPOINT")?,
        token: get("BYOH_JOIN_TOKEN")?,
        ca_hash: get("BYOH_JOIN_CA_HASH")?,
        kubernetes_version: get("BYOH_K8S_VERSION")?,
    })
}

/// The staged artifacts directory (built once, cached under `~/.cache/byoh-test`).
///
/// Errors when staging fails.
pub fn stage_artifacts() -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(run_script("artifacts", &[])?))
}

/// The staged artifacts of the Kubernetes version clusters are upgraded to
/// (`BYOH_TEST_K8S=upgrade`, tests/control-plane/lib.sh; issue 36), built once and cached as
/// [`stage_artifacts`]'.
///
/// Errors when staging fails.
pub fn stage_upgrade_artifacts() -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(run_script_with(
        "artifacts",
        &[],
        &[("BYOH_TEST_K8S", "upgrade")],
    )?))
}

/// Artifacts served over HTTP on 127.0.0.1 ([`crate::http::FileServer`]) until the test's
/// runtime ends.
#[derive(Debug)]
pub struct ArtifactServer {
    server: crate::http::FileServer,
    sums: BTreeMap<String, String>,
}

impl ArtifactServer {
    /// Serves every file of `dir` (flat, `GET /<name>`) and reads `dir/SHA256SUMS`.
    ///
    /// Errors when the listener cannot bind or the sums cannot be read.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let sums_path = dir.join("SHA256SUMS");
        let sums = std::fs::read_to_string(&sums_path)
            .with_context(|| sums_path.display().to_string())?
            .lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(sum, name)| (name.to_string(), sum.to_string()))
            .collect();
        let server = crate::http::FileServer::start_dir(dir).await?;
        Ok(Self { server, sums })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> &str {
        self.server.base()
    }

    /// A `tarball` K8sInstallerConfig spec (YAML) for every staged artifact.
    ///
    /// Errors when a sum is missing.
    pub fn tarball_spec(&self) -> anyhow::Result<serde_json::Value> {
        let art = |name: &str| -> anyhow::Result<serde_json::Value> {
            let sha = self
                .sums
                .get(name)
                .with_context(|| format!("no sha256 for {name} in SHA256SUMS"))?;
            Ok(serde_json::json!({"url": format!("{}/{name}", self.server.base()), "sha256": sha}))
        };
        Ok(serde_json::json!({"tarball": {
            "kubeadm": art("kubeadm")?,
            "kubelet": art("kubelet")?,
            "kubectl": art("kubectl")?,
            "containerd": art("containerd.tar.gz")?,
            "cniPlugins": art("cni-plugins.tgz")?,
        }}))
    }
}

/// Preflight checks of `kubeadm join` that cannot pass inside a systemd-nspawn test host
/// (docs/e2e.md): `SystemVerification` fails on a machine whose cgroup hierarchy is v1 or hybrid
/// (the kubelet is told `failCgroupV1: false`, and kubeadm asks to skip this check as well), and
/// `/proc/sys/net/ipv4/ip_forward` is the machine's (hosts share its network namespace, the test
/// does not turn forwarding on for the whole machine; nothing is routed through test nodes).
pub const IGNORED_PREFLIGHT_ERRORS: &[&str] = &[
    "SystemVerification",
    "FileContent--proc-sys-net-ipv4-ip_forward",
];

/// Bootstrap data exactly as Cluster API's kubeadm bootstrap provider (CABPK v1.14) writes it
/// for a worker Machine (the Secret's `value`, `format: cloud-config`), with the real token, CA
/// hash and endpoint, plus `ignorePreflightErrors` (a JoinConfiguration field CABPK passes
/// through from the KubeadmConfig).
pub fn cabpk_worker_join(join: &JoinInfo, node_labels: &str) -> String {
    let ignored: String = IGNORED_PREFLIGHT_ERRORS
        .iter()
        .map(|e| format!("          - {e}\n"))
        .collect();
    format!(
        r#"## template: jinja
#cloud-config
write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
      apiVersion: kubeadm.k8s.io/v1beta4
      discovery:
        bootstrapToken:
          apiServerEndpoint: {endpoint}
          caCertHashes:
          - {ca_hash}
          token: {token}
      kind: JoinConfiguration
      nodeRegistration:
        ignorePreflightErrors:
{ignored}        kubeletExtraArgs:
        - name: node-labels
          value: {node_labels}
        name: '{{{{ ds.meta_data.local_hostname }}}}'
        taints:
        - effect: NoSchedule
          key: node.cluster.x-k8s.io/uninitialized
-   path: /run/cluster-api/placeholder
    owner: root:root
    permissions: '0640'
    content: "This placeholder file is used to create the /run/cluster-api sub directory in a way that is compatible with both Linux and Windows (mkdir -p /run/cluster-api does not work with Windows)"
runcmd:
  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete
"#,
        endpoint = join.endpoint,
        ca_hash = join.ca_hash,
        token = join.token,
    )
}
