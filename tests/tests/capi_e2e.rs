//! Cluster API itself drives BYOH (issue 15): `clusterctl generate cluster` output applied as
//! generated, reconciled by Cluster API's own managers (core, kubeadm bootstrap CABPK, kubeadm
//! control plane KCP, built from the Go module proxy and run by `tests/capi/up`), on hosts that
//! run the packaged agent. KCP's first control-plane Machine takes a BYOH host, whose agent runs
//! CABPK's `kubeadm init` cloud-config; the workload API server answers at the cluster's
//! `CONTROL_PLANE_ENDPOINT_IP:6443`; the MachineDeployment's worker joins with CABPK's join data.
//! Every step is asserted on what Cluster API reports.
//!
//! The site (docs/e2e.md): a management control plane of the test's own; three hosts on the
//! test network (`tests/hosts/boot --network --containers`: an address and ports of their own,
//! runc for static pods), prepared as a site prepares its machines ([`machine::prepare`]: the
//! site's CA trusted, IPv4 forwarding, containerd's sandbox image from the site's registry, a
//! bridge CNI configuration); the control-plane images built from the pinned sources and served by a real
//! registry (`tests/images/serve`, the cluster's `IMAGE_REPOSITORY`); Kubernetes packages built
//! from the same binaries in a signed apt repository (the cluster's `BYOH_APT_REPOSITORY`,
//! `BYOH_APT_KEY_URL`). Declared stand-in: kube-vip's image is not available here, so the test
//! adds `CONTROL_PLANE_ENDPOINT_IP` to the first control-plane host's interface when that host
//! is claimed, as kube-vip would; the rendered kube-vip manifest is checked to parse as a Pod.
//! Declared test-bed adaptations for this machine (cgroup v1, no `CAP_SYS_RESOURCE`): kubeadm's
//! `SystemVerification` preflight check is added to the generated `ignorePreflightErrors`
//! ([`skip_system_verification`]), and `tests/hosts/prepare-kubelet` gives the kubelet
//! `--fail-cgroupv1=false` and wraps runc to drop negative `oom_score_adj` values.
//!
//! Asserted: KCP's control-plane Machine gets a ByoHost; the workload API server answers at the
//! endpoint with the cluster's version (kubeconfig Secret written by KCP); both Nodes Ready;
//! every Machine has a nodeRef whose Node's providerID is its ByoMachine's; the Cluster's
//! `Available`, `ControlPlaneAvailable` and `WorkersAvailable` conditions True; two ByoHosts
//! `Provisioned`.
//!
//! A failing step prints the managers' and the controller's logs, the agents' and kubelets'
//! journals and the objects' states. Each phase's duration is printed at the end.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::access;

use anyhow::{Context as _, ensure};
use byoh_api::{ByoHost, ByoMachine};
use byoh_tests::agent::{repo_root, wait_for};
use byoh_tests::apt_repo::{self, GpgKey};
use byoh_tests::control_plane::{PrivateControlPlane, TestNamespace};
use byoh_tests::controller::ControllerProcess;
use byoh_tests::hosts::{self, BootOptions, Host, NETWORK_GATEWAY};
use byoh_tests::http::{FileServer, TestCa};
use byoh_tests::phases::Phases;
use byoh_tests::{kubeadm, machine, pool};
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The Kubernetes version of the cluster: the test bed's.
const KUBERNETES_VERSION: &str = "v1.36.3";
/// The Debian version of its packages in the test repository.
const PACKAGE_VERSION: &str = "1.36.3-1.1";
/// The cluster's control-plane endpoint, in the test network's free range `198.18.0.200-254`
/// (one per test process, so that runs of other worktrees on the same bridge do not collide).
fn endpoint_ip() -> String {
    format!("198.18.0.{}", 200 + std::process::id() % 55)
}
/// The name of the cluster.
const CLUSTER: &str = "capi-e2e";

/// Runs a script of the test bed; its stdout, or an error with its stderr.
fn script(path: &str, args: &[&str]) -> anyhow::Result<String> {
    let full = repo_root().join(path);
    let out = Command::new(&full)
        .args(args)
        .output()
        .with_context(|| format!("running {}", full.display()))?;
    ensure!(
        out.status.success(),
        "{path} {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// clusterctl, built by `tests/capi/build` (which prints its bin directory last).
fn clusterctl_bin() -> anyhow::Result<PathBuf> {
    let out = script("tests/capi/build", &["clusterctl"])?;
    Ok(PathBuf::from(out.lines().last().unwrap_or_default().trim()).join("clusterctl"))
}

/// The images' registry as `tests/images/serve` reports it, seen from the hosts.
struct Registry {
    /// kubeadm's `imageRepository`, e.g. `198.18.0.1:5443/k8s`.
    image_repository: String,
    /// containerd's CRI `sandbox_image` (the registry's pause image).
    sandbox_image: String,
    /// The registry's CA certificate, PEM.
    ca_pem: String,
}

impl Registry {
    fn serve() -> anyhow::Result<Registry> {
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
struct CapiManagers {
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl CapiManagers {
    fn start(kubeconfig: &Path) -> anyhow::Result<CapiManagers> {
        let out = script("tests/capi/up", &[&kubeconfig.to_string_lossy()])?;
        let dir = PathBuf::from(out.lines().last().unwrap_or_default().trim());
        Ok(CapiManagers {
            kubeconfig: kubeconfig.to_path_buf(),
            dir,
        })
    }

    /// The last lines of every manager's log.
    fn logs(&self) -> String {
        let mut out = String::new();
        let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) else {
            return out;
        };
        for e in entries.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            out.push_str(&format!(
                "\n===== {} (last 60 lines) =====\n",
                e.path().display()
            ));
            for l in tail.iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for CapiManagers {
    fn drop(&mut self) {
        let _ = script("tests/capi/down", &[&self.kubeconfig.to_string_lossy()]);
    }
}

/// The Kubernetes packages in a signed apt repository, the key over HTTPS.
struct PackageMirror {
    repo: FileServer,
    keys: FileServer,
    _key: GpgKey,
}

impl PackageMirror {
    async fn start(ca: &TestCa) -> anyhow::Result<PackageMirror> {
        let artifacts = kubeadm::stage_artifacts()?;
        let packages = apt_repo::kubernetes(
            PACKAGE_VERSION,
            &artifacts,
            &artifacts.join("cni-plugins.tgz"),
        )?;
        let mut files = apt_repo::flat_repository(&packages)?;
        let key = GpgKey::generate("BYOH e2e mirror <mirror@byoh.invalid>")?;
        let signed = key.clearsign(apt_repo::release_of(&files)?)?;
        files.push(("/InRelease".into(), signed));
        let repo = FileServer::start(files).await?;
        let keys =
            FileServer::start_tls(vec![("/Release.key".into(), key.armored_public_key()?)], ca)
                .await?;
        Ok(PackageMirror {
            repo,
            keys,
            _key: key,
        })
    }
}

/// Everything the test runs on.
struct Site {
    cp: PrivateControlPlane,
    admin: Client,
    capi: CapiManagers,
    registry: Registry,
    mirror: PackageMirror,
    controller: ControllerProcess,
    ns: TestNamespace,
    hosts: Vec<Host>,
    phases: Phases,
    _ca: TestCa,
}

fn ar(group: &str, version: &str, kind: &str) -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(group, version, kind))
}

impl Site {
    async fn start(n_hosts: usize) -> anyhow::Result<Site> {
        let phases = Phases::default();
        phases.begin();
        let cp = PrivateControlPlane::start()?;
        let admin = cp.client().await?;
        phases.done("management control plane up");
        let capi = CapiManagers::start(cp.kubeconfig())?;
        phases.done("Cluster API managers up (core, CABPK, KCP)");
        let registry = Registry::serve()?;
        let ca = TestCa::new("BYOH e2e site CA")?;
        let mirror = PackageMirror::start(&ca).await?;
        phases.done("images served, package mirror built and served");
        access::apply_yaml(&admin, &access::components_text()?, false).await?;
        let ns = TestNamespace::create(&admin, "capi-e2e").await?;
        let controller = ControllerProcess::start(&admin, cp.kubeconfig(), ns.name()).await?;
        phases.done("BYOH components + controller started");
        let options = BootOptions {
            network: true,
            containers: true,
            ..BootOptions::default()
        };
        let mut boots = tokio::task::JoinSet::new();
        for i in 0..n_hosts {
            let options = options.clone();
            boots.spawn(async move { Host::boot_with(&format!("capi-{i}"), &options).await });
        }
        let mut hosts = Vec::new();
        while let Some(h) = boots.join_next().await {
            hosts.push(h??);
        }
        hosts.sort_by(|a, b| a.name().cmp(b.name()));
        for host in &hosts {
            machine::prepare(
                host,
                &[ca.pem(), registry.ca_pem.clone()],
                &registry.sandbox_image,
            )
            .await?;
        }
        phases.done("hosts booted on the test network and prepared");
        let kc = kube::config::Kubeconfig::read_from(cp.kubeconfig())?;
        let cluster = kc.clusters[0].cluster.clone().context("no cluster")?;
        let server = cluster
            .server
            .as_deref()
            .context("no server")?
            .replace("127.0.0.1", &NETWORK_GATEWAY.to_string());
        let labeled: Vec<(&Host, &str)> = hosts.iter().map(|h| (h, "capi")).collect();
        pool::register(
            &admin,
            ns.name(),
            &server,
            cluster
                .certificate_authority_data
                .as_deref()
                .context("no CA")?,
            &labeled,
        )
        .await?;
        phases.done("agent installed from the .deb, hosts registered");
        Ok(Site {
            cp,
            admin,
            capi,
            registry,
            mirror,
            controller,
            ns,
            hosts,
            phases,
            _ca: ca,
        })
    }

    fn api(&self, group: &str, version: &str, kind: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.admin.clone(),
            self.ns.name(),
            &ar(group, version, kind),
        )
    }

    fn capi(&self, kind: &str) -> Api<DynamicObject> {
        self.api("cluster.x-k8s.io", "v1beta2", kind)
    }

    fn host(&self, name: &str) -> anyhow::Result<&Host> {
        self.hosts
            .iter()
            .find(|h| h.name() == name)
            .with_context(|| format!("no test host {name}"))
    }

    /// `clusterctl generate cluster` of BYOH's templates (a local clusterctl repository of
    /// controller/config) with the site's variables.
    fn generate_cluster(&self, flavor: Option<&str>) -> anyhow::Result<String> {
        let tmp = tempfile::tempdir()?;
        let version = format!("v{}", env!("CARGO_PKG_VERSION"));
        let repo = tmp.path().join(format!("infrastructure-byoh/{version}"));
        std::fs::create_dir_all(&repo)?;
        let config = repo_root().join("controller/config");
        for f in ["infrastructure-components.yaml", "metadata.yaml"] {
            std::fs::copy(config.join(f), repo.join(f))?;
        }
        for e in std::fs::read_dir(config.join("templates"))? {
            let e = e?;
            std::fs::copy(e.path(), repo.join(e.file_name()))?;
        }
        let cfg = tmp.path().join("clusterctl.yaml");
        std::fs::write(
            &cfg,
            format!(
                "providers:\n- name: byoh\n  type: InfrastructureProvider\n  url: file://{}/infrastructure-components.yaml\n",
                repo.display()
            ),
        )?;
        let clusterctl = clusterctl_bin()?;
        let infra = format!("byoh:{version}");
        let mut args = vec![
            "generate",
            "cluster",
            CLUSTER,
            "--infrastructure",
            &infra,
            "--kubernetes-version",
            KUBERNETES_VERSION,
            "--control-plane-machine-count",
            "1",
            "--worker-machine-count",
            "1",
            "--target-namespace",
            self.ns.name(),
            "--config",
        ];
        let cfg_s = cfg.to_string_lossy().into_owned();
        args.push(&cfg_s);
        if let Some(f) = flavor {
            args.extend(["--flavor", f]);
        }
        let out = Command::new(&clusterctl)
            .args(&args)
            .env("HOME", tmp.path())
            .env("XDG_CONFIG_HOME", tmp.path().join(".config"))
            .env("KUBECONFIG", tmp.path().join("no-kubeconfig"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env_remove("BYOH_WATCH_NAMESPACE")
            .env("CONTROL_PLANE_ENDPOINT_IP", endpoint_ip())
            .env("IMAGE_REPOSITORY", &self.registry.image_repository)
            .env(
                "BYOH_APT_REPOSITORY",
                format!("{}/", self.mirror.repo.base_on_network()),
            )
            .env(
                "BYOH_APT_KEY_URL",
                format!("{}/Release.key", self.mirror.keys.base_on_network()),
            )
            .output()?;
        ensure!(
            out.status.success(),
            "clusterctl generate cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// The workload cluster's admin client, from the `<cluster>-kubeconfig` Secret KCP wrote, and
    /// the server URL of that kubeconfig.
    async fn workload(&self) -> anyhow::Result<(Client, String)> {
        let secrets: Api<Secret> = Api::namespaced(self.admin.clone(), self.ns.name());
        let s = secrets.get(&format!("{CLUSTER}-kubeconfig")).await?;
        let data = s
            .data
            .and_then(|d| d.get("value").map(|b| b.0.clone()))
            .context("no kubeconfig in the Secret")?;
        let kc = kube::config::Kubeconfig::from_yaml(&String::from_utf8(data)?)?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        let server = config.cluster_url.to_string();
        Ok((Client::try_from(config)?, server))
    }

    /// The host a Machine's ByoMachine claimed, once it has.
    async fn host_of(&self, machine: &DynamicObject) -> anyhow::Result<Option<String>> {
        let Some(infra) = machine.data["spec"]["infrastructureRef"]["name"].as_str() else {
            return Ok(None);
        };
        let bms: Api<ByoMachine> = Api::namespaced(self.admin.clone(), self.ns.name());
        Ok(bms
            .get_opt(infra)
            .await?
            .and_then(|m| m.status.and_then(|s| s.host_ref))
            .map(|r| r.name))
    }

    /// Machines of the cluster with `label` (e.g. the control-plane label) present or absent.
    async fn machines(&self, control_plane: bool) -> anyhow::Result<Vec<DynamicObject>> {
        let lp = ListParams::default().labels(&format!(
            "cluster.x-k8s.io/cluster-name={CLUSTER},{}cluster.x-k8s.io/control-plane",
            if control_plane { "" } else { "!" }
        ));
        Ok(self.capi("Machine").list(&lp).await?.items)
    }

    /// What a failure report needs.
    async fn diagnostics(&self) -> String {
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
        let log = self.controller.log();
        let tail: Vec<&str> = log.lines().rev().take(150).collect();
        out.push_str("\n===== byoh-controller log (last 150 lines) =====\n");
        for l in tail.iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("\n===== clusterctl describe cluster =====\n");
        out.push_str(&self.describe().unwrap_or_else(|e| e.to_string()));
        out
    }

    /// `clusterctl describe cluster` of the cluster.
    fn describe(&self) -> anyhow::Result<String> {
        let clusterctl = clusterctl_bin()?;
        let tmp = tempfile::tempdir()?;
        let out = Command::new(clusterctl)
            .args([
                "describe",
                "cluster",
                CLUSTER,
                "-n",
                self.ns.name(),
                "--show-conditions",
                "all",
            ])
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig())
            .env("HOME", tmp.path())
            .output()?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether condition `type_` of a Cluster API object's v1beta2 `status.conditions` is True.
fn condition_true(obj: &DynamicObject, type_: &str) -> bool {
    obj.data["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

/// Whether a Node reports Ready=True.
fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The one change the test bed makes to the generated cluster: kubeadm's `SystemVerification`
/// preflight check is skipped (next to the template's own `Swap`), because this machine's cgroup
/// hierarchy is v1 and kubeadm v1.36 refuses it (the kubelet is told `--fail-cgroupv1=false` by
/// `tests/hosts/prepare-kubelet`). A VM with cgroup v2 needs neither (docs/e2e.md).
fn skip_system_verification(yaml: &str) -> anyhow::Result<String> {
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
    // KCP's init and join configurations, the workers' KubeadmConfigTemplate.
    ensure!(
        n == 3,
        "{n} ignorePreflightErrors lists with Swap in:\n{yaml}"
    );
    Ok(out)
}

/// Applies the generated cluster and follows it until Cluster API reports it Available.
async fn create(site: &Site) -> anyhow::Result<()> {
    let yaml = site.generate_cluster(None)?;
    ensure!(!yaml.contains("${"), "unsubstituted variable in:\n{yaml}");
    let yaml = skip_system_verification(&yaml)?;
    access::apply_yaml(&site.admin, &yaml, false).await?;
    site.phases
        .done("cluster generated and applied as generated");

    // KCP creates the first control-plane Machine; our controller gives it a host.
    let cp_machine = wait_for(
        "KCP's control-plane Machine to get a host",
        Duration::from_secs(180),
        || async {
            for m in site.machines(true).await? {
                if let Some(host) = site.host_of(&m).await? {
                    return Ok(Some((m, host)));
                }
            }
            Ok(None)
        },
    )
    .await?;
    let (cp_machine, cp_host_name) = cp_machine;
    let cp_host = site.host(&cp_host_name)?;
    // Stand-in for kube-vip (its image is not available here): the endpoint address on the
    // claimed host's interface, as kube-vip's ARP mode puts it there.
    cp_host
        .run(&[
            "ip",
            "addr",
            "add",
            &format!("{}/32", endpoint_ip()),
            "dev",
            "host0",
        ])
        .await?;
    site.phases.done(&format!(
        "control-plane Machine {} claimed {cp_host_name}",
        cp_machine.name_any()
    ));

    // CABPK's init data runs on the host: the workload API server answers at the endpoint.
    let workload = wait_for(
        "the workload API server at the control-plane endpoint",
        Duration::from_secs(600),
        || async {
            let Ok((client, server)) = site.workload().await else {
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
    let (workload, server, version) = workload;
    let want = format!("https://{}:6443", endpoint_ip());
    ensure!(
        server.trim_end_matches('/') == want,
        "the workload kubeconfig's server is {server}, not the endpoint {want}"
    );
    ensure!(
        version.git_version == KUBERNETES_VERSION,
        "the workload API server is {}, not {KUBERNETES_VERSION}",
        version.git_version
    );
    site.phases
        .done("kubeadm init on the host: workload API server answers");
    let manifest = cp_host
        .read_to_string("/etc/kubernetes/manifests/kube-vip.yaml")
        .await?;
    let pod: Pod = serde_yaml_ng::from_str(&manifest).context("kube-vip manifest as a Pod")?;
    ensure!(
        pod.name_any() == "kube-vip",
        "kube-vip manifest: {manifest}"
    );

    // Every Machine gets its Node, Ready, with the ByoMachine's providerID.
    let nodes: Api<Node> = Api::all(workload.clone());
    wait_for(
        "2 Nodes Ready (control plane and worker)",
        Duration::from_secs(600),
        || async {
            let list = nodes.list(&ListParams::default()).await?.items;
            Ok((list.len() == 2 && list.iter().all(node_ready)).then_some(()))
        },
    )
    .await?;
    site.phases.done("worker joined: both Nodes Ready");
    let bms: Api<ByoMachine> = Api::namespaced(site.admin.clone(), site.ns.name());
    for m in site
        .machines(true)
        .await?
        .into_iter()
        .chain(site.machines(false).await?)
    {
        let node_name = wait_for(
            &format!("Machine {} status.nodeRef", m.name_any()),
            Duration::from_secs(180),
            || async {
                let m = site.capi("Machine").get(&m.name_any()).await?;
                Ok(m.data["status"]["nodeRef"]["name"]
                    .as_str()
                    .map(str::to_string))
            },
        )
        .await?;
        let infra = m.data["spec"]["infrastructureRef"]["name"]
            .as_str()
            .context("no infrastructureRef")?;
        let bm = bms.get(infra).await?;
        let node = nodes.get(&node_name).await?;
        let node_pid = node.spec.and_then(|s| s.provider_id);
        ensure!(
            node_pid.is_some() && node_pid == bm.spec.provider_id,
            "Node {node_name} providerID {node_pid:?} != ByoMachine {infra}'s {:?}",
            bm.spec.provider_id
        );
    }

    // What Cluster API reports: the Cluster's v1beta2 conditions.
    let clusters = site.capi("Cluster");
    wait_for(
        "Cluster Available, ControlPlaneAvailable, WorkersAvailable",
        Duration::from_secs(300),
        || async {
            let c = clusters.get(CLUSTER).await?;
            Ok(["Available", "ControlPlaneAvailable", "WorkersAvailable"]
                .iter()
                .all(|t| condition_true(&c, t))
                .then_some(()))
        },
    )
    .await?;
    site.phases
        .done("Cluster Available (Cluster API's conditions)");
    eprintln!("{}", site.describe()?);
    let hosts: Api<ByoHost> = Api::namespaced(site.admin.clone(), site.ns.name());
    let provisioned = hosts
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|h| h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Provisioned"))
        .count();
    ensure!(
        provisioned == 2,
        "{provisioned} ByoHosts Provisioned, want 2"
    );
    Ok(())
}

#[test]
fn system_verification_is_skipped_next_to_swap_in_each_list() {
    let yaml = "a:\n  ignorePreflightErrors:\n  - Swap\n  - X\nb:\n    ignorePreflightErrors:\n    - Swap\nc:\n      - Swap\n";
    let out = skip_system_verification(yaml).unwrap();
    assert_eq!(
        out,
        "a:\n  ignorePreflightErrors:\n  - Swap\n  - SystemVerification\n  - X\nb:\n    ignorePreflightErrors:\n    - Swap\n    - SystemVerification\nc:\n      - Swap\n      - SystemVerification\n"
    );
    assert!(skip_system_verification("a:\n  - Swap\n").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_api_makes_a_cluster_with_a_control_plane_on_byoh_hosts() {
    if !hosts::available() {
        return;
    }
    let site = Site::start(3).await.unwrap();
    let result = create(&site).await;
    if let Err(e) = &result {
        eprintln!("{}", site.diagnostics().await);
        panic!("{e:#}");
    }
    eprintln!("{}", site.phases.table());
    for h in site.hosts {
        let _ = h.stop().await;
    }
}
