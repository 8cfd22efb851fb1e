//! Enrolment as one atomic claim on a host name: before it approves a bootstrap-token CSR, the
//! approver records the name and the key it enrols in a ConfigMap `byoh-enrolment-<name>` in
//! the provider's namespace ([`record_name`]), which no host or bootstrap token may touch (they
//! hold no ConfigMap rights there; the controller's Role `byoh-enrolment-records` is the only
//! grant). The API server creates an object at most once, so of several CSRs for one fresh name
//! filed at once (every host of a batch holds the same bootstrap token) one creates the record
//! and is approved; the others find it, with another key, and stay pending.
//!
//! - The same key asking again (an agent that filed a second CSR for the key it already
//!   enrolled) is approved: the CSR's self-signature proves it holds that key.
//! - A re-enrolment the administrator allowed ([`super::identity::claim_re_enrolment`], claimed
//!   first) replaces the record with the new key, on the condition that the record did not
//!   change since it was read (its `resourceVersion`).
//! - A CSR deleted before its approval takes nothing: its record is removed again ([`forget`]).
//! - A record with another key and no permission: refused. The record outlives the ByoHost, so
//!   a name whose ByoHost was deleted does not enrol again until an administrator deletes the
//!   record (`kubectl -n byoh-system delete configmap byoh-enrolment-<name>`).
//! - A revoked name ([`REVOKED`]): nothing is approved for it, renewal included, whatever
//!   becomes of its ByoHost (a revoked host may delete its ByoHost and create another without
//!   the annotation; the record stays).

use byoh_api::labels;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams, Preconditions};

/// Prefix of an enrolment record's name: `byoh-enrolment-<host name>`.
pub const RECORD_PREFIX: &str = "byoh-enrolment-";
/// Key of the record's data: SHA-256 of the enrolled public key (DER SubjectPublicKeyInfo,
/// lowercase hex).
pub const PUBLIC_KEY_SHA256: &str = "publicKeySha256";
/// Key of the record's data: the name of the CSR that enrolled the key.
pub const CSR: &str = "csr";
/// Key of the record's data, value `true`: the name is revoked. Written when its ByoHost was
/// annotated [`labels::REVOKED`] ([`revoke`]), kept when the ByoHost goes: neither renewal nor
/// enrolment of the name is approved again, and the host access reconciler grants it nothing,
/// until an administrator deletes the record.
pub const REVOKED: &str = "revoked";

/// Name of the enrolment record of host `host`.
pub fn record_name(host: &str) -> String {
    format!("{RECORD_PREFIX}{host}")
}

/// A new record of host `host` in `namespace` holding `data`, labelled with the host's name.
fn new_record(namespace: &str, host: &str, data: &[(String, String)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(record_name(host)),
            namespace: Some(namespace.into()),
            labels: Some([(labels::HOST.to_string(), host.to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some(data.iter().cloned().collect()),
        ..ConfigMap::default()
    }
}

/// What [`take`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Take {
    /// The name is this key's now (or already was): approve.
    Taken,
    /// The name is another key's: leave the CSR pending with a Warning saying this.
    Refused(String),
}

/// Records host `host` as enrolled with the key whose SHA-256 is `key_sha256` by CSR `csr`, in
/// `namespace`; `re_enrolment`: this CSR used up an administrator's re-enrolment permission,
/// so a record with another key is replaced. See the module documentation.
///
/// # Errors
/// The client error of a create, get or replace other than the conflicts the rules expect.
pub async fn take(
    client: &kube::Client,
    namespace: &str,
    host: &str,
    key_sha256: &str,
    csr: &str,
    re_enrolment: bool,
) -> Result<Take, kube::Error> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let name = record_name(host);
    let data = [
        (PUBLIC_KEY_SHA256.to_string(), key_sha256.to_string()),
        (CSR.to_string(), csr.to_string()),
    ];
    match api
        .create(&PostParams::default(), &new_record(namespace, host, &data))
        .await
    {
        Ok(_) => return Ok(Take::Taken),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    let mut existing = api.get(&name).await?;
    let recorded = existing.data.clone().unwrap_or_default();
    if is_revoked(&existing) {
        return Ok(Take::Refused(revoked_reason(host, namespace)));
    }
    if recorded.get(PUBLIC_KEY_SHA256).map(String::as_str) == Some(key_sha256) {
        return Ok(Take::Taken);
    }
    let by = recorded.get(CSR).map_or("?", String::as_str);
    if !re_enrolment {
        return Ok(Take::Refused(format!(
            "host {host} is already enrolled with another key (ConfigMap {namespace}/{name}, CSR {by}): a bootstrap token may not obtain the name again; if the machine was reinstalled, annotate its ByoHost with {}=true, or, if its ByoHost was deleted on purpose, delete that ConfigMap",
            labels::ALLOW_RE_ENROLMENT
        )));
    }
    // Replaced only if unchanged since read: `existing` carries its resourceVersion.
    existing.data = Some(data.into());
    match api.replace(&name, &PostParams::default(), &existing).await {
        Ok(_) => Ok(Take::Taken),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Take::Refused(format!(
            "another CSR enrolled host {host} at the same time (ConfigMap {namespace}/{name} changed while this one was looked at)"
        ))),
        Err(e) => Err(e),
    }
}

/// Removes host `host`'s record in `namespace` if it still enrols the key `key_sha256` by CSR
/// `csr`, unchanged since read (its `resourceVersion`): that CSR was deleted before it could be
/// approved, so the name is not this key's. Without it the name would stay taken by a key that
/// never got a certificate and the real host's CSR would be refused.
///
/// # Errors
/// The client error of the get or delete, other than the record being gone or changed.
pub async fn forget(
    client: &kube::Client,
    namespace: &str,
    host: &str,
    key_sha256: &str,
    csr: &str,
) -> Result<(), kube::Error> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let name = record_name(host);
    let Some(record) = api.get_opt(&name).await? else {
        return Ok(());
    };
    let data = record.data.clone().unwrap_or_default();
    if is_revoked(&record)
        || data.get(PUBLIC_KEY_SHA256).map(String::as_str) != Some(key_sha256)
        || data.get(CSR).map(String::as_str) != Some(csr)
    {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: record.metadata.resource_version,
            uid: record.metadata.uid,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `record` says its name is revoked ([`REVOKED`] is `true`).
pub fn is_revoked(record: &ConfigMap) -> bool {
    record
        .data
        .as_ref()
        .and_then(|d| d.get(REVOKED))
        .is_some_and(|v| v == "true")
}

/// The Warning of a CSR for revoked host `host` (record in `namespace`).
pub fn revoked_reason(host: &str, namespace: &str) -> String {
    format!(
        "host {host} is revoked (ConfigMap {namespace}/{} says {REVOKED}=true, recorded when its ByoHost was annotated {}): its identity is not renewed or enrolled again, whatever becomes of its ByoHost; to bring the machine back, give it a new name, or delete that ConfigMap and re-enrol it with a bootstrap token",
        record_name(host),
        labels::REVOKED
    )
}

/// Whether host `host`'s record in `namespace` says it is revoked (no record: not revoked).
///
/// # Errors
/// The client error of the get.
pub async fn revoked(
    client: &kube::Client,
    namespace: &str,
    host: &str,
) -> Result<bool, kube::Error> {
    Ok(Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .get_opt(&record_name(host))
        .await?
        .is_some_and(|r| is_revoked(&r)))
}

/// Whether `record` carries the label [`labels::REVOKED`]`=true`, by which the admission policy
/// [`crate::admission::REVOKED_POLICY`] finds it.
fn labelled_revoked(record: &ConfigMap) -> bool {
    record
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::REVOKED))
        .is_some_and(|v| v == "true")
}

/// Records host `host` as revoked in `namespace` (creates the record if there is none; keeps
/// its key and CSR): [`REVOKED`]`=true` in its data, read by the approver and the host-access
/// reconciler, and the label [`labels::REVOKED`]`=true`, by which the admission policy
/// [`crate::admission::REVOKED_POLICY`] refuses every write of the host. Idempotent.
///
/// # Errors
/// The client error of a get, create or replace; a replace that lost a race (409) too, so the
/// caller retries with the record as it is then.
pub async fn revoke(client: &kube::Client, namespace: &str, host: &str) -> Result<(), kube::Error> {
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let name = record_name(host);
    let mut record = match api.get_opt(&name).await? {
        Some(r) if is_revoked(&r) && labelled_revoked(&r) => return Ok(()),
        Some(r) => r,
        None => new_record(namespace, host, &[]),
    };
    record
        .data
        .get_or_insert_default()
        .insert(REVOKED.into(), "true".into());
    record
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::REVOKED.into(), "true".into());
    if record.metadata.resource_version.is_some() {
        api.replace(&name, &PostParams::default(), &record)
            .await
            .map(drop)
    } else {
        api.create(&PostParams::default(), &record).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_records_name_is_a_valid_object_name_for_every_host_name() {
        // Host names are RFC 1123 subdomains of at most 63 characters; ConfigMap names allow 253.
        let longest = "a".repeat(63);
        assert!(byoh_api::names::check_host_name(&longest).is_ok());
        let name = record_name(&longest);
        assert_eq!(name.len(), RECORD_PREFIX.len() + 63);
        assert!(name.len() <= 253);
        assert_eq!(record_name("h-1.example"), "byoh-enrolment-h-1.example");
    }
}
