//! What the system tests of the installer's `packages` source share (apt:
//! tests/tests/installer_packages.rs, dnf: tests/tests/installer_dnf.rs): stand-in Kubernetes
//! packages shaped like pkgs.k8s.io's, the K8sInstallerConfig, and a claim's life (wait for a
//! phase, release, a claim that must fail and leave nothing behind).
//!
//! Panics on failure: these are test steps, a panic is the failure report.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use crate::agent;
use crate::apt_repo::{KUBEADM_DROPIN, KUBELET_UNIT, Package};
use crate::control_plane;
use crate::gpg::GpgKey;
use crate::hosts::Host;
use crate::http::{FileServer, TestCa};
use byoh_api::{ByoHost, K8sInstallerConfig};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::PostParams;
use std::time::Duration;

/// A kubeadm stand-in: records each call in /run/byoh-test-kubeadm.log.
pub const KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nexit 0\n";
/// A kubelet stand-in: records its arguments at each start, then runs.
pub const KUBELET: &str =
    "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubelet.starts\nexec sleep infinity\n";
/// A kubectl stand-in.
pub const KUBECTL: &str = "#!/bin/sh\necho 'Client Version: v1.36.3'\n";
/// Every package of the stand-in repository.
pub const ALL_PACKAGES: [&str; 5] = [
    "kubeadm",
    "kubelet",
    "kubectl",
    "cri-tools",
    "kubernetes-cni",
];
/// Bootstrap data: the join with the packaged kubeadm, then the sentinel.
pub const DATA: &str = "#cloud-config\nruncmd:\n- [ \"kubeadm\", \"join\", \"--config\", \"/dev/null\" ]\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// The stand-in packages: kubeadm, kubelet and kubectl at each of `versions` (kubeadm needs
/// cri-tools, kubelet kubernetes-cni, as upstream), cri-tools at `cri_tools` and
/// kubernetes-cni at `cni` (the units and `/opt/cni/bin` as upstream ships them).
pub fn standin_packages(versions: &[&str], cri_tools: &str, cni: &str) -> Vec<Package> {
    let mut packages = Vec::new();
    for version in versions {
        packages.push(
            Package::new("kubeadm", version)
                .depends("cri-tools (>= 1.36.0)")
                .file("/usr/bin/kubeadm", KUBEADM, 0o755)
                .file(
                    "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
                    KUBEADM_DROPIN,
                    0o644,
                ),
        );
        packages.push(
            Package::new("kubelet", version)
                .depends("kubernetes-cni (>= 1.2.0)")
                .file("/usr/bin/kubelet", KUBELET, 0o755)
                .file(
                    "/usr/lib/systemd/system/kubelet.service",
                    KUBELET_UNIT,
                    0o644,
                ),
        );
        packages.push(Package::new("kubectl", version).file("/usr/bin/kubectl", KUBECTL, 0o755));
    }
    packages.push(Package::new("cri-tools", cri_tools).file(
        "/usr/bin/crictl",
        "#!/bin/sh\nexit 0\n",
        0o755,
    ));
    packages.push(Package::new("kubernetes-cni", cni).file(
        "/opt/cni/bin/bridge",
        "#!/bin/sh\nexit 0\n",
        0o755,
    ));
    packages
}

/// The ByoHost's status (default when it has none).
pub async fn status_of(hosts: &Api<ByoHost>, name: &str) -> byoh_api::ByoHostStatus {
    hosts
        .get_status(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// The ByoHost's condition `type_`.
pub async fn condition(hosts: &Api<ByoHost>, name: &str, type_: &str) -> Option<Condition> {
    status_of(hosts, name)
        .await
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
}

/// Waits for `phase`; a `Failed` host (when another phase is awaited) fails the test at once
/// with its conditions.
pub async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) {
    agent::wait_for(
        &format!("phase {phase}"),
        Duration::from_secs(secs),
        || async {
            let status = hosts
                .get_opt(name)
                .await?
                .and_then(|h| h.status)
                .unwrap_or_default();
            let now = status.phase.as_deref();
            assert!(
                now != Some("Failed") || phase == "Failed",
                "waiting for {phase}, the host failed: {:#?}",
                status.conditions
            );
            Ok((now == Some(phase)).then_some(()))
        },
    )
    .await
    .unwrap();
}

/// Release the claim of `uid` and drop it, as the controller does; waits for `Available`.
pub async fn release(client: &kube::Client, ns: &str, hosts: &Api<ByoHost>, name: &str, uid: &str) {
    agent::request_release(client, ns, name).await.unwrap();
    wait_released(client, ns, hosts, name, uid).await;
}

/// The rest of [`release`] once it is requested: waits for the clean-up of `uid`, drops the
/// claim and waits for `Available`.
pub async fn wait_released(
    client: &kube::Client,
    ns: &str,
    hosts: &Api<ByoHost>,
    name: &str,
    uid: &str,
) {
    agent::wait_for("cleanedMachineUID", Duration::from_secs(120), || async {
        Ok(hosts.get_opt(name).await?.filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.cleaned_machine_uid.as_deref())
                == Some(uid)
        }))
    })
    .await
    .unwrap();
    agent::drop_claim(client, ns, name).await.unwrap();
    wait_phase(hosts, name, "Available", 60).await;
}

/// Creates K8sInstallerConfig `ns/name` with `packages` as its `packages` source (JSON, e.g.
/// `{"aptRepository": ..., "keyURL": ...}`).
pub async fn packages_config(
    client: &kube::Client,
    ns: &str,
    name: &str,
    packages: serde_json::Value,
) {
    let config: K8sInstallerConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "K8sInstallerConfig",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "packages": packages },
    }))
    .unwrap();
    Api::<K8sInstallerConfig>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// Whether `path` exists on the host.
pub async fn exists(host: &Host, path: &str) -> bool {
    host.exec(&["test", "-e", path]).await.unwrap().success()
}

/// Claims the host with K8sInstallerConfig `config` (bootstrap Secret `data`), expects the
/// install to fail, checks that nothing is left behind (the [`agent::snapshot`] `before`, no
/// repository package `installed` says is there, kubeadm never ran), releases it and returns
/// the K8sComponentsInstalled condition.
#[allow(clippy::too_many_arguments)]
pub async fn failing_claim(
    client: &kube::Client,
    ns: &str,
    host: &Host,
    hosts: &Api<ByoHost>,
    before: &str,
    config: &str,
    uid: &str,
    installed: impl AsyncFn(&Host) -> Vec<String>,
) -> Condition {
    let name = host.name();
    agent::claim_host_installing(
        client,
        ns,
        name,
        &format!("m-{config}"),
        uid,
        "data",
        Some((config, "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(hosts, name, "Failed", 180).await;
    let cond = condition(hosts, name, "K8sComponentsInstalled")
        .await
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "InstallationFailed"),
        "{cond:?}"
    );
    let diff = agent::snapshot_diff(before, &agent::snapshot(host).await.unwrap());
    assert!(
        diff.is_empty(),
        "{config}: the failed install left changes behind:\n{}",
        diff.join("\n")
    );
    assert_eq!(installed(host).await, Vec::<String>::new());
    assert!(
        !exists(host, "/run/byoh-test-kubeadm.log").await,
        "nothing ran"
    );
    release(client, ns, hosts, name, uid).await;
    cond
}

/// A repository's files: URL path under the repository → body.
pub type RepoFiles = Vec<(String, Vec<u8>)>;

/// The repository's signing key and another one (for the wrong-key claim).
pub struct Keys {
    /// The key the signed repository is signed with.
    pub key: GpgKey,
    /// A key that is not the repository's.
    pub other: GpgKey,
}

impl Keys {
    /// Generates both.
    pub fn generate() -> Keys {
        Keys {
            key: GpgKey::generate("BYOH test repository <repo@byoh.invalid>").unwrap(),
            other: GpgKey::generate("Someone else <other@byoh.invalid>").unwrap(),
        }
    }
}

/// The repositories served and configured: `signed` and `unsigned` over HTTP on loopback, under
/// `/v1.36/` as pkgs.k8s.io publishes one repository per minor, the keys over HTTPS (`keyURL`
/// must be https) with a test CA, K8sInstallerConfigs `good` (signed, its key), `wrong-key`
/// (signed, the other key) and `unsigned` (unsigned, the right key), their repository URLs
/// written with `@minor@` in place of `v1.36` (the agent resolves it from the claim's version,
/// v1.36.3: issue 36), and the bootstrap Secret `data` ([`DATA`]).
pub struct Served {
    /// The keys.
    pub keys: Keys,
    /// The signed repository's URL, as the agent must resolve it (`…/v1.36/signed/`).
    pub signed: String,
    /// The URL of the repository key.
    pub key_url: String,
    ca: TestCa,
    _servers: (FileServer, FileServer),
}

/// The minor version of the claims' Kubernetes version (v1.36.3), under which the repositories
/// are served.
const MINOR: &str = "v1.36";

/// Serves `signed` and `unsigned` (see [`Served`]) and creates the configs in `ns`; `source`
/// makes the `packages` source of a repository URL and key URL.
pub async fn serve_and_configure(
    client: &kube::Client,
    ns: &str,
    keys: Keys,
    signed: RepoFiles,
    unsigned: RepoFiles,
    source: fn(&str, &str) -> serde_json::Value,
) -> Served {
    let mut files = Vec::new();
    for (p, body) in signed {
        files.push((format!("/{MINOR}/signed{p}"), body));
    }
    for (p, body) in unsigned {
        files.push((format!("/{MINOR}/unsigned{p}"), body));
    }
    let server = FileServer::start(files).await.unwrap();
    let ca = TestCa::new("BYOH test CA").unwrap();
    let key_server = FileServer::start_tls(
        vec![
            ("/repo.asc".into(), keys.key.armored_public_key().unwrap()),
            (
                "/other.asc".into(),
                keys.other.armored_public_key().unwrap(),
            ),
        ],
        &ca,
    )
    .await
    .unwrap();
    let key_base = key_server.base().to_string();
    let placeholder = byoh_api::installer_version::MINOR_PLACEHOLDER;
    let signed = format!("{}/{placeholder}/signed/", server.base());
    let unsigned = format!("{}/{placeholder}/unsigned/", server.base());
    for (name, repo, key) in [
        ("good", &signed, "repo"),
        ("wrong-key", &signed, "other"),
        ("unsigned", &unsigned, "repo"),
    ] {
        packages_config(
            client,
            ns,
            name,
            source(repo, &format!("{key_base}/{key}.asc")),
        )
        .await;
    }
    agent::create_bootstrap_secret(client, ns, "data", DATA)
        .await
        .unwrap();
    Served {
        keys,
        signed: signed.replace(placeholder, MINOR),
        key_url: format!("{key_base}/repo.asc"),
        ca,
        _servers: (server, key_server),
    }
}

/// Makes `host` trust the test CA (as an operator adds a private CA), registers it in `ns`
/// with `extra_config` in the agent's config, and starts containerd; the ByoHost API.
pub async fn register_trusting(
    client: &kube::Client,
    ns: &str,
    host: &Host,
    served: &Served,
    extra_config: &str,
) -> Api<ByoHost> {
    host.write_file(
        "/usr/local/share/ca-certificates/byoh-test-ca.crt",
        served.ca.pem().as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.run(&["update-ca-certificates"]).await.unwrap();
    agent::register(
        client,
        &control_plane::kubeconfig_path().unwrap(),
        ns,
        host,
        extra_config,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();
    Api::namespaced(client.clone(), ns)
}

/// kubelet.service from the package, with kubeadm's drop-in, started by the installer; the
/// packaged kubeadm joined.
pub async fn assert_packaged_kubelet_runs_and_joined(host: &Host) {
    assert_eq!(
        host.run(&["systemctl", "is-active", "kubelet.service"])
            .await
            .unwrap()
            .trim(),
        "active"
    );
    let args = host
        .read_to_string("/run/byoh-test-kubelet.starts")
        .await
        .unwrap();
    assert!(
        args.contains("--config=/var/lib/kubelet/config.yaml"),
        "{args}"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /dev/null\n"
    );
}

/// Claims the host with K8sInstallerConfig `good` (Machine `m-good`, uid `uid-good-1`,
/// Kubernetes v1.36.3, bootstrap Secret `data`) and waits until it is `Provisioned` with
/// `K8sComponentsInstalled`.
pub async fn claim_until_provisioned(
    client: &kube::Client,
    ns: &str,
    hosts: &Api<ByoHost>,
    name: &str,
) {
    let t = std::time::Instant::now();
    agent::claim_host_installing(
        client,
        ns,
        name,
        "m-good",
        "uid-good-1",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(hosts, name, "Provisioned", 300).await;
    eprintln!(
        "installed and bootstrapped in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(byoh_api::conditions::is_true(
        &status_of(hosts, name).await.conditions,
        "K8sComponentsInstalled"
    ));
}
