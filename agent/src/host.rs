//! The host's own objects in the management cluster: one handle, [`HostHandle`], for its
//! `ByoHost` and its liveness `Lease`, used by every part of the agent that reads or writes them
//! (registration, unit and preflight reporting, host work, the daemon's watch).
//!
//! The handle only talks to the API server; what each part writes, and under which field
//! manager, stays with that part (see the field managers in `docs/architecture.md`): every write
//! is a server-side apply under the caller's field manager, so parts never drop each other's
//! fields.

use byoh_api::ByoHost;
use byoh_api::conditions::Marker;
use byoh_api::labels;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// An API call about the host's objects failed.
#[derive(Debug, thiserror::Error)]
#[error(
    "{action} {kind} {namespace}/{name}: {}",
    byoh_api::apierror::line(source)
)]
pub struct HostApiError {
    /// What was being done (`creating`, `applying status of`, `renewing`, …).
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

impl HostApiError {
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

/// One condition to report: its type, whether it is `True`, its reason and its message.
pub type ConditionUpdate<'a> = (&'a str, bool, &'a str, &'a str);

/// This host's ByoHost `namespace/name` and its liveness Lease `<namespace>.<name>` in the
/// host-lease namespace (cheap to clone: the client is shared).
#[derive(Clone)]
pub struct HostHandle {
    client: kube::Client,
    hosts: Api<ByoHost>,
    leases: Api<Lease>,
    namespace: String,
    name: String,
    lease_name: String,
}

impl HostHandle {
    /// The handle of ByoHost `namespace/name`, whose Lease is in `lease_namespace`
    /// ([`byoh_api::names::host_lease_name`]).
    pub fn new(client: kube::Client, namespace: &str, name: &str, lease_namespace: &str) -> Self {
        HostHandle {
            hosts: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client.clone(), lease_namespace),
            client,
            namespace: namespace.into(),
            name: name.into(),
            lease_name: byoh_api::names::host_lease_name(namespace, name),
        }
    }

    /// The client the handle uses (for the other objects of the namespace, e.g. a claim's
    /// bootstrap Secret).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The namespace of the host's objects (the pool's namespace).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The ByoHost's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ByoHost API of the namespace (for a watch on the host's own object).
    pub fn hosts(&self) -> &Api<ByoHost> {
        &self.hosts
    }

    fn err(
        &self,
        action: &'static str,
        kind: &'static str,
    ) -> impl FnOnce(kube::Error) -> HostApiError + '_ {
        let (namespace, name) = if kind == "Lease" {
            (self.leases.namespace(), &self.lease_name)
        } else {
            (Some(self.namespace.as_str()), &self.name)
        };
        let (namespace, name) = (namespace.unwrap_or_default().to_string(), name.clone());
        move |source| HostApiError {
            action,
            kind,
            namespace,
            name,
            source,
        }
    }

    /// Reads the ByoHost. `None` when it does not exist or is not readable yet: a new host may
    /// not read its ByoHost before the controller has made its per-host Role, which it does
    /// once the ByoHost exists (403 on the read means "not readable yet", not "refused").
    ///
    /// # Errors
    /// [`HostApiError`] if the get fails otherwise.
    pub async fn read(&self) -> Result<Option<ByoHost>, HostApiError> {
        match self.hosts.get_opt(&self.name).await {
            Ok(found) => Ok(found),
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
            Err(e) => Err(self.err("reading", "ByoHost")(e)),
        }
    }

    /// Reads the ByoHost through its `status` subresource (what the host's grant allows on
    /// every round).
    ///
    /// # Errors
    /// [`HostApiError`] if the get fails.
    pub async fn read_status(&self) -> Result<ByoHost, HostApiError> {
        self.hosts
            .get_status(&self.name)
            .await
            .map_err(self.err("reading status of", "ByoHost"))
    }

    /// Creates the ByoHost with `labels` under `field_manager`; a conflict (it exists already)
    /// is success, so an existing ByoHost of the same name is adopted.
    ///
    /// # Errors
    /// [`HostApiError`] if the create fails otherwise.
    pub async fn create(
        &self,
        labels: &BTreeMap<String, String>,
        field_manager: &str,
    ) -> Result<(), HostApiError> {
        let mut host = ByoHost::new(&self.name, Default::default());
        host.metadata.labels = Some(labels.clone());
        let params = PostParams {
            field_manager: Some(field_manager.into()),
            ..Default::default()
        };
        match self.hosts.create(&params, &host).await {
            Ok(_) => {
                tracing::info!(byoh_host = %self.name, namespace = %self.namespace, "created ByoHost {}/{}", self.namespace, self.name);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err("creating", "ByoHost")(e)),
        }
    }

    /// Applies `labels` to the ByoHost's metadata under `field_manager` (server-side apply,
    /// forced). Returns the ByoHost as the apply left it.
    ///
    /// # Errors
    /// [`HostApiError`] if the apply fails.
    pub async fn apply_labels(
        &self,
        labels: &BTreeMap<String, String>,
        field_manager: &str,
    ) -> Result<ByoHost, HostApiError> {
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoHost",
            "metadata": { "name": self.name, "labels": labels },
        });
        let params = PatchParams::apply(field_manager).force();
        self.hosts
            .patch(&self.name, &params, &Patch::Apply(patch))
            .await
            .map_err(self.err("applying labels of", "ByoHost"))
    }

    /// Applies `status` (a JSON object of ByoHost status fields) under `field_manager`
    /// (server-side apply, forced): the fields sent become the manager's, fields of other
    /// managers stay. Returns the ByoHost as the apply left it.
    ///
    /// # Errors
    /// [`HostApiError`] if the apply fails.
    pub async fn apply_status(
        &self,
        status: serde_json::Value,
        field_manager: &str,
    ) -> Result<ByoHost, HostApiError> {
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoHost",
            "metadata": { "name": self.name },
            "status": status,
        });
        let params = PatchParams::apply(field_manager).force();
        self.hosts
            .patch_status(&self.name, &params, &Patch::Apply(patch))
            .await
            .map_err(self.err("applying status of", "ByoHost"))
    }

    /// Sets `updates` on the conditions of the types in `owned` that the ByoHost has now, and
    /// applies them with the other status fields in `fields` (a JSON object, `{}` for none)
    /// under `field_manager`. Applying a list replaces what that manager owned, so every
    /// condition it still owns is sent, not only the changed one; conditions of other types
    /// are not sent, so other field managers keep theirs. `lastTransitionTime` is kept when a
    /// status does not change ([`Marker`]).
    ///
    /// # Errors
    /// [`HostApiError`] when reading the status or the apply fails.
    pub async fn apply_conditions(
        &self,
        field_manager: &str,
        owned: &[&str],
        updates: &[ConditionUpdate<'_>],
        fields: serde_json::Value,
    ) -> Result<(), HostApiError> {
        // The caller's copy of the object may be older than this manager's last write: read the
        // conditions fresh so an earlier report is never undone.
        let host = self.read_status().await?;
        let mut conds: Vec<Condition> = host
            .status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| owned.contains(&c.type_.as_str()))
            .collect();
        let marker = Marker::new(
            host.metadata.generation,
            Time(k8s_openapi::jiff::Timestamp::now()),
        );
        for (type_, ok, reason, message) in updates {
            marker.mark(&mut conds, type_, *ok, reason, message);
        }
        let mut status = match fields {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        status.insert("conditions".into(), serde_json::json!(conds));
        self.apply_status(serde_json::Value::Object(status), field_manager)
            .await
            .map(|_| ())
    }

    /// Deletes the host's Lease. `Ok(false)` when it was gone already.
    ///
    /// # Errors
    /// [`HostApiError`] if the delete fails otherwise (403: no grant, e.g. the ByoHost and with
    /// it the host's Role are gone).
    pub async fn delete_lease(&self) -> Result<bool, HostApiError> {
        match self
            .leases
            .delete(&self.lease_name, &Default::default())
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(self.err("deleting", "Lease")(e)),
        }
    }

    /// Deletes the ByoHost. `Ok(false)` when it was gone already. The API server refuses the
    /// delete of a claimed ByoHost by a host (admission policy `byoh-host-restriction`).
    ///
    /// # Errors
    /// [`HostApiError`] if the delete fails otherwise.
    pub async fn delete(&self) -> Result<bool, HostApiError> {
        match self.hosts.delete(&self.name, &Default::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(self.err("deleting", "ByoHost")(e)),
        }
    }

    /// Creates or renews the host's Lease under `field_manager` (`holderIdentity` = host name,
    /// `leaseDurationSeconds` = `duration`, `renewTime` = now, label
    /// `byoh.infrastructure.cluster.x-k8s.io/host=<name>`, which the controller's Lease watch
    /// selects on).
    ///
    /// # Errors
    /// [`HostApiError`] if the apply fails.
    pub async fn renew_lease(
        &self,
        duration: Duration,
        field_manager: &str,
    ) -> Result<Lease, HostApiError> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.lease_name.clone()),
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
                &self.lease_name,
                &PatchParams::apply(field_manager).force(),
                &Patch::Apply(value),
            )
            .await
            .map_err(self.err("renewing", "Lease"))
    }
}
