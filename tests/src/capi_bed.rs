//! A site driven by Cluster API's own managers (issue 15): a management control plane of the
//! test's own, the core, kubeadm bootstrap (CABPK) and kubeadm control plane (KCP) managers as
//! processes (`tests/capi/up`), the control-plane images served by a real registry
//! (`tests/images/serve`), the Kubernetes packages in a signed apt repository, BYOH's components
//! and controller, and hosts on the test network (`tests/hosts/boot --network --containers`)
//! prepared as a site prepares its machines ([`crate::machine::prepare`]) and registered with the
//! packaged agent ([`crate::pool::register`]). [`crate::capi_cluster`] drives and reads the
//! cluster made on it; `tests/tests/capi_e2e.rs` is the scenario.

use crate::agent::{repo_root, snapshot};
use crate::apt_repo::{self, GpgKey};
use crate::control_plane::PrivateControlPlane;
use crate::controller::ControllerProcess;
use crate::hosts::{BootOptions, Host, NETWORK_GATEWAY};
use crate::http::{FileServer, TestCa};
use crate::phases::Phases;
use crate::{kubeadm, machine, pool};
use anyhow::{Context as _, ensure};
use byoh_api::labels;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Kubernetes version of the cluster: the test bed's.
pub const KUBERNETES_VERSION: &str = "v1.36.3";
/// The Debian version of its packages in the test repository.
pub const PACKAGE_VERSION: &str = "1.36.3-1.1";
/// The version clusters are upgraded to (issue 36): the next minor, built beside the bed's own
/// (`BYOH_TEST_K8S=upgrade`, tests/control-plane/lib.sh), its images in the same registry and its
/// packages in a repository of their own, as pkgs.k8s.io publishes one per minor.
pub const UPGRADE_VERSION: &str = "v1.37.2";
/// The Debian version of its packages.
pub const UPGRADE_PACKAGE_VERSION: &str = "1.37.2-1.1";

/// Runs `cmd`; its stdout, or an error with its output.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Runs a script of the test bed (`path` relative to the repository); its stdout.
pub fn script(path: &str, args: &[&str]) -> anyhow::Result<String> {
    run(Command::new(repo_root().join(path)).args(args))
}

/// The last line of a script's output as a path (the test-bed scripts print their directory
/// last).
pub fn last_line(out: &str) -> PathBuf {
    PathBuf::from(out.lines().last().unwrap_or_default().trim())
}

/// clusterctl (built by `tests/capi/build`) with a local repository laid out as
/// `packaging/release` lays it out (`infrastructure-byoh/v<ver>/`, from `controller/config/`),
/// a config pointing at it and a home of its own: what a user's clusterctl sees of a release.
/// The config also points Cluster API's own providers (`cluster-api`, `kubeadm` bootstrap and
/// control plane) at their local repository (`tests/capi/repository`), as an air-gapped site
/// points them at its mirror: `clusterctl init` reads their metadata from there.
pub struct Clusterctl {
    bin: PathBuf,
    config: PathBuf,
    dir: tempfile::TempDir,
}

impl Clusterctl {
    /// Builds (or finds cached) clusterctl and lays out the repositories.
    ///
    /// Errors when the build or a copy fails.
    pub fn new() -> anyhow::Result<Clusterctl> {
        let bin = last_line(&script("tests/capi/build", &["clusterctl"])?).join("clusterctl");
        let capi_repo = last_line(&script("tests/capi/repository", &[])?);
        let dir = tempfile::tempdir()?;
        let repo = dir.path().join(format!(
            "repository/infrastructure-byoh/v{}",
            env!("CARGO_PKG_VERSION")
        ));
        std::fs::create_dir_all(&repo)?;
        let config = repo_root().join("controller/config");
        for f in ["infrastructure-components.yaml", "metadata.yaml"] {
            std::fs::copy(config.join(f), repo.join(f))?;
        }
        for entry in std::fs::read_dir(config.join("templates"))? {
            let entry = entry?;
            std::fs::copy(entry.path(), repo.join(entry.file_name()))?;
        }
        let mut providers = format!(
            "providers:\n- name: byoh\n  type: InfrastructureProvider\n  url: file://{}/infrastructure-components.yaml\n",
            repo.display()
        );
        for (name, type_, label, file) in [
            (
                "cluster-api",
                "CoreProvider",
                "cluster-api",
                "core-components.yaml",
            ),
            (
                "kubeadm",
                "BootstrapProvider",
                "bootstrap-kubeadm",
                "bootstrap-components.yaml",
            ),
            (
                "kubeadm",
                "ControlPlaneProvider",
                "control-plane-kubeadm",
                "control-plane-components.yaml",
            ),
        ] {
            let version = std::fs::read_dir(capi_repo.join(label))?
                .next()
                .context("an empty Cluster API repository")??
                .file_name();
            providers.push_str(&format!(
                "- name: {name}\n  type: {type_}\n  url: file://{}/{label}/{}/{file}\n",
                capi_repo.display(),
                version.to_string_lossy()
            ));
        }
        let config = dir.path().join("clusterctl.yaml");
        std::fs::write(&config, providers)?;
        std::fs::create_dir_all(dir.path().join("home"))?;
        Ok(Clusterctl { bin, config, dir })
    }

    /// `clusterctl <args> --config <the repository's config>`, with a home of its own, no
    /// kubeconfig unless the arguments give one, no version check.
    pub fn command(&self, args: &[&str]) -> Command {
        let home = self.dir.path().join("home");
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .arg("--config")
            .arg(&self.config)
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("KUBECONFIG", home.join("no-kubeconfig"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env_remove("BYOH_WATCH_NAMESPACE");
        cmd
    }

    /// The clusterctl binary.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The config (`clusterctl.yaml`): the four providers and their local repositories.
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The `--infrastructure` value of this release: `byoh:v<version>`.
    pub fn infrastructure() -> String {
        format!("byoh:v{}", env!("CARGO_PKG_VERSION"))
    }

    /// Installs BYOH on the management cluster of `kubeconfig`, where `tests/capi/up` runs
    /// Cluster API: `clusterctl init --infrastructure byoh`, which checks the providers'
    /// contracts and cert-manager's API, applies the components and records BYOH in its
    /// inventory.
    ///
    /// Errors when clusterctl fails, with its log.
    pub fn install_byoh(&self, kubeconfig: &Path) -> anyhow::Result<()> {
        let kubeconfig = kubeconfig.to_string_lossy();
        run(&mut self.command(&[
            "init",
            "--infrastructure",
            "byoh",
            "--kubeconfig",
            &kubeconfig,
        ]))?;
        Ok(())
    }
}

/// The API server address and CA (base64 PEM) of the control plane of `kubeconfig` as the
/// hosts on the test network reach it (the gateway's address instead of loopback).
///
/// Errors when the kubeconfig has no cluster, server or CA.
pub fn as_hosts_reach_it(kubeconfig: &Path) -> anyhow::Result<(String, String)> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let cluster = kc.clusters[0].cluster.clone().context("no cluster")?;
    let server = cluster
        .server
        .as_deref()
        .context("no server")?
        .replace("127.0.0.1", &NETWORK_GATEWAY.to_string());
    let ca = cluster.certificate_authority_data.context("no CA")?;
    Ok((server, ca))
}

/// The images' registry as `tests/images/serve` reports it, seen from the hosts.
pub struct Registry {
    /// kubeadm's `imageRepository`, e.g. `198.18.0.1:5443/k8s`.
    pub image_repository: String,
    /// containerd's CRI `sandbox_image` (the registry's pause image).
    pub sandbox_image: String,
    /// The registry's CA certificate, PEM.
    pub ca_pem: String,
}

impl Registry {
    /// Starts (or finds running) the registry of the test network.
    ///
    /// Errors when `tests/images/serve` fails or prints no address.
    pub fn serve() -> anyhow::Result<Registry> {
        // The images of the version clusters are upgraded to first (its kubeadm pulls them all
        // before a control-plane join, CoreDNS too), then those of the bed's version, whose
        // output (the same registry) is read.
        run(Command::new(repo_root().join("tests/images/serve"))
            .arg("127.0.0.1")
            .env("BYOH_TEST_K8S", "upgrade"))?;
        let out = script("tests/images/serve", &["127.0.0.1"])?;
        let vars: BTreeMap<&str, &str> = out.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| -> anyhow::Result<String> {
            Ok(vars
                .get(k)
                .with_context(|| format!("tests/images/serve printed no {k}: {out}"))?
                .replace("127.0.0.1", &NETWORK_GATEWAY.to_string()))
        };
        Ok(Registry {
            image_repository: get("image_repository")?,
            sandbox_image: get("sandbox_image")?,
            ca_pem: std::fs::read_to_string(get("ca")?)?,
        })
    }
}

/// Cluster API's managers on a control plane (`tests/capi/up`), stopped when dropped.
pub struct CapiManagers {
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl CapiManagers {
    /// Starts the managers against the control plane of `kubeconfig`.
    ///
    /// Errors when `tests/capi/up` fails.
    pub fn start(kubeconfig: &Path) -> anyhow::Result<CapiManagers> {
        let out = script("tests/capi/up", &[&kubeconfig.to_string_lossy()])?;
        Ok(CapiManagers {
            kubeconfig: kubeconfig.to_path_buf(),
            dir: last_line(&out),
        })
    }

    /// The last 60 lines of every manager's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) else {
            return out;
        };
        for e in entries.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            out.push_str(&format!(
                "\n===== {} (last 60 lines) =====\n",
                e.path().display()
            ));
            out.push_str(&tail(&text, 60));
        }
        out
    }
}

impl Drop for CapiManagers {
    fn drop(&mut self) {
        let _ = script("tests/capi/down", &[&self.kubeconfig.to_string_lossy()]);
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.iter().rev().fold(String::new(), |mut s, l| {
        s.push_str(l);
        s.push('\n');
        s
    })
}

/// The Kubernetes packages in a signed apt repository, the key over HTTPS.
pub struct PackageMirror {
    /// The repository (plain HTTP, signed `InRelease`).
    pub repo: FileServer,
    /// `Release.key` over HTTPS (a repository's key URL must be https).
    pub keys: FileServer,
    _key: GpgKey,
}

/// A package mirror's content before it is served: the repositories' files (URL path → body)
/// and the key that signed their `InRelease`.
pub struct MirrorPackages {
    files: Vec<(String, Vec<u8>)>,
    key: GpgKey,
}

impl PackageMirror {
    /// The packages of the test bed's binaries (kubeadm, kubelet, kubectl, CNI plugins, …) as
    /// pkgs.k8s.io lays them out: one flat repository per minor version, `/v1.36/` for
    /// [`KUBERNETES_VERSION`] and `/v1.37/` for [`UPGRADE_VERSION`], each with its `InRelease`
    /// signed by one new key: what [`PackageMirror::serve`] serves. A cluster's
    /// `aptRepository` is `<base>/@minor@/` ([`PackageMirror::apt_repository`]).
    ///
    /// Errors when a package or the signature fails.
    pub fn packages() -> anyhow::Result<MirrorPackages> {
        let key = GpgKey::generate("BYOH e2e mirror <mirror@byoh.invalid>")?;
        let mut files = Vec::new();
        for (version, package_version, artifacts) in [
            (
                KUBERNETES_VERSION,
                PACKAGE_VERSION,
                kubeadm::stage_artifacts()?,
            ),
            (
                UPGRADE_VERSION,
                UPGRADE_PACKAGE_VERSION,
                kubeadm::stage_upgrade_artifacts()?,
            ),
        ] {
            let minor =
                byoh_api::installer_version::minor_of(version).context("a Kubernetes version")?;
            let mut repo = apt_repo::kubernetes_repository(package_version, &artifacts)?;
            let signed = key.clearsign(apt_repo::release_of(&repo)?)?;
            repo.push(("/InRelease".into(), signed));
            files.extend(
                repo.into_iter()
                    .map(|(path, body)| (format!("/{minor}{path}"), body)),
            );
        }
        Ok(MirrorPackages { files, key })
    }

    /// Serves `packages`, the key over TLS with a certificate signed by `ca`.
    ///
    /// Errors when a server fails to start.
    pub async fn serve(packages: MirrorPackages, ca: &TestCa) -> anyhow::Result<PackageMirror> {
        let MirrorPackages { files, key } = packages;
        let minors: Vec<String> = [KUBERNETES_VERSION, UPGRADE_VERSION]
            .iter()
            .filter_map(|v| byoh_api::installer_version::minor_of(v))
            .collect();
        let repo = FileServer::start(files).await?;
        let public = key.armored_public_key()?;
        let keys = FileServer::start_tls(
            minors
                .iter()
                .map(|m| (format!("/{m}/Release.key"), public.clone()))
                .collect(),
            ca,
        )
        .await?;
        Ok(PackageMirror {
            repo,
            keys,
            _key: key,
        })
    }

    /// The cluster's `aptRepository` as the hosts reach it: `http://…/@minor@/`, the agent
    /// putting the Machine's minor in place of [`byoh_api::installer_version::MINOR_PLACEHOLDER`].
    pub fn apt_repository(&self) -> String {
        format!(
            "{}/{}/",
            self.repo.base_on_network(),
            byoh_api::installer_version::MINOR_PLACEHOLDER
        )
    }

    /// The cluster's `keyURL` as the hosts reach it: `https://…/@minor@/Release.key`.
    pub fn key_url(&self) -> String {
        format!(
            "{}/{}/Release.key",
            self.keys.base_on_network(),
            byoh_api::installer_version::MINOR_PLACEHOLDER
        )
    }
}

/// An API of Cluster API kind `kind` of `group`/`version`, dynamically typed.
pub fn api_resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// clusterctl's inventory on the management cluster of `admin`: each Provider object as
/// `<namespace>/<name> <providerName> <type> <version>`, sorted.
///
/// Errors when the list fails.
pub async fn inventory(admin: &Client) -> anyhow::Result<Vec<String>> {
    let ar = api_resource("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider");
    let providers = Api::<DynamicObject>::all_with(admin.clone(), &ar)
        .list(&kube::api::ListParams::default())
        .await?;
    let mut out: Vec<String> = providers
        .items
        .iter()
        .map(|p| {
            let field = |k: &str| p.data.get(k).and_then(|v| v.as_str()).unwrap_or("-");
            format!(
                "{}/{} {} {} {}",
                p.metadata.namespace.as_deref().unwrap_or("-"),
                p.metadata.name.as_deref().unwrap_or("-"),
                field("providerName"),
                field("type"),
                field("version")
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Everything a Cluster API scenario runs on.
pub struct CapiBed {
    /// The management control plane.
    pub cp: PrivateControlPlane,
    /// Its admin client.
    pub admin: Client,
    /// Cluster API's managers.
    pub capi: CapiManagers,
    /// The image registry.
    pub registry: Registry,
    /// The package mirror.
    pub mirror: PackageMirror,
    /// BYOH's controller.
    pub controller: ControllerProcess,
    /// The namespace of the pool and the cluster (the control plane is the bed's own, so it
    /// has the name the documentation uses, e.g. `byoh-pool`).
    pub ns: String,
    /// The hosts, sorted by name.
    pub hosts: Vec<Host>,
    /// Each host's [`snapshot`] after registration, before any claim (same order).
    pub snapshots: Vec<String>,
    /// clusterctl with BYOH's release repository.
    pub clusterctl: Clusterctl,
    /// The phases' durations.
    pub phases: Phases,
    _ca: TestCa,
}

impl CapiBed {
    /// Starts everything, boots `n_hosts` hosts (labels `capi-<i>`), registers them in the
    /// pool — the namespace `pool`, labelled a host pool (ByoHosts Available, host label
    /// `e2e-host=capi`) — and snapshots them.
    ///
    /// Errors when a part fails to start.
    pub async fn start(n_hosts: usize, pool: &str) -> anyhow::Result<CapiBed> {
        let phases = Phases::default();
        phases.begin();
        // Side by side, as none needs another: the management control plane with Cluster API's
        // managers, the registry with the package mirror's packages, and the hosts' boot. Each
        // part is awaited before any error is returned, so a failed one stops the others' parts
        // (their Drop) before the test ends.
        let managers = tokio::task::spawn_blocking(|| -> anyhow::Result<_> {
            let cp = PrivateControlPlane::start()?;
            let capi = CapiManagers::start(cp.kubeconfig())?;
            Ok((cp, capi))
        });
        let served = tokio::task::spawn_blocking(|| -> anyhow::Result<_> {
            Ok((Registry::serve()?, PackageMirror::packages()?))
        });
        let hosts = boot_hosts(n_hosts).await;
        let served = served.await.context("the registry and mirror task")?;
        let managers = managers.await.context("the control plane task")?;
        let (cp, capi) = managers?;
        let (registry, packages) = served?;
        let hosts = hosts?;
        phases.done("side by side: management control plane, Cluster API managers (core, CABPK, KCP), registry, package mirror's packages, hosts booted");
        let admin = cp.client().await?;
        let ca = TestCa::new("BYOH e2e site CA")?;
        let mirror = PackageMirror::serve(packages, &ca).await?;
        let clusterctl = Clusterctl::new()?;
        clusterctl.install_byoh(cp.kubeconfig())?;
        let ns = pool.to_string();
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.clone()),
                labels: Some([(labels::HOST_POOL.to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&kube::api::PostParams::default(), &namespace)
            .await
            .context("the pool's namespace")?;
        let controller = ControllerProcess::start(&admin, cp.kubeconfig(), ns.as_str()).await?;
        phases.done("BYOH installed by clusterctl init, controller started");
        for host in &hosts {
            machine::prepare(
                host,
                &[ca.pem(), registry.ca_pem.clone()],
                &registry.sandbox_image,
            )
            .await?;
        }
        phases.done("package mirror served; hosts prepared (CAs, registry, sandbox image)");
        let (server, ca_data) = as_hosts_reach_it(cp.kubeconfig())?;
        let labeled: Vec<(&Host, &str)> = hosts.iter().map(|h| (h, "capi")).collect();
        pool::register(&admin, ns.as_str(), &server, &ca_data, &labeled).await?;
        let mut snapshots = Vec::new();
        for host in &hosts {
            snapshots.push(snapshot(host).await?);
        }
        phases.done("agent installed from the .deb, hosts registered and snapshotted");
        Ok(CapiBed {
            cp,
            admin,
            capi,
            registry,
            mirror,
            controller,
            ns,
            hosts,
            snapshots,
            clusterctl,
            phases,
            _ca: ca,
        })
    }

    /// The namespaced API of `kind` in group `group`/`version`.
    pub fn api(&self, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.admin.clone(),
            self.ns.as_str(),
            &api_resource(group, version, kind),
        )
    }

    /// The namespaced API of Cluster API core kind `kind` (`cluster.x-k8s.io/v1beta2`).
    pub fn capi(&self, kind: &str) -> Api<DynamicObject> {
        self.api("cluster.x-k8s.io", "v1beta2", kind)
    }

    /// The test host named `name`.
    ///
    /// Errors when there is none.
    pub fn host(&self, name: &str) -> anyhow::Result<&Host> {
        self.hosts
            .iter()
            .find(|h| h.name() == name)
            .with_context(|| format!("no test host {name}"))
    }

    /// The lines in which host `name`'s file tree and unit list differ from its snapshot
    /// before any claim (empty: equal).
    ///
    /// Errors when there is no such host or the snapshot fails.
    pub async fn changes_since_registration(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let i = self
            .hosts
            .iter()
            .position(|h| h.name() == name)
            .with_context(|| format!("no test host {name}"))?;
        let now = snapshot(&self.hosts[i]).await?;
        Ok(crate::agent::snapshot_diff(&self.snapshots[i], &now))
    }

    /// What a failure report needs: journals and containers of the hosts, the managers' and
    /// the controller's logs, `clusterctl describe cluster` of `cluster`.
    pub async fn diagnostics(&self, cluster: &str) -> String {
        let mut out = pool::journals(&self.hosts).await;
        for host in &self.hosts {
            let ps = host
                .exec(&[
                    "sh",
                    "-c",
                    "ctr -n k8s.io containers ls; ctr -n k8s.io tasks ls",
                ])
                .await
                .map(|o| format!("{}{}", o.stdout, o.stderr))
                .unwrap_or_else(|e| e.to_string());
            out.push_str(&format!(
                "\n===== containerd containers and tasks (k8s.io) on {} =====\n{ps}",
                host.name()
            ));
        }
        out.push_str(&self.capi.logs());
        out.push_str("\n===== byoh-controller log (last 150 lines) =====\n");
        out.push_str(&tail(&self.controller.log(), 150));
        out.push_str("\n===== clusterctl describe cluster =====\n");
        out.push_str(&self.describe(cluster).unwrap_or_else(|e| e.to_string()));
        out
    }

    /// `clusterctl describe cluster <cluster> --show-conditions all`.
    ///
    /// Errors when clusterctl cannot run.
    pub fn describe(&self, cluster: &str) -> anyhow::Result<String> {
        let out = self
            .clusterctl
            .command(&[
                "describe",
                "cluster",
                cluster,
                "-n",
                self.ns.as_str(),
                "--show-conditions",
                "all",
            ])
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig())
            .output()?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Boots `n` hosts `capi-<i>` on the test network with containers, in parallel; sorted by name.
async fn boot_hosts(n: usize) -> anyhow::Result<Vec<Host>> {
    let options = BootOptions {
        network: true,
        containers: true,
        ..BootOptions::default()
    };
    let mut boots = tokio::task::JoinSet::new();
    for i in 0..n {
        let options = options.clone();
        boots.spawn(async move { Host::boot_with(&format!("capi-{i}"), &options).await });
    }
    let mut hosts = Vec::new();
    while let Some(h) = boots.join_next().await {
        hosts.push(h??);
    }
    hosts.sort_by(|a, b| a.name().cmp(b.name()));
    Ok(hosts)
}
