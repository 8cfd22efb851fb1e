//! Objects for controller tests, shaped as CAPI v1beta2 and the agent write them (created with
//! the admin client), and the controller run in-process on a tokio task.

#![allow(
    clippy::unwrap_used,
    reason = "test fixtures: a failed call fails the test that made it, with the error in the panic"
)]

use byoh_api::byohost::ByoHostStatus;
use byoh_api::common::MachineAddress;
use byoh_api::{ByoCluster, ByoClusterSpec, ByoHost, ByoHostSpec, ByoMachine, ByoMachineSpec};
use byoh_controller::run::Settings;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// A controller running on a tokio task until [`Running::stop`].
pub struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), byoh_controller::run::RunError>>,
}

impl Running {
    /// Starts `byoh_controller::run::run` for `namespace` with `settings` (metrics off).
    pub fn start(client: &Client, namespace: &str, settings: Settings) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let settings = Settings {
            namespace: Some(namespace.to_string()),
            ..settings
        };
        let client = client.clone();
        let task = tokio::spawn(async move {
            byoh_controller::run::run(client, settings, async move {
                let _ = rx.await;
            })
            .await
        });
        Self {
            stop: Some(tx),
            task,
        }
    }

    /// Asks the controller to stop and waits for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(30), &mut self.task).await;
        match r {
            Ok(Ok(Ok(()))) => {}
            other => panic!("controller did not stop cleanly: {other:?}"),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Ends a test: stops the controller, removes the controller's finalizers from what is left
/// in the namespace (ByoMachines, ByoClusters, K8sInstallerConfigs — with the controller gone
/// nobody would remove them, and the namespace would stay `Terminating`), and deletes the
/// namespace.
pub async fn finish(
    client: &Client,
    ns: crate::control_plane::TestNamespace,
    controllers: Vec<Running>,
) {
    for c in controllers {
        c.stop().await;
    }
    strip_finalizers(client, ns.name()).await;
    ns.cleanup(client).await.unwrap();
}

/// Removes every finalizer from the ByoMachines, ByoClusters and K8sInstallerConfigs of `ns`.
pub async fn strip_finalizers(client: &Client, ns: &str) {
    use futures::StreamExt;
    let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let pp = PatchParams::default();
    let bms = Api::<ByoMachine>::namespaced(client.clone(), ns);
    let bcs = Api::<ByoCluster>::namespaced(client.clone(), ns);
    let cfgs = Api::<byoh_api::K8sInstallerConfig>::namespaced(client.clone(), ns);
    let mut names: Vec<(u8, String)> = Vec::new();
    for bm in bms.list_metadata(&Default::default()).await.unwrap().items {
        names.push((0, bm.name_any()));
    }
    for bc in bcs.list_metadata(&Default::default()).await.unwrap().items {
        names.push((1, bc.name_any()));
    }
    for c in cfgs.list_metadata(&Default::default()).await.unwrap().items {
        names.push((2, c.name_any()));
    }
    futures::stream::iter(names)
        .for_each_concurrent(32, |(kind, name)| {
            let (bms, bcs, cfgs, patch, pp) = (&bms, &bcs, &cfgs, &patch, &pp);
            async move {
                // Gone already is fine.
                let _ = match kind {
                    0 => bms.patch(&name, pp, patch).await.map(|_| ()),
                    1 => bcs.patch(&name, pp, patch).await.map(|_| ()),
                    _ => cfgs.patch(&name, pp, patch).await.map(|_| ()),
                };
            }
        })
        .await;
}

/// Settings for a namespaced test controller without leader election or metrics.
pub fn settings() -> Settings {
    Settings {
        leader_elect: false,
        ..Settings::default()
    }
}

fn ar(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// Api of CAPI Clusters (dynamic).
pub fn clusters(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ar("Cluster", "clusters"))
}

/// Api of CAPI Machines (dynamic).
pub fn machines(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ar("Machine", "machines"))
}

fn now_minus(secs: i64) -> Timestamp {
    Timestamp::now()
        .checked_sub(SignedDuration::from_secs(secs))
        .unwrap()
}

fn owner(api_version: &str, kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(controller),
        block_owner_deletion: Some(true),
    }
}

/// Creates a Cluster (v1beta2, infrastructureRef to a ByoCluster of the same name, the
/// ByoCluster's endpoint copied with port 6443) and the ByoCluster (endpoint host set, port
/// unset) owned by it and labelled with the cluster name, as CAPI's Cluster controller leaves
/// them. Status is not set.
pub async fn create_cluster(client: &Client, ns: &str, name: &str) -> (DynamicObject, ByoCluster) {
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "ByoCluster", "name": name},
            "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443},
            "clusterNetwork": {
                "services": {"cidrBlocks": ["10.96.0.0/12"]},
                "pods": {"cidrBlocks": ["192.168.0.0/16"]}
            }
        }
    }))
    .unwrap();
    let cluster = clusters(client, ns)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let mut bc = ByoCluster::new(
        name,
        ByoClusterSpec {
            control_plane_endpoint: Some(byoh_api::common::ApiEndpoint {
                host: "192.0.2.10".into(),
                port: 0,
            }),
            failure_domains: vec![byoh_api::common::FailureDomain {
                name: "z1".into(),
                control_plane: Some(true),
                attributes: BTreeMap::new(),
            }],
        },
    );
    bc.metadata.namespace = Some(ns.into());
    bc.metadata.labels =
        Some([(byoh_api::labels::CLUSTER_NAME.to_string(), name.to_string())].into());
    bc.metadata.owner_references = Some(vec![owner(
        "cluster.x-k8s.io/v1beta2",
        "Cluster",
        name,
        &cluster.uid().unwrap(),
        false,
    )]);
    let bc = Api::<ByoCluster>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &bc)
        .await
        .unwrap();
    (cluster, bc)
}

/// Sets the Cluster's `status.initialization` as CAPI would.
pub async fn set_cluster_status(client: &Client, ns: &str, name: &str, infra: bool, cp: bool) {
    clusters(client, ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"initialization": {
                "infrastructureProvisioned": infra, "controlPlaneInitialized": cp}}})),
        )
        .await
        .unwrap();
}

/// A ready cluster: created, infrastructure provisioned and control plane initialized.
pub async fn ready_cluster(client: &Client, ns: &str, name: &str) {
    create_cluster(client, ns, name).await;
    set_cluster_status(client, ns, name, true, true).await;
}

/// A Machine's bootstrap data.
#[derive(Clone, Debug, Default)]
pub enum BootstrapData {
    /// None yet: `spec.bootstrap` has a configRef only.
    #[default]
    None,
    /// As CABPK makes it: the Machine's `KubeadmConfig` (named as the Machine) and the Secret
    /// `<machine>-bootstrap` it controls, named in `spec.bootstrap.dataSecretName`.
    Cabpk,
    /// `spec.bootstrap.dataSecretName` names this Secret, made (or not) by the test.
    Named(String),
}

/// How to shape a Machine and its ByoMachine.
#[derive(Clone, Default)]
pub struct MachineOpts {
    /// `spec.bootstrap`'s data.
    pub bootstrap_data: BootstrapData,
    /// Control-plane Machine (label `cluster.x-k8s.io/control-plane`).
    pub control_plane: bool,
    /// `spec.version`.
    pub version: Option<String>,
    /// `spec.failureDomain`.
    pub failure_domain: Option<String>,
    /// ByoMachine labels.
    pub labels: BTreeMap<String, String>,
    /// ByoMachine annotations.
    pub annotations: BTreeMap<String, String>,
    /// ByoMachine spec.
    pub spec: ByoMachineSpec,
}

impl MachineOpts {
    /// A worker with bootstrap data ready.
    pub fn ready() -> Self {
        Self {
            bootstrap_data: BootstrapData::Cabpk,
            version: Some("v1.36.1".into()),
            ..Self::default()
        }
    }
}

/// Creates a Machine (v1beta2) and its ByoMachine, the ByoMachine controlled by the Machine
/// and labelled with the cluster name, as CAPI's Machine controller leaves them.
pub async fn create_machine(
    client: &Client,
    ns: &str,
    cluster: &str,
    name: &str,
    opts: &MachineOpts,
) -> ByoMachine {
    let mut bootstrap = json!({"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": name}});
    match &opts.bootstrap_data {
        BootstrapData::None => {}
        BootstrapData::Cabpk => {
            let secret = format!("{name}-bootstrap");
            crate::agent::create_machine_bootstrap_data(
                client,
                ns,
                name,
                &secret,
                "#cloud-config\n",
            )
            .await
            .unwrap();
            bootstrap["dataSecretName"] = secret.into();
        }
        BootstrapData::Named(s) => bootstrap["dataSecretName"] = s.clone().into(),
    }
    let mut labels = json!({"cluster.x-k8s.io/cluster-name": cluster});
    if opts.control_plane {
        labels["cluster.x-k8s.io/control-plane"] = "".into();
    }
    let mut spec = json!({
        "clusterName": cluster,
        "bootstrap": bootstrap,
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "ByoMachine", "name": name},
    });
    if let Some(v) = &opts.version {
        spec["version"] = v.clone().into();
    }
    if let Some(fd) = &opts.failure_domain {
        spec["failureDomain"] = fd.clone().into();
    }
    let machine: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": spec,
    }))
    .unwrap();
    let machine = machines(client, ns)
        .create(&PostParams::default(), &machine)
        .await
        .unwrap();
    let mut bm = ByoMachine::new(name, opts.spec.clone());
    bm.metadata.namespace = Some(ns.into());
    let mut l = opts.labels.clone();
    l.insert(byoh_api::labels::CLUSTER_NAME.into(), cluster.into());
    bm.metadata.labels = Some(l);
    bm.metadata.annotations = Some(opts.annotations.clone());
    bm.metadata.owner_references = Some(vec![owner(
        "cluster.x-k8s.io/v1beta2",
        "Machine",
        name,
        &machine.uid().unwrap(),
        true,
    )]);
    Api::<ByoMachine>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &bm)
        .await
        .unwrap()
}

/// How to shape a ByoHost as an agent registers it.
#[derive(Clone)]
pub struct HostOpts {
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Architecture label value.
    pub arch: &'static str,
    /// Lease: seconds since the last renewal, and duration; `None`: no Lease.
    pub lease: Option<(i64, i32)>,
    /// `status.phase`.
    pub phase: &'static str,
}

impl Default for HostOpts {
    fn default() -> Self {
        Self {
            labels: BTreeMap::new(),
            arch: "amd64",
            lease: Some((0, 3600)),
            phase: "Available",
        }
    }
}

/// Creates a ByoHost with labels, status (phase, Registered/Ready, addresses) and a Lease, as
/// the agent does.
pub async fn create_host(client: &Client, ns: &str, name: &str, opts: &HostOpts) -> ByoHost {
    let mut host = ByoHost::new(name, ByoHostSpec::default());
    host.metadata.namespace = Some(ns.into());
    let mut labels = opts.labels.clone();
    labels.insert(byoh_api::labels::HOST_ARCH.into(), opts.arch.into());
    labels.insert(byoh_api::labels::HOST_OS.into(), "debian".into());
    host.metadata.labels = Some(labels);
    let api = Api::<ByoHost>::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &host).await.unwrap();
    let t = Time(Timestamp::now());
    let cond = |type_: &str| Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: "AsExpected".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: t.clone(),
    };
    let status = ByoHostStatus {
        phase: Some(opts.phase.into()),
        addresses: vec![
            MachineAddress {
                type_: "Hostname".into(),
                address: name.into(),
            },
            MachineAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.50".into(),
            },
        ],
        conditions: vec![cond("Registered"), cond("Ready")],
        agent_version: Some("test".into()),
        ..Default::default()
    };
    let host = api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
    if let Some((age, duration)) = opts.lease {
        set_lease(client, ns, name, age, duration).await;
    }
    host
}

/// The hosts' Leases: the host-lease namespace as the components install it (`byoh-system`).
pub fn host_leases(client: &Client) -> Api<Lease> {
    Api::namespaced(
        client.clone(),
        byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE,
    )
}

/// Makes the host-lease namespace and its Role for the hosts' group as the components do, once
/// per test process.
pub async fn grant_lease_namespace(client: &Client) {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async { crate::agent::grant_host_leases(client).await.unwrap() })
        .await;
}

/// Name of the Lease of host `ns/name` (`<ns>.<name>`).
pub fn host_lease_name(ns: &str, name: &str) -> String {
    byoh_api::names::host_lease_name(ns, name)
}

/// Creates or updates the host's Lease as the agent does (labelled with the host name):
/// renewed `age_secs` ago, `duration_secs` long.
pub async fn set_lease(client: &Client, ns: &str, name: &str, age_secs: i64, duration_secs: i32) {
    grant_lease_namespace(client).await;
    let lease_name = host_lease_name(ns, name);
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(lease_name.clone()),
            labels: Some([(byoh_api::labels::HOST.to_string(), name.to_string())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(duration_secs),
            renew_time: Some(MicroTime(now_minus(age_secs))),
            ..Default::default()
        }),
    };
    let mut v = serde_json::to_value(&lease).unwrap();
    v["apiVersion"] = "coordination.k8s.io/v1".into();
    v["kind"] = "Lease".into();
    host_leases(client)
        .patch(
            &lease_name,
            &PatchParams::apply("byoh-agent").force(),
            &Patch::Apply(v),
        )
        .await
        .unwrap();
}

/// Writes host status fields as the agent would (merge patch of `status`).
pub async fn agent_status(client: &Client, ns: &str, host: &str, status: serde_json::Value) {
    Api::<ByoHost>::namespaced(client.clone(), ns)
        .patch_status(
            host,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
}

/// The Events (`events.k8s.io/v1`) of namespace `ns` about the object of `kind` named `name`,
/// oldest first.
pub async fn events_about(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let mut events: Vec<_> =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
            })
            .collect();
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    events
}

/// Waits (up to 20 s) for an Event `(type, reason)` from byoh-controller about the object of
/// `kind` named `name` in `ns` whose note contains `part`, and returns its note.
pub async fn controller_event(
    client: &Client,
    ns: &str,
    (kind, name): (&str, &str),
    (type_, reason): (&str, &str),
    part: &str,
) -> String {
    crate::eventually(
        &format!("a {type_} {reason} Event on {kind} {name} saying {part:?}"),
        Duration::from_secs(20),
        || async {
            events_about(client, ns, kind, name)
                .await
                .into_iter()
                .filter(|e| {
                    e.type_.as_deref() == Some(type_)
                        && e.reason.as_deref() == Some(reason)
                        && e.reporting_controller.as_deref() == Some("byoh-controller")
                })
                .filter_map(|e| e.note)
                .find(|note| note.contains(part))
        },
    )
    .await
}

/// Every ByoHost of the namespace.
pub async fn hosts(client: &Client, ns: &str) -> Vec<ByoHost> {
    Api::<ByoHost>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
}

/// A condition of a list, if present.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `(status, reason)` of a ByoMachine condition.
pub fn bm_condition(bm: &ByoMachine, type_: &str) -> Option<(String, String)> {
    bm.status
        .as_ref()
        .and_then(|s| condition(&s.conditions, type_))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

pub use crate::eventually;

/// Waits (up to 30 s) until ByoMachine `name` says `HostClaimed=False` with `reason`, and
/// returns the condition's message.
pub async fn host_claimed_false(client: &Client, ns: &str, name: &str, reason: &str) -> String {
    crate::eventually(
        &format!("ByoMachine {name}: HostClaimed=False, {reason}"),
        Duration::from_secs(30),
        || async {
            let bm = get_bm(client, ns, name).await?;
            let c = condition(&bm.status?.conditions, "HostClaimed")?.clone();
            (c.status == "False" && c.reason == reason).then_some(c.message)
        },
    )
    .await
}

/// The ByoMachine, or `None` once it is gone.
pub async fn get_bm(client: &Client, ns: &str, name: &str) -> Option<ByoMachine> {
    Api::<ByoMachine>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

/// The ByoHost (must exist).
pub async fn get_host(client: &Client, ns: &str, name: &str) -> ByoHost {
    Api::<ByoHost>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

/// Deletes ByoMachine and Machine `machine` as Cluster API's Machine deletion does, for a
/// claim of ByoHost `host`: the ByoMachine first, then the Machine once the host's release is
/// requested (or its claim gone). Panics after 90 s.
pub async fn delete_machine(client: &Client, ns: &str, host: &str, machine: &str) {
    Api::<ByoMachine>::namespaced(client.clone(), ns)
        .delete(machine, &Default::default())
        .await
        .unwrap();
    crate::eventually(
        &format!("release of {machine} requested"),
        Duration::from_secs(90),
        || async {
            let h = get_host(client, ns, host).await;
            (h.spec.claim.is_none() || h.spec.claim.is_some_and(|c| c.release_requested))
                .then_some(())
        },
    )
    .await;
    machines(client, ns)
        .delete(machine, &Default::default())
        .await
        .unwrap();
}

/// Waits (90 s, then panics) until ByoHost `host` is free and `Available` again after the
/// agent's clean-up of the claim of ByoMachine UID `uid`.
pub async fn wait_released(client: &Client, ns: &str, host: &str, uid: &str) {
    crate::eventually(
        "the host cleaned up and free",
        Duration::from_secs(90),
        || async {
            let h = get_host(client, ns, host).await;
            let s = h.status.as_ref()?;
            (h.spec.claim.is_none()
                && s.cleaned_machine_uid.as_deref() == Some(uid)
                && s.phase.as_deref() == Some("Available"))
            .then_some(())
        },
    )
    .await;
}

/// Asserts that none of the ByoHosts `names` in `ns` carries a claim (panics naming the first
/// that does).
pub async fn assert_free(client: &Client, ns: &str, names: &[&str]) {
    for name in names {
        assert!(
            get_host(client, ns, name).await.spec.claim.is_none(),
            "{name} must stay free"
        );
    }
}
