//! Cluster API's own managers drive BYOH (issue 15, first step): core, the kubeadm bootstrap
//! provider (CABPK) and the kubeadm control plane provider (KCP) v1.14.2, built from the Go
//! module proxy (`tests/capi/build`) and run as processes by `tests/capi/up` with their own
//! CRDs, RBAC (ServiceAccount tokens) and webhooks, act on the objects of
//! `clusterctl generate cluster` — BYOH's release templates, default flavor, applied as
//! generated but for the host modules a user adds to the control plane's KubeadmConfig
//! (`bootCommands`, `users`, `ntp`, `mounts`: CABPK renders them, the agent must accept them) — with `byoh-controller` running as a process under its generated RBAC.
//!
//! Asserted on what Cluster API reports: the Cluster's infrastructure is provisioned from our
//! ByoCluster (endpoint copied); KCP creates the first control-plane Machine with its
//! KubeadmConfig and a ByoMachine cloned from our ByoMachineTemplate; CABPK renders the
//! bootstrap data Secret named by `spec.bootstrap.dataSecretName`, a cloud-config running
//! `kubeadm init`, which our agent's own cloud-config validation accepts; our controller claims
//! a registered ByoHost for that Machine; the worker Machine of the MachineDeployment waits
//! for the control plane. Running `kubeadm init` on a host is not part of this test.
//!
//! It uses a control plane of its own (the managers reconcile and validate every Cluster API
//! object of the API server they run against; the shared one holds other tests' objects written
//! "as CAPI leaves them"). Skips when the test bed is absent (no `BYOH_TEST_KUBECONFIG`) outside
//! `make test`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::access;
use byoh_tests::objects;

use anyhow::{Context as _, ensure};
use byoh_api::{ByoHost, ByoMachine};
use byoh_tests::agent::{repo_root, wait_for};
use byoh_tests::capi_bed::{Clusterctl, last_line, run};
use byoh_tests::control_plane::{self, PrivateControlPlane, TestNamespace};
use byoh_tests::controller::ControllerProcess;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::Value;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CLUSTER: &str = "capi1";
const ENDPOINT: &str = "192.0.2.10";
const K8S_VERSION: &str = "v1.36.3";
const HOST: &str = "capi-host-0";

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "capi_managers: {msg}");
}

/// The KubeadmConfig fields CABPK renders into cloud-init modules (`bootCommands` → `bootcmd`,
/// `users`, `ntp`, `mounts`; issue 16 B.5), added to the generated KubeadmControlPlane's
/// `kubeadmConfigSpec` as a user would, so CABPK itself renders them for the agent.
const HOST_MODULES: &str = "bootCommands:
- echo byoh-bootcmd > /run/byoh-bootcmd
users:
- name: capi-admin
  sshAuthorizedKeys:
  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIByohTestKeyByohTestKeyByohTestKeyByohTe capi-admin
  sudo: ALL=(ALL) NOPASSWD:ALL
ntp:
  enabled: true
  servers:
  - 198.18.0.1
mounts:
- - tmpfs
  - /mnt/byoh-scratch
  - tmpfs
";

/// `generated` with [`HOST_MODULES`] under the KubeadmControlPlane's `kubeadmConfigSpec:`
/// (indented as that key's other children).
fn with_host_modules(generated: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut done = false;
    let mut lines = generated.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        if !done && line.trim_end() == "  kubeadmConfigSpec:" {
            let indent: String = lines
                .peek()
                .map(|l| l.chars().take_while(|c| *c == ' ').collect())
                .unwrap_or_default();
            for m in HOST_MODULES.lines() {
                out.push_str(&format!("{indent}{m}\n"));
            }
            done = true;
        }
    }
    ensure!(
        done,
        "no KubeadmControlPlane kubeadmConfigSpec in:\n{generated}"
    );
    Ok(out)
}

fn dynamic(client: &Client, ns: &str, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1beta2", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

/// The v1beta2 condition `type_` of an object's status (JSON).
fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn json(obj: &DynamicObject) -> Value {
    serde_json::to_value(obj).unwrap_or_default()
}

/// The owner reference of `kind`, if any.
fn owner<'a>(obj: &'a Value, kind: &str) -> Option<&'a Value> {
    obj["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["kind"] == kind)
}

/// Everything the test runs on; dropping it stops the control plane (and with it, through
/// `tests/control-plane/down`, the managers).
struct Bed {
    cp: PrivateControlPlane,
    admin: Client,
    ns: TestNamespace,
    controller: ControllerProcess,
    capi_dir: PathBuf,
    clusterctl: Clusterctl,
}

impl Bed {
    async fn start() -> anyhow::Result<Self> {
        let t = Instant::now();
        let cp = PrivateControlPlane::start()?;
        let admin = cp.client().await?;
        say(&format!(
            "control plane up ({:.1} s)",
            t.elapsed().as_secs_f64()
        ));
        let up = repo_root().join("tests/capi/up");
        let capi_dir = last_line(&run(Command::new(&up).arg(cp.kubeconfig()))?);
        say(&format!(
            "Cluster API managers up in {} ({:.1} s)",
            capi_dir.display(),
            t.elapsed().as_secs_f64()
        ));
        let clusterctl = Clusterctl::new()?;
        // BYOH as `clusterctl init --infrastructure byoh` installs it from the repository.
        clusterctl.install_byoh(cp.kubeconfig())?;
        let ns = TestNamespace::create(&admin, "capi-managers").await?;
        let controller = ControllerProcess::start(&admin, cp.kubeconfig(), ns.name()).await?;
        say(&format!(
            "BYOH installed by clusterctl init, controller started ({:.1} s)",
            t.elapsed().as_secs_f64()
        ));
        Ok(Self {
            cp,
            admin,
            ns,
            controller,
            capi_dir,
            clusterctl,
        })
    }

    fn api(&self, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
        dynamic(&self.admin, self.ns.name(), group, kind, plural)
    }

    fn clusters(&self) -> Api<DynamicObject> {
        self.api("cluster.x-k8s.io", "Cluster", "clusters")
    }

    fn machines(&self) -> Api<DynamicObject> {
        self.api("cluster.x-k8s.io", "Machine", "machines")
    }

    fn kubeadm_configs(&self) -> Api<DynamicObject> {
        self.api(
            "bootstrap.cluster.x-k8s.io",
            "KubeadmConfig",
            "kubeadmconfigs",
        )
    }

    /// Logs of the managers and of our controller, and the objects, for a failure report.
    fn diagnostics(&self) -> String {
        let mut s = String::new();
        for name in ["core", "bootstrap", "controlplane"] {
            let log = std::fs::read_to_string(self.capi_dir.join(format!("logs/{name}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            s.push_str(&format!("----- {name} manager (last 40 lines) -----\n"));
            for l in tail.into_iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        s.push_str("----- byoh-controller -----\n");
        s.push_str(&self.controller.log());
        if let Ok(k8s_bin) = run(&mut Command::new(
            repo_root().join("tests/control-plane/build"),
        )) {
            let kubectl = PathBuf::from(k8s_bin.lines().next().unwrap_or_default()).join("kubectl");
            let objects = Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(self.cp.kubeconfig())
                .args([
                    "get",
                    "-n",
                    self.ns.name(),
                    "clusters,kubeadmcontrolplanes,machinedeployments,machinesets,machines,kubeadmconfigs,byoclusters,byomachines,byohosts,secrets",
                    "-o",
                    "yaml",
                ])
                .output();
            if let Ok(o) = objects {
                s.push_str("----- objects -----\n");
                s.push_str(&String::from_utf8_lossy(&o.stdout));
                s.push_str(&String::from_utf8_lossy(&o.stderr));
            }
        }
        s
    }
}

async fn scenario(bed: &Bed) -> anyhow::Result<()> {
    let t = Instant::now();
    let ns = bed.ns.name();

    // A host registered in the pool, as the agent leaves it (ByoHost Available + Lease).
    objects::create_host(&bed.admin, ns, HOST, &objects::HostOpts::default()).await;

    // `clusterctl generate cluster` of the release's default template, applied as generated.
    let generated = run(bed
        .clusterctl
        .command(&[
            "generate",
            "cluster",
            CLUSTER,
            "--infrastructure",
            &Clusterctl::infrastructure(),
            "--kubernetes-version",
            K8S_VERSION,
            "--control-plane-machine-count",
            "1",
            "--worker-machine-count",
            "1",
            "--target-namespace",
            ns,
        ])
        .env("CONTROL_PLANE_ENDPOINT_IP", ENDPOINT))?;
    let generated = with_host_modules(&generated)?;
    access::apply_yaml(&bed.admin, &generated, false)
        .await
        .context("applying the output of clusterctl generate cluster")?;
    say(&format!(
        "cluster applied ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));

    // Core: the Cluster's infrastructure is provisioned from our ByoCluster, whose endpoint
    // Cluster API copies into the Cluster.
    let clusters = bed.clusters();
    let cluster = wait_for(
        "Cluster status.initialization.infrastructureProvisioned",
        Duration::from_secs(60),
        || async {
            let c = json(&clusters.get(CLUSTER).await?);
            Ok((c["status"]["initialization"]["infrastructureProvisioned"] == true).then_some(c))
        },
    )
    .await?;
    ensure!(
        cluster["spec"]["controlPlaneEndpoint"]["host"] == ENDPOINT
            && cluster["spec"]["controlPlaneEndpoint"]["port"] == 6443,
        "the Cluster's controlPlaneEndpoint is not the ByoCluster's: {}",
        cluster["spec"]["controlPlaneEndpoint"]
    );
    let infra_ready = condition(&cluster, "InfrastructureReady")
        .context("the Cluster has no InfrastructureReady condition")?;
    ensure!(
        infra_ready["status"] == "True",
        "Cluster InfrastructureReady: {infra_ready}"
    );
    say(&format!(
        "Cluster infrastructure provisioned from the ByoCluster ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));

    // KCP: the first control-plane Machine, with its KubeadmConfig and a ByoMachine cloned
    // from our ByoMachineTemplate; CABPK: its bootstrap data Secret.
    let machines = bed.machines();
    let cp_machine = wait_for(
        "KCP's first control-plane Machine with spec.bootstrap.dataSecretName",
        Duration::from_secs(120),
        || async {
            let list = machines.list(&Default::default()).await?;
            Ok(list.items.iter().map(json).find(|m| {
                m["metadata"]["labels"]
                    .get("cluster.x-k8s.io/control-plane")
                    .is_some()
                    && m["spec"]["bootstrap"]["dataSecretName"].is_string()
            }))
        },
    )
    .await?;
    let machine_name = cp_machine["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let kcp_owner = owner(&cp_machine, "KubeadmControlPlane")
        .context("the control-plane Machine has no KubeadmControlPlane owner")?;
    ensure!(kcp_owner["name"] == format!("{CLUSTER}-control-plane"));
    ensure!(cp_machine["spec"]["version"] == K8S_VERSION);
    let infra_ref = &cp_machine["spec"]["infrastructureRef"];
    ensure!(
        infra_ref["kind"] == "ByoMachine"
            && infra_ref["apiGroup"] == "infrastructure.cluster.x-k8s.io",
        "the Machine's infrastructureRef is not a ByoMachine: {infra_ref}"
    );
    let bm_name = infra_ref["name"].as_str().unwrap_or_default().to_string();
    let byomachines: Api<ByoMachine> = Api::namespaced(bed.admin.clone(), ns);
    let bm = byomachines.get(&bm_name).await?;
    let bm_json = serde_json::to_value(&bm)?;
    ensure!(
        owner(&bm_json, "Machine").is_some_and(|o| o["name"] == machine_name.as_str()),
        "ByoMachine {bm_name} is not owned by Machine {machine_name}"
    );
    ensure!(
        bm.annotations()
            .get("cluster.x-k8s.io/cloned-from-name")
            .map(String::as_str)
            == Some(&format!("{CLUSTER}-control-plane")),
        "ByoMachine {bm_name} was not cloned from ByoMachineTemplate {CLUSTER}-control-plane: {:?}",
        bm.annotations()
    );
    ensure!(
        bm.spec.installer_ref.as_ref().map(|r| r.name.as_str()) == Some(CLUSTER),
        "the template's installerRef did not reach the ByoMachine: {:?}",
        bm.spec.installer_ref
    );
    let config_ref = &cp_machine["spec"]["bootstrap"]["configRef"];
    ensure!(
        config_ref["kind"] == "KubeadmConfig",
        "bootstrap configRef: {config_ref}"
    );
    let kc = json(
        &bed.kubeadm_configs()
            .get(config_ref["name"].as_str().unwrap_or_default())
            .await?,
    );
    ensure!(
        owner(&kc, "Machine").is_some_and(|o| o["name"] == machine_name.as_str()),
        "the KubeadmConfig is not owned by the Machine"
    );
    ensure!(
        kc["spec"]["initConfiguration"].is_object(),
        "the first control-plane KubeadmConfig has no initConfiguration: {}",
        kc["spec"]
    );
    say(&format!(
        "KCP created Machine {machine_name}, ByoMachine {bm_name}, KubeadmConfig ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));

    let secret_name = cp_machine["spec"]["bootstrap"]["dataSecretName"]
        .as_str()
        .unwrap_or_default();
    let secret = Api::<Secret>::namespaced(bed.admin.clone(), ns)
        .get(secret_name)
        .await?;
    ensure!(
        secret.type_.as_deref() == Some("cluster.x-k8s.io/secret"),
        "bootstrap Secret type {:?}",
        secret.type_
    );
    let data = secret.data.clone().unwrap_or_default();
    let value = String::from_utf8(data.get("value").context("no `value` key")?.0.clone())?;
    let format = data
        .get("format")
        .map(|f| String::from_utf8_lossy(&f.0).into_owned());
    ensure!(
        format.as_deref() == Some("cloud-config"),
        "bootstrap data format {format:?}"
    );
    ensure!(
        value.contains("kubeadm init"),
        "no `kubeadm init` in:\n{value}"
    );

    // The real CABPK output passes our agent's own cloud-config parsing and validation, for
    // the host that will run it (Jinja instance data expanded to its name).
    byoh_agent::cloudinit::check_format(format.as_deref())?;
    let instance = byoh_agent::cloudinit::InstanceData::new(HOST, None);
    let doc = byoh_agent::cloudinit::parse(&value, &instance).map_err(|e| {
        anyhow::anyhow!("the agent cannot parse CABPK's cloud-config: {e}\n{value}")
    })?;
    let plan = byoh_agent::cloudinit::validate(
        &doc,
        &byoh_agent::cloudinit::ValidateOptions {
            root: Path::new("/"),
            host_name: HOST,
            ignore_modules: &[],
        },
    )
    .map_err(|e| anyhow::anyhow!("the agent refuses CABPK's cloud-config: {e}\n{value}"))?;
    let described = byoh_agent::cloudinit::cli::describe(&plan, HOST, Path::new(secret_name));
    for want in [
        "/run/kubeadm/kubeadm.yaml",
        "/etc/kubernetes/pki/ca.crt",
        "/etc/kubernetes/manifests/kube-vip.yaml",
        "kubeadm init",
        "/run/cluster-api/bootstrap-success.complete",
        // CABPK's own rendering of the KubeadmConfig's host modules (issue 16 B.5).
        "byoh-bootcmd",
        "capi-admin",
        "/mnt/byoh-scratch",
        "with 1 servers",
    ] {
        ensure!(
            described.contains(want),
            "the agent's plan for CABPK's cloud-config lacks {want}:\n{described}"
        );
    }
    say(&format!(
        "CABPK rendered {secret_name} (kubeadm init); the agent's validation accepts it ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));

    // Our controller claims the registered host for that Machine.
    let hosts: Api<ByoHost> = Api::namespaced(bed.admin.clone(), ns);
    let host = wait_for(
        "the ByoHost to be claimed for the control-plane ByoMachine",
        Duration::from_secs(60),
        || async {
            let h = hosts.get(HOST).await?;
            Ok(h.spec.claim.is_some().then_some(h))
        },
    )
    .await?;
    let claim = host.spec.claim.as_ref().context("no claim")?;
    ensure!(
        claim.machine_ref.name == bm_name && Some(claim.machine_ref.uid.clone()) == bm.uid(),
        "host claimed for {:?}, not for ByoMachine {bm_name}",
        claim.machine_ref
    );
    ensure!(claim.bootstrap_secret_ref.name == secret_name);
    ensure!(claim.cluster_name == CLUSTER);
    say(&format!(
        "byoh-controller claimed {HOST} for {bm_name} ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));

    // The worker Machine of the MachineDeployment waits for the control plane: CABPK renders
    // no join data yet, and our ByoMachine for it claims nothing.
    let worker = wait_for(
        "the MachineDeployment's worker Machine",
        Duration::from_secs(60),
        || async {
            let list = machines.list(&Default::default()).await?;
            Ok(list.items.iter().map(json).find(|m| {
                m["metadata"]["labels"]
                    .get("cluster.x-k8s.io/deployment-name")
                    .is_some_and(|d| d == &format!("{CLUSTER}-md-0"))
            }))
        },
    )
    .await?;
    ensure!(
        worker["spec"]["bootstrap"]["dataSecretName"].is_null(),
        "CABPK rendered join data before the control plane was initialized"
    );
    let worker_bm = worker["spec"]["infrastructureRef"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let worker_bm = wait_for(
        "the worker ByoMachine to report why it waits",
        Duration::from_secs(60),
        || async {
            let bm = byomachines.get_opt(&worker_bm).await?;
            Ok(bm.filter(|b| {
                b.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Ready"
                            && c.status == "False"
                            && c.reason == byoh_api::conditions::reasons::WAITING_FOR_BOOTSTRAP_DATA
                    })
                })
            }))
        },
    )
    .await?;
    ensure!(
        worker_bm
            .status
            .as_ref()
            .and_then(|s| s.host_ref.as_ref())
            .is_none(),
        "the worker ByoMachine holds a host"
    );
    say(&format!(
        "worker Machine waits for the control plane ({:.1} s)",
        t.elapsed().as_secs_f64()
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_api_managers_drive_byoh_objects_from_a_generated_cluster() {
    if control_plane::client().await.is_none() {
        return;
    }
    let bed = Bed::start().await.unwrap();
    let result = scenario(&bed).await;
    if let Err(e) = result {
        let diag = bed.diagnostics();
        let _ = writeln!(std::io::stderr(), "{diag}");
        panic!("capi_managers failed: {e:#}");
    }
}
