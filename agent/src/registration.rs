//! Registration: the host's `ByoHost` (created or adopted, labels and status kept current with
//! server-side apply under the field manager [`FIELD_MANAGER`]) and its liveness `Lease`.

use crate::facts::Facts;
use byoh_api::ByoHost;
use byoh_api::byohost::HostIdentity;
use byoh_api::conditions::{self, reasons, types};
use byoh_api::labels;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// Field manager of everything the agent writes.
pub const FIELD_MANAGER: &str = "byoh-agent";

/// Errors talking to the API server about the host's objects.
#[derive(Debug, thiserror::Error)]
#[error(
    "{action} {kind} {namespace}/{name}: {}",
    byoh_api::apierror::line(source)
)]
pub struct RegistrationError {
    /// What was being done (`creating`, `applying status of`, `renewing`).
    pub action: &'static str,
    /// `ByoHost` or `Lease`.
    pub kind: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The client error.
    pub source: kube::Error,
}

impl RegistrationError {
    /// Whether the error is worth a retry (the API server unreachable or failing, or access not
    /// granted yet), as opposed to a refusal (401, 404, 422) that needs an operator.
    /// 403 counts as transient too: right after its ByoHost is created, a host waits for the
    /// controller to grant it access to that ByoHost and its Lease (a few seconds).
    pub fn is_transient(&self) -> bool {
        match &self.source {
            kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 409 || s.code == 403,
            _ => true,
        }
    }
}

/// The host's objects in the management cluster.
#[derive(Clone)]
pub struct Registration {
    hosts: Api<ByoHost>,
    leases: Api<Lease>,
    namespace: String,
    name: String,
}

impl Registration {
    /// Handles for ByoHost and Lease `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Registration {
            hosts: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client, namespace),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The ByoHost API (namespaced).
    pub fn hosts(&self) -> &Api<ByoHost> {
        &self.hosts
    }

    fn err(
        &self,
        action: &'static str,
        kind: &'static str,
    ) -> impl FnOnce(kube::Error) -> RegistrationError + '_ {
        move |source| RegistrationError {
            action,
            kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// Reads the ByoHost, before anything is written, so that its recorded identity can be
    /// checked ([`crate::hostid`]). `None` when it does not exist or is not readable yet: a new
    /// host may not read its ByoHost before the controller has made its per-host Role, which it
    /// does once the ByoHost exists (403 on the read means "not readable yet", not "refused").
    ///
    /// # Errors
    /// [`RegistrationError`] if the get fails otherwise.
    pub async fn read_host(&self) -> Result<Option<ByoHost>, RegistrationError> {
        match self.hosts.get_opt(&self.name).await {
            Ok(found) => Ok(found),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
            Err(e) => Err(self.err("reading", "ByoHost")(e)),
        }
    }

    /// Creates the ByoHost unless `exists` (as [`Registration::read_host`] found; a conflict
    /// on create adopts the existing one of the same name), then applies the agent's labels:
    /// `labels` plus `byoh.infrastructure.cluster.x-k8s.io/{os,arch}`. Returns the ByoHost as
    /// the apply left it (with its status).
    ///
    /// # Errors
    /// [`RegistrationError`] if the create or apply fails.
    pub async fn ensure_host(
        &self,
        facts: &Facts,
        config_labels: &BTreeMap<String, String>,
        exists: bool,
    ) -> Result<ByoHost, RegistrationError> {
        let mut all = config_labels.clone();
        all.insert(labels::HOST_OS.into(), facts.host_info.os_name.clone());
        all.insert(
            labels::HOST_ARCH.into(),
            facts.host_info.architecture.clone(),
        );
        if !exists {
            let mut host = ByoHost::new(&self.name, Default::default());
            host.metadata.labels = Some(all.clone());
            match self
                .hosts
                .create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &host,
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(byoh_host = %self.name, namespace = %self.namespace, "created ByoHost {}/{}", self.namespace, self.name)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(self.err("creating", "ByoHost")(e)),
            }
        }
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoHost",
            "metadata": { "name": self.name, "labels": all },
        });
        self.hosts
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map_err(self.err("applying labels of", "ByoHost"))
    }

    /// Applies the registration part of the status: facts, addresses, agent version, the host
    /// `identity` and `conditions` (merged by type, so conditions other field managers own stay;
    /// the phase and the host-work conditions belong to [`crate::hostwork`]). Call it only once
    /// [`crate::hostid::check`] allowed acting on the ByoHost.
    ///
    /// # Errors
    /// [`RegistrationError`] if the apply fails.
    pub async fn apply_status(
        &self,
        facts: &Facts,
        identity: &HostIdentity,
        conditions: &[Condition],
    ) -> Result<ByoHost, RegistrationError> {
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoHost",
            "metadata": { "name": self.name },
            "status": {
                "hostInfo": facts.host_info,
                "network": facts.network,
                "addresses": facts.addresses,
                "agentVersion": env!("CARGO_PKG_VERSION"),
                "identity": identity,
                "conditions": conditions,
            },
        });
        self.hosts
            .patch_status(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map_err(self.err("applying status of", "ByoHost"))
    }

    /// Creates or renews the host's Lease (`holderIdentity` = host name, `renewTime` = now,
    /// label `byoh.infrastructure.cluster.x-k8s.io/host=<name>`, which the controller's Lease
    /// watch selects on).
    ///
    /// # Errors
    /// [`RegistrationError`] if the apply fails.
    pub async fn renew_lease(&self, duration: Duration) -> Result<Lease, RegistrationError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some([(labels::HOST.to_string(), self.name.clone())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.name.clone()),
                lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)),
                renew_time: Some(MicroTime(now)),
                ..Default::default()
            }),
        };
        let mut value = serde_json::to_value(&lease)
            .map_err(|e| self.err("serialising", "Lease")(kube::Error::SerdeError(e)))?;
        value["apiVersion"] = "coordination.k8s.io/v1".into();
        value["kind"] = "Lease".into();
        self.leases
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(value),
            )
            .await
            .map_err(self.err("renewing", "Lease"))
    }
}

/// The condition of a registered host: `Registered=True` (the host-work conditions and the
/// phase are reported by [`crate::hostwork`]).
pub fn registered_conditions(previous: &[Condition], generation: Option<i64>) -> Vec<Condition> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut c: Vec<Condition> = previous
        .iter()
        .filter(|c| c.type_ == types::REGISTERED)
        .cloned()
        .collect();
    conditions::set(
        &mut c,
        types::REGISTERED,
        true,
        reasons::AS_EXPECTED,
        "host facts reported and Lease renewed",
        generation,
        now,
    );
    c
}
